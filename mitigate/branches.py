"""Contrast branches: extra rows that run alongside each sample in the same forward pass.

A contrast-decoding method compares the model's next-token logits with those of a
*branch* of the same sample: a distorted image (VCD), no image (VDD, M3ID, PAI's
text-only branch), ... The reference implementations run the branch as a second forward
pass per token; here every branch is a copy of the batch's rows appended to the batch:

* a pre-forward hook on the model appends ``K`` copies of every per-row input
  (``input_ids``, ``attention_mask``, position ids -- M-RoPE's included -- and token-type
  ids) and of the pixel inputs (distorted for image branches), so each branch has its own
  rows in the KV cache, its own mask and positions;
* for the image-free branch the appended rows' attention mask is 0 on image tokens (the
  positions stay, so M-RoPE positions of the text are those of the original rows);
* a forward hook splits the logits back into ``[original, branch_1, ..., branch_K]`` and
  returns ``combine(original, branches)`` with the original batch size, so ``generate()``
  and everything built on it (sampling, beam search, streamers, pipelines) see an
  ordinary model.

transformers >= 5.2 encodes images once before ``generate()``'s loop
(``get_image_features``) and passes ``mm_encoder_outputs`` to ``forward``. Image-free
branches then reuse the encoded features (their rows never attend to them). Branches
with a *distorted* image need the vision encoder to see the distorted pixels: a
pre-forward hook on the vision tower appends them there, which is exact for adapters
whose ``contrast_encoder`` is ``"vision_tower"`` (the tower's output is consumed image by
image). For the other families a distorted-image branch works in direct ``model(...)``
calls and raises a clear error inside ``generate()``.

Beam search reorders the KV cache with indices of the original rows; the hook extends
the reordering to every branch's rows (on the cache object of that ``generate()`` call).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from hooks import HookGroup, ModelPoints

# per-row inputs of a VLM forward; position ids are (B, S) or (3|4, B, S) for M-RoPE
ROW_INPUTS = ("input_ids", "inputs_embeds", "attention_mask", "token_type_ids", "mm_token_type_ids", "position_ids")
Combine = Callable[[torch.Tensor, Sequence[torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class Branch:
    """One contrast branch: ``pixels`` distorts the pixel tensor (None keeps it);
    ``hide_image`` removes the image tokens from the branch's attention."""

    name: str
    pixels: Callable[[torch.Tensor], torch.Tensor] | None = None
    hide_image: bool = False

    @property
    def needs_pixels(self) -> bool:
        return self.pixels is not None


@dataclass
class _CallState:
    rows: int  # original batch rows (batch x beams)
    prompt_image_mask: torch.Tensor | None  # (rows, prompt_len) image-token positions
    encoder_expanded: bool = False


class ContrastBranches:
    """Runs ``branches`` alongside the batch and hands ``combine`` the split logits."""

    def __init__(self, points: ModelPoints, branches: Sequence[Branch], combine: Combine) -> None:
        if not branches:
            raise ValueError("branches: at least one contrast branch is needed")
        self.points = points
        self.branches = tuple(branches)
        self.combine = combine
        self.state: _CallState | None = None
        self._inside_forward = False
        self._pending_encoder_expansion = False
        self._captured: list[dict] = []
        self._reencoding = False
        self.forward_calls = 0  # forwards that ran with branches (for cost accounting)

    @property
    def k(self) -> int:
        return len(self.branches)

    def attach(self, group: HookGroup) -> None:
        model = self.points.model
        group.add_forward_pre_hook(model, self._pre_forward)
        group.add_forward_hook(model, self._post_forward, always_call=True)
        mode = self.points.adapter.contrast_encoder
        if any(b.needs_pixels for b in self.branches) and mode == "vision_tower":
            group.add_forward_pre_hook(self.points.vision_encoder, self._pre_vision)
        elif any(b.needs_pixels for b in self.branches) and mode == "reencode":
            group.add_forward_pre_hook(self.points.vision_encoder, self._capture_vision)

    # -- helpers ------------------------------------------------------------------------
    def _expand_rows(self, name: str, x: torch.Tensor) -> torch.Tensor:
        dim = 1 if name == "position_ids" and x.dim() == 3 else 0
        return torch.cat([x] * (self.k + 1), dim=dim)

    def _expand_pixels(self, x: torch.Tensor, distort: bool) -> torch.Tensor:
        parts = [x]
        for branch in self.branches:
            parts.append(branch.pixels(x) if (distort and branch.needs_pixels) else x)
        return torch.cat(parts, dim=0)

    def _hide(self, mask: torch.Tensor, rows: int) -> torch.Tensor:
        """Zero the image-token columns of the hide_image branches' rows."""
        image = self.state.prompt_image_mask if self.state else None
        if image is None or not any(b.hide_image for b in self.branches):
            return mask
        mask = mask.clone()
        cols = min(image.shape[1], mask.shape[1])
        for i, branch in enumerate(self.branches, start=1):
            if branch.hide_image:
                block = mask[i * rows : (i + 1) * rows, :cols]
                mask[i * rows : (i + 1) * rows, :cols] = block.masked_fill(image[:, :cols], 0)
        return mask

    # -- hooks ----------------------------------------------------------------------------
    def _pre_vision(self, module: nn.Module, args: tuple, kwargs: dict):
        if self._inside_forward:  # pixels were already expanded at the forward level
            return None
        # generate() pre-encoding: append the branches' (distorted) images
        if args:
            pixels, rest = args[0], args[1:]
            n = pixels.shape[0]
            args = (self._expand_pixels(pixels, True), *[self._dup_if(a, n) for a in rest])
        else:
            key = next(k for k in ("pixel_values", "hidden_states") if k in kwargs)
            n = kwargs[key].shape[0]
            kwargs = {k: (self._expand_pixels(v, True) if k == key else self._dup_if(v, n)) for k, v in kwargs.items()}
        self._pending_encoder_expansion = True
        return args, kwargs

    def _capture_vision(self, module: nn.Module, args: tuple, kwargs: dict):
        """generate() pre-encoding on a "reencode" family: remember get_image_features' inputs."""
        if self._inside_forward or self._reencoding:
            return None
        captured = {}
        for source, target in self.points.adapter.encoder_inputs.items():
            value = args[int(source)] if source.isdigit() and int(source) < len(args) else kwargs.get(source)
            if value is not None:
                captured[target] = value
        self._captured.append(captured)
        return None

    def _reencode(self, encoded: dict) -> dict:
        """Encode the branches' distorted images with the model's own get_image_features."""
        if set(encoded) - {"image"} or len(self._captured) != 1:
            raise ValueError("a distorted-image branch supports image inputs only (no video) inside generate()")
        captured = self._captured[0]
        pixel_name = self.points.pixel_inputs[0]
        outputs = [encoded["image"]]
        self._reencoding = True
        try:
            for branch in self.branches:
                if branch.needs_pixels:
                    kw = {**captured, pixel_name: branch.pixels(captured[pixel_name])}
                    outputs.append(self.points.model.base_model.get_image_features(**kw, return_dict=True))
                else:
                    outputs.append(encoded["image"])
        finally:
            self._reencoding = False
        return {"image": _concat_outputs(outputs)}

    def _dup_if(self, value: Any, n: int) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            return torch.cat([value] * (self.k + 1), dim=0)
        return value

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict):
        if args:
            raise ValueError("contrast branches need keyword inputs: call model(**inputs) / model.generate(**inputs)")
        if kwargs.get("labels") is not None:
            raise ValueError("contrast branches are an inference-time mitigation; do not pass labels")
        ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
        lead = ids if ids is not None else embeds
        if lead is None:
            raise ValueError("contrast branches need input_ids or inputs_embeds")
        rows = lead.shape[0]
        cache = kwargs.get("past_key_values")
        prefill = cache is None or cache.get_seq_length() == 0
        if prefill:
            image = self.points.image_token_mask(ids, include_video=True) if ids is not None else None
            if any(b.hide_image for b in self.branches) and ids is None:
                raise ValueError("an image-free branch needs input_ids to find the image tokens")
            self.state = _CallState(rows, image, self._pending_encoder_expansion)
            self._pending_encoder_expansion = False
            has_pixels = bool(self.points.pixel_kwargs(kwargs)) or bool(kwargs.get("mm_encoder_outputs"))
            if any(b.needs_pixels for b in self.branches) and not has_pixels:
                raise ValueError(
                    f"branch {next(b.name for b in self.branches if b.needs_pixels)!r} distorts the image, but the call "
                    f"has no pixel inputs (expected one of {list(self.points.pixel_inputs)})"
                )
            if any(b.hide_image for b in self.branches) and (image is None or not bool(image.any())):
                raise ValueError("an image-free branch needs image tokens in input_ids; the call has none")
            if cache is not None and rows > 0:
                self._extend_reorder(cache)
        elif self.state is None or self.state.rows != rows:
            raise RuntimeError("contrast branches lost track of the batch: decoding step without a prefill")

        new = dict(kwargs)
        for name in ROW_INPUTS:
            if isinstance(kwargs.get(name), torch.Tensor):
                new[name] = self._expand_rows(name, kwargs[name])
        if new.get("attention_mask") is None and any(b.hide_image for b in self.branches):
            # generate() drops an all-ones mask; the image-free rows need one to hide the image
            past = 0 if cache is None else cache.get_seq_length()
            new["attention_mask"] = torch.ones(
                (rows * (self.k + 1), past + lead.shape[1]), dtype=torch.long, device=lead.device
            )
        if isinstance(new.get("attention_mask"), torch.Tensor) and new["attention_mask"].dim() == 2:
            new["attention_mask"] = self._hide(new["attention_mask"], rows)

        pixel_kwargs = self.points.pixel_kwargs(kwargs)
        if pixel_kwargs:
            self._inside_forward = True
            for name, value in pixel_kwargs.items():
                if name in ROW_INPUTS:
                    continue
                if name in self.points.pixel_inputs:
                    new[name] = self._expand_pixels(value, True)
                else:
                    new[name] = torch.cat([value] * (self.k + 1), dim=0)
        encoded = kwargs.get("mm_encoder_outputs")
        if encoded:
            new["mm_encoder_outputs"] = self._expand_encoded(encoded, ids)
        self.forward_calls += 1
        return args, new

    def _expand_encoded(self, encoded: dict, ids: torch.Tensor | None) -> dict:
        if self.state.encoder_expanded or (self._captured and any(b.needs_pixels for b in self.branches)):
            if not self.state.encoder_expanded:
                encoded = self._reencode(encoded)
                self._captured = []
            # beam search expands the encoded images per beam before the branches exist, which
            # drops (vision_tower) or misaligns (reencode) the branches' images: refuse it
            image = encoded.get("image")
            if ids is not None and image is not None and getattr(image, "pooler_output", None) is not None:
                tokens = int((ids == self.points.image_token_id).sum()) * (self.k + 1)
                if _count_vectors(image.pooler_output) != tokens:
                    raise ValueError(
                        "a distorted-image branch does not support beam search or num_return_sequences > 1 yet: "
                        "generate() expands the encoded images per beam before the branches exist. Use greedy or "
                        "sampling, or distortion='no_image'."
                    )
            return encoded
        if any(b.needs_pixels for b in self.branches):
            raise ValueError(
                f"a distorted-image branch cannot run inside generate() on model_type "
                f"{self.points.model_type!r}: transformers encodes the images before decoding and this family's "
                "feature post-processing is per image (adapter contrast_encoder is not 'vision_tower'). Use "
                "distortion='no_image', or call the model directly."
            )
        return {modality: _duplicate_output(out, self.k + 1) for modality, out in encoded.items()}

    def _extend_reorder(self, cache: Any) -> None:
        if getattr(cache, "_contrast_branches_reorder", False) or not hasattr(cache, "reorder_cache"):
            return
        original = cache.reorder_cache
        k = self.k

        def reorder_cache(beam_idx: torch.Tensor) -> None:
            rows = beam_idx.shape[0]
            original(torch.cat([beam_idx + i * rows for i in range(k + 1)]))

        cache.reorder_cache = reorder_cache  # this generate() call's cache object only
        cache._contrast_branches_reorder = True

    def _post_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any):
        self._inside_forward = False
        if self.state is None or output is None or getattr(output, "logits", None) is None:
            return None
        rows = self.state.rows
        logits = output.logits
        if logits.shape[0] != rows * (self.k + 1):
            raise RuntimeError(f"expected {rows * (self.k + 1)} logit rows from the branches, got {logits.shape[0]}")
        parts = logits.split(rows, dim=0)
        output.logits = self.combine(parts[0], parts[1:])
        self._restore_rope_state(rows)
        return output

    def _restore_rope_state(self, rows: int) -> None:
        path = self.points.adapter.rope_state
        if not path:
            return
        owner_path, _, attr = path.rpartition(".")
        owner = self.points.model.get_submodule(owner_path) if owner_path else self.points.model
        value = getattr(owner, attr, None)
        if isinstance(value, torch.Tensor) and value.shape[0] == rows * (self.k + 1):
            setattr(owner, attr, value[:rows])


def _count_vectors(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() // value.shape[-1]
    return sum(_count_vectors(v) for v in value)


def _concat_outputs(outputs: list) -> Any:
    """Concatenate encoded image outputs of several row blocks, in order."""

    def cat(values: list) -> Any:
        first = values[0]
        if isinstance(first, torch.Tensor):
            return torch.cat(values, dim=0)
        if all(isinstance(v, torch.Tensor) for v in first):
            joined = [t for v in values for t in v]
            return joined if isinstance(first, list) else tuple(joined)
        return type(first)(cat([v[i] for v in values]) for i in range(len(first)))

    base = outputs[0]
    copy = type(base)(**{k: v for k, v in base.items()})
    for key in ("pooler_output", "deepstack_features"):
        if getattr(base, key, None) is not None:
            setattr(copy, key, cat([getattr(o, key) for o in outputs]))
    return copy


def _duplicate_output(out: Any, times: int) -> Any:
    """Repeat encoded image features for ``times`` row blocks, in order (tensors are
    concatenated on dim 0, per-image lists/tuples are repeated; nested lists elementwise)."""
    from transformers.utils import ModelOutput

    def dup(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.cat([value] * times, dim=0)
        if isinstance(value, (list, tuple)):
            if all(isinstance(v, torch.Tensor) for v in value):
                return type(value)(list(value) * times) if isinstance(value, list) else tuple(value) * times
            return type(value)(dup(v) for v in value)
        return value

    if isinstance(out, ModelOutput):
        copy = type(out)(**{k: v for k, v in out.items()})
        for key in ("pooler_output", "deepstack_features"):
            if getattr(out, key, None) is not None:
                setattr(copy, key, dup(getattr(out, key)))
        return copy
    return dup(out)
