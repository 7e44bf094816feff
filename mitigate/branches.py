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

transformers >= 5.2 encodes images once before ``generate()``'s loop (the model's own
``get_image_features``) and passes ``mm_encoder_outputs`` to ``forward``. Image-free
branches reuse the encoded features (their rows never attend to them). Branches with a
*distorted* image need the encoder to see the distorted pixels, and no forward hook sees
that call whole (``image_sizes``, ``grid_thw``, tile packing are arguments of
``get_image_features``, not of the vision tower). So the branches wrap
``base_model.get_image_features`` for the time they are attached (an owned
:meth:`hooks.HookGroup.patch_attribute`, restored exactly on detach): outside a forward,
the wrapper also encodes each branch's distorted pixels with the model's own function and
keeps them beside the original output. At the prefill, the forward hook appends them as
the branches' image blocks, expanded per beam / returned sequence the same way
``generate()`` expanded the original (its ``_expand_multimodal_outputs``). One path for
every family: fixed grids, AnyRes tiles (LLaVA-NeXT/OneVision), image splitting
(Idefics3/SmolVLM), dynamic resolution (Qwen-VL, Mistral3).

Beam search reorders the KV cache with indices of the original rows; the hook extends
the reordering to every branch's rows (on the cache object of that ``generate()`` call).

The image-free rows' 2-D mask follows what ``generate()`` sends: the image tokens of
every forward that brings several tokens over a filled cache (a chunked prefill's later
chunks) are hidden too, and under a static cache -- where ``generate()`` hands the model
4-D masks it built itself -- the padding is read from those masks at the prefill and the
model builds its own masks from the 2-D one (:meth:`ContrastBranches._padding_mask`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from hooks import HookGroup, ModelPoints
from hooks.cache import PromptCache, cache_of, keep_first_rows

# generate()'s function that calls get_image_features before decoding (transformers >= 5.2)
GENERATE_ENCODER = "_prepare_multimodal_encoder_kwargs_for_generation"
_MARK = "_contrast_branches"  # instance attribute marking a model with branches attached

_GUIDANCE_CODES: frozenset | None = None  # code objects of transformers' classifier-free guidance processor


def called_by_guidance(depth: int = 12) -> bool:
    """Whether the forward being hooked was called by ``generate()``'s classifier-free
    guidance (``guidance_scale != 1``): its logits processor runs the model a second time,
    on an unconditional prompt (the last token, or ``negative_prompt_ids``), from inside
    the decoding loop. Found by the processor's code objects among the few frames above
    the hook (every method of the class, so a renamed method is still found)."""
    global _GUIDANCE_CODES
    if _GUIDANCE_CODES is None:
        try:
            from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor as cls
        except ImportError:  # a transformers without it: nothing can call the model this way
            _GUIDANCE_CODES = frozenset()
        else:
            _GUIDANCE_CODES = frozenset(v.__code__ for v in vars(cls).values() if inspect.isfunction(v))
    if not _GUIDANCE_CODES:
        return False
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code in _GUIDANCE_CODES:
            return True
        frame = frame.f_back
    return False


def refuse_guidance(what: str, why: str) -> None:
    """A clear error for a forward of classifier-free guidance (:func:`called_by_guidance`)."""
    if called_by_guidance():
        raise ValueError(
            f"guidance_scale: generate()'s classifier-free guidance runs the model a second time, on an "
            f"unconditional prompt, from inside its logits processor, and {what} acts on every forward of the "
            f"model, so it would act on that one too: {why}. Attached mitigations do not support it; leave "
            "guidance_scale unset (or 1) and negative_prompt_ids out while they are attached")


def verifies_drafts(kwargs: dict) -> bool:
    """Whether a forward scores several drafted tokens (assisted or prompt-lookup decoding:
    ``generate()`` asks for the logits of each, ``logits_to_keep`` > 1) -- generated tokens,
    never part of the prompt -- rather than bringing more prompt."""
    keep = kwargs.get("logits_to_keep")
    return isinstance(keep, torch.Tensor) or (isinstance(keep, int) and keep > 1)


def refuse_paged_cache(cache: Any, what: str) -> None:
    """A clear error for continuous batching (``cache_implementation="paged"``, ``generate_batch``):
    its cache has no per-row sequence length (``get_seq_length``) to tell a prompt from a
    decoding step, and every request of the batch is packed into one row."""
    if cache is not None and not callable(getattr(cache, "get_seq_length", None)):
        raise ValueError(
            f"cache_implementation='paged' (continuous batching, generate_batch()): {what} needs each sample in "
            f"rows of its own and a cache that tells a prompt from a decoding step, and a "
            f"{type(cache).__name__} packs every request into one row; use the default dynamic cache or "
            "cache_implementation='static'")


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
    padding: torch.Tensor | None = None  # (rows, positions so far) 2-D padding mask, for image-free rows
    cache: PromptCache = field(default_factory=PromptCache)  # the cache the prefill filled


@dataclass
class _Encoded:
    """What the wrapped ``get_image_features`` produced in one ``generate()`` pre-encoding."""

    original: Any  # the output object generate() keeps (and may expand in place)
    vectors: int  # its feature vectors before any expansion
    branches: list  # per branch: the distorted images' output, or None (reuse the original)
    expanded: dict = field(default_factory=dict)  # expand_size -> per-branch expanded outputs


class ContrastBranches:
    """Runs ``branches`` alongside the batch and hands ``combine`` the split logits."""

    def __init__(self, points: ModelPoints, branches: Sequence[Branch], combine: Combine) -> None:
        if not branches:
            raise ValueError("branches: at least one contrast branch is needed")
        self.points = points
        self.branches = tuple(branches)
        self.combine = combine
        self.state: _CallState | None = None
        self._encoded: _Encoded | None = None
        self.forward_calls = 0  # forwards that ran with branches (for cost accounting)

    @property
    def k(self) -> int:
        return len(self.branches)

    def attach(self, group: HookGroup) -> None:
        model = self.points.model
        if vars(model).get(_MARK) is not None:
            raise ValueError(
                "contrast branches are already attached to this model by another attach(); detach it first, or "
                "attach all mitigations in one call: attach(model, VCD(), PriorSuppression(...))"
            )
        group.patch_attribute(model, _MARK, self)  # one set of branches per model (they expand one batch)
        group.add_forward_pre_hook(model, self._pre_forward)
        # first of the model's forward hooks, whenever attached: any other (a plausibility cut
        # from another attach()) must only ever see the combined original rows
        group.add_forward_hook(model, self._post_forward, always_call=True, prepend=True)
        group.on_remove(self._release)  # the last call's cache, handed back without the branch rows
        owner = model.base_model
        if any(b.needs_pixels for b in self.branches) and callable(getattr(owner, "get_image_features", None)):
            group.patch_attribute(owner, "get_image_features", self._wrap_encoder(owner.get_image_features))

    # -- helpers ------------------------------------------------------------------------
    def _expand_rows(self, name: str, x: torch.Tensor) -> torch.Tensor:
        dim = 1 if name == "position_ids" and x.dim() == 3 else 0
        return torch.cat([x] * (self.k + 1), dim=dim)

    def _expand_pixels(self, x: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        parts = [x]
        for branch in self.branches:
            parts.append(self._distorted(branch, x, rows) if branch.needs_pixels else x)
        return torch.cat(parts, dim=0)

    def _image_rows(self, name: str, kwargs: dict) -> list | None:
        """Rows of the patch pixel input ``name`` that each image owns (the adapter's
        ``pixel_grids``: Qwen's ``image_grid_thw`` for flat patches; for Gemma 4's padded
        per-image rows, how many lead rows of each image are real patches, from
        ``image_position_ids``), or None for image-shaped layouts."""
        grid_name = self.points.adapter.pixel_grids.get(name)
        grid = kwargs.get(grid_name) if grid_name else None
        if not isinstance(grid, torch.Tensor):
            return None
        if self.points.adapter.pixel_layout == "batch_chw":  # (height, width) of each padded image
            pixels = kwargs.get(name)
            sizes = [(int(h), int(w)) for h, w in grid.reshape(-1, 2).tolist()]
            if isinstance(pixels, torch.Tensor) and (len(sizes) != pixels.shape[0] or any(
                    h > pixels.shape[-2] or w > pixels.shape[-1] for h, w in sizes)):
                raise ValueError(f"{grid_name} {sizes} does not fit {name} of shape {tuple(pixels.shape)}")
            return sizes
        if self.points.adapter.pixel_layout == "batch_patches":
            real = (grid != -1).all(-1)
            counts = real.sum(-1)
            if not bool((real == (torch.arange(real.shape[1], device=real.device)[None] < counts[:, None])).all()):
                raise ValueError(f"{grid_name}: padding (-1) patches must follow each image's real ones")
            return [int(n) for n in counts.tolist()]
        rows = [int(n) for n in grid.prod(-1).tolist()]
        pixels = kwargs.get(name)
        if isinstance(pixels, torch.Tensor) and sum(rows) != pixels.shape[0]:
            raise ValueError(f"{grid_name} gives {sum(rows)} rows of {name} in all, the tensor has {pixels.shape[0]}")
        return rows

    def _expand_mask(self, mask: Any, rows: int) -> Any:
        """The attention mask for every branch's rows: a 2-D padding mask, or the 4-D masks
        ``generate()`` builds itself for a compilable (static) cache -- one tensor, or one per
        layer type -- whose batch dimension may be 1 (shared by every row)."""
        if isinstance(mask, dict):
            return {kind: self._expand_mask(value, rows) for kind, value in mask.items()}
        if mask is None:  # a layer type that needs no mask (in a dict of them)
            return None
        if not isinstance(mask, torch.Tensor):
            raise ValueError(
                f"contrast branches cannot give each branch its own rows of a {type(mask).__name__} attention "
                "mask (flex attention's BlockMask); use sdpa or eager attention"
            )
        if mask.dim() == 4 and mask.shape[0] == 1 and rows > 1:
            mask = mask.expand(rows, *mask.shape[1:])
        return torch.cat([mask] * (self.k + 1), dim=0)

    def _padding_mask(self, mask: Any, rows: int, past: int, length: int, device) -> torch.Tensor:
        """The ``(rows, length)`` padding mask behind this call's attention mask, for the
        image-free branches, which hide the image in a 2-D mask and let the model build its
        own per-layer masks from it (as it does under the default dynamic cache).

        ``generate()`` passes a 2-D mask, none (no padding), or -- for a compilable (static)
        cache -- 4-D masks it built itself, one tensor or one per layer type (None where a
        type needs none). Those are read once, at the prefill: a token is real when it may
        attend to itself -- the diagonal of the queries' rows, which a causal and a sliding
        mask agree on (the full-attention mask's when there is one). A decoding step adds
        one real position per row, so its padding is the prefill's with ones after it; the
        narrower masks of a sliding window's buffer are never read."""
        if isinstance(mask, dict):
            if "full_attention" in mask:
                mask = mask["full_attention"]
            else:  # every layer slides: its diagonal says the same
                mask = next((m for m in mask.values() if m is not None), None)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            return mask
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != 4):
            raise ValueError(f"an image-free branch reads 2-D or 4-D attention masks, got {type(mask).__name__}"
                             + (f" of shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else ""))
        known = self.state.padding if self.state is not None else None
        if known is not None and known.shape[1] <= length:  # a decoding step: the new positions are real
            extra = torch.ones((rows, length - known.shape[1]), dtype=known.dtype, device=known.device)
            return torch.cat([known, extra], dim=1)
        if mask is None:
            return torch.ones((rows, length), dtype=torch.long, device=device)
        if past:
            raise ValueError("an image-free branch cannot read the padding of a cache it did not see filled "
                             "(a static cache continued from an earlier call); use the default dynamic cache")
        queries = mask.shape[-2]
        seen = torch.diagonal(mask[:, 0, :, :queries], dim1=-2, dim2=-1)
        seen = seen if seen.dtype == torch.bool else seen == 0
        return seen.expand(rows, queries).long()

    def _hide(self, mask: torch.Tensor, rows: int) -> torch.Tensor:
        """Zero the image-token columns of the hide_image branches' rows (a 2-D mask)."""
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

    def _distorted(self, branch: Branch, pixels: torch.Tensor, rows: list | None = None) -> torch.Tensor:
        """``branch``'s distortion of ``pixels``, image by image: ``rows`` splits flattened
        patches into their images, or gives each padded image's real patches or (height,
        width) (so an image is
        distorted the same whatever batch it is in, its padding left as it was). Pixels in
        the unit range are distorted in the normalised space the model maps them to."""
        distort = branch.pixels
        if self.points.adapter.pixel_range == "unit":
            distort = lambda x: (branch.pixels(2 * x - 1) + 1) / 2  # noqa: E731 -- the model's own 2x - 1
        if rows is not None and self.points.adapter.pixel_layout == "batch_patches":
            out = pixels.clone()
            for i, n in enumerate(rows):
                out[i, :n] = distort(pixels[i : i + 1, :n])[0]
            return out
        if rows is not None and self.points.adapter.pixel_layout == "batch_chw":
            # each image's own (height, width) at the top left, the batch's zero padding left as
            # it is: the same image is distorted the same alone or beside a larger one (its
            # noise seeded by its own pixels), and a blur draws nothing from the padding
            out = pixels.clone()
            for i, (h, w) in enumerate(rows):
                out[i, :, :h, :w] = distort(pixels[i : i + 1, :, :h, :w])[0]
            return out
        if rows is not None and len(rows) > 1:
            return torch.cat([distort(part) for part in pixels.split(rows, dim=0)], dim=0)
        out = distort(pixels)
        if self.points.adapter.pixel_layout == "batch_images_chw" and pixels.dim() == 5:
            # all-zero images are the processor's padding, dropped by the model: keep them so
            # every branch has the same images as the original
            padding = (pixels == 0).flatten(2).all(-1)[..., None, None, None]
            out = out.masked_fill(padding, 0)
        return out

    def _wrap_encoder(self, original: Callable) -> Callable:
        @functools.wraps(original)  # generate() reads the signature to pick the arguments
        def get_image_features(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            # the adapter's first pixel input this call has (Video-LLaVA's encoder takes pixel_values_images)
            pixel_name = next((n for n in self.points.pixel_inputs if n in kwargs), None)
            # only generate()'s pre-encoding needs the branches' images: a forward's own
            # encoding sees pixels already expanded, and other callers (feature extraction,
            # get_video_features) get the plain output. Should transformers rename the
            # caller, generate() fails with the clear error of _expand_encoded, never silently.
            # (No "inside a forward" flag: generate() encodes before any forward, and a flag
            # set by the pre-hook stayed set after a KeyboardInterrupt, which skips even
            # always_call hooks, so the next generate() lost its distorted images.)
            caller = sys._getframe(1).f_code.co_name
            if caller != GENERATE_ENCODER or args or pixel_name is None:
                return out
            branches = []
            for branch in self.branches:
                if branch.needs_pixels:
                    distorted = self._distorted(branch, kwargs[pixel_name], self._image_rows(pixel_name, kwargs))
                    branches.append(original(**{**kwargs, pixel_name: distorted}))
                else:
                    branches.append(None)
            pooled = getattr(out, "pooler_output", None)
            vectors = _count_vectors(pooled) if pooled is not None else -1
            self._encoded = _Encoded(out, vectors, branches)
            return out

        return get_image_features

    def _expand_encoded(self, encoded: dict, ids: torch.Tensor | None) -> dict:
        """The branches' blocks of ``mm_encoder_outputs``, after the original rows' block."""
        if not any(b.needs_pixels for b in self.branches):
            return {modality: _concat_outputs([out] * (self.k + 1)) for modality, out in encoded.items()}
        image = encoded.get("image")
        mine = self._encoded
        if set(encoded) - {"image"} or image is None:
            raise ValueError("a distorted-image branch supports image inputs only (no video) inside generate()")
        if mine is None or image is not mine.original:
            raise ValueError(
                "a distorted-image branch needs to encode the distorted pixels itself, and this forward got encoded "
                "images it did not see being made: pass pixel inputs (not pre-computed mm_encoder_outputs) to "
                "generate() while the mitigation is attached, and do not use prefill_chunk_size (it hands each "
                "chunk a slice of the encoded images)"
            )
        branches = mine.branches
        vectors = _count_vectors(image.pooler_output) if getattr(image, "pooler_output", None) is not None else -1
        if vectors != mine.vectors:  # beam search / num_return_sequences expanded the original
            if mine.vectors <= 0 or vectors % mine.vectors or ids is None:
                raise ValueError(
                    "a distorted-image branch cannot follow how generate() expanded the encoded images "
                    f"({mine.vectors} feature vectors became {vectors})"
                )
            times = vectors // mine.vectors
            if times not in mine.expanded:
                first = ids[::times]  # generate() repeat_interleaves the rows
                mine.expanded[times] = [
                    None if b is None else
                    self.points.model._expand_multimodal_outputs(first, {"image": _shallow(b)}, expand_size=times)["image"]
                    for b in branches
                ]
            branches = mine.expanded[times]
        outputs = [image] + [image if b is None else b for b in branches]
        return {"image": _concat_outputs(outputs)}

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict):
        refuse_guidance("a contrast branch", "the unconditional prompt has no image for the branch to distort or "
                        "hide, and its forward would start over the state of the generation it runs inside")
        refuse_paged_cache(cache_of(kwargs), "a contrast branch")
        if args:
            raise ValueError("contrast branches need keyword inputs: call model(**inputs) / model.generate(**inputs)")
        labels = kwargs.get("labels")
        if labels is not None:
            if bool((labels != -100).any()):
                raise ValueError("contrast branches are an inference-time mitigation; do not pass labels")
            # PaliGemma's processor returns labels with every call ("kept only for BC"), all
            # -100 without a suffix: no target, so they are dropped, not refused (the rows
            # they would be scored on are expanded by the branches)
            kwargs["labels"] = None
        ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
        lead = ids if ids is not None else embeds
        if lead is None:
            raise ValueError("contrast branches need input_ids or inputs_embeds")
        rows = lead.shape[0]
        cache = cache_of(kwargs)
        prefill = cache is None or cache.get_seq_length() == 0
        if prefill:
            image = self.points.image_token_mask(ids, include_video=True) if ids is not None else None
            if any(b.hide_image for b in self.branches) and ids is None:
                raise ValueError("an image-free branch needs input_ids to find the image tokens")
            if self.state is not None and not self.state.cache.continues(cache):
                self._release()  # the previous call's cache can no longer be continued here
            self.state = _CallState(rows, image)
            self.state.cache.filled(cache)
            has_pixels = bool(self.points.pixel_kwargs(kwargs)) or bool(kwargs.get("mm_encoder_outputs"))
            if any(b.needs_pixels for b in self.branches) and not has_pixels:
                raise ValueError(
                    f"branch {next(b.name for b in self.branches if b.needs_pixels)!r} distorts the image, but the call "
                    f"has no pixel inputs (expected one of {list(self.points.pixel_inputs)}); if this model is also "
                    "the assistant_model of assisted decoding, pass a separate copy as the assistant"
                )
            if any(b.hide_image for b in self.branches) and (image is None or not bool(image.any())):
                raise ValueError("an image-free branch needs image tokens in input_ids; the call has none (under "
                                 "prefill_chunk_size, the first chunk must reach the first image token)")
            if cache is not None and rows > 0:
                first = cache.layers[0] if getattr(cache, "layers", None) else None
                if getattr(first, "is_initialized", False) and getattr(first, "keys", None) is not None \
                        and first.keys.dim() > 0 and first.keys.shape[0] != rows * (self.k + 1):
                    raise ValueError(
                        f"contrast branches run {rows * (self.k + 1)} rows, and this cache was allocated for "
                        f"{first.keys.shape[0]} before the first forward (generate() does so for a static cache "
                        "with prefill_chunk_size): use one of the two, or a dynamic cache")
                self._extend_reorder(cache)
        elif self.state is None:
            # a cache filled before attach() (a cached prompt prefix), or under another handle: it
            # holds no branch rows, and nothing here knows the image positions or the padding
            raise ValueError(
                "contrast branches: this forward continues a cache that no prefill filled while they were attached "
                "(a prompt cached before attach(), or by another handle), so it holds no rows for the branches: "
                "attach before the prompt runs, or run the whole prompt in generate()")
        elif self.state.rows != rows:
            raise RuntimeError("contrast branches lost track of the batch: decoding step without a prefill")
        elif not self.state.cache.continues(cache):
            raise ValueError(
                "contrast branches: this forward continues a cache that is not the one the last prefill filled "
                "(a conversation continued after another call while attached); its branch rows, image positions "
                "and padding belong to that call: continue a cache right after the call that made it, or re-run "
                "the whole conversation")
        else:
            self._encoded = None  # decoding with a cache: the encoded images are not needed again
            image = self.state.prompt_image_mask
            if ids is not None and ids.shape[1] > 1 and image is not None:
                # several new tokens over a filled cache: a later chunk of a chunked prefill
                # (prefill_chunk_size) or a prompt continued over the cache -- its image
                # tokens join those the image-free rows do not see, at their positions --
                # or drafted tokens to verify (assisted / prompt-lookup decoding): generated,
                # never image, even a draft that repeats the image token's id (as a decoding
                # step one token at a time leaves it in view)
                past = int(cache.get_seq_length())
                image = image[:, :past]
                if image.shape[1] < past:
                    image = torch.nn.functional.pad(image, (0, past - image.shape[1]), value=False)
                if verifies_drafts(kwargs):
                    new_image = torch.zeros(ids.shape, dtype=torch.bool, device=image.device)
                else:
                    new_image = self.points.image_token_mask(ids, include_video=True).to(image.device)
                self.state.prompt_image_mask = torch.cat([image, new_image], dim=1)

        if prefill and kwargs.get("position_ids") is None and any(b.hide_image for b in self.branches):
            positions = self._positions_of_the_original(kwargs)
            if positions is not None:
                kwargs = {**kwargs, "position_ids": positions}
        new = dict(kwargs)
        for name in ROW_INPUTS:
            if name == "attention_mask":
                continue
            if isinstance(kwargs.get(name), torch.Tensor):
                new[name] = self._expand_rows(name, kwargs[name])
        mask = kwargs.get("attention_mask")
        if any(b.hide_image for b in self.branches):
            # a 2-D mask whose image columns are 0 for the image-free rows: made when generate()
            # dropped an all-ones mask, read back from the 4-D masks it built for a static cache
            past = 0 if cache is None else int(cache.get_seq_length())
            padding = self._padding_mask(mask, rows, past, past + lead.shape[1], lead.device)
            self.state.padding = padding
            new["attention_mask"] = self._hide(self._expand_rows("attention_mask", padding), rows)
        elif mask is not None:
            new["attention_mask"] = self._expand_mask(mask, rows)

        pixel_kwargs = self.points.pixel_kwargs(kwargs)
        if pixel_kwargs:
            for name, value in pixel_kwargs.items():
                if name in ROW_INPUTS:
                    continue
                if name in self.points.pixel_inputs:
                    new[name] = self._expand_pixels(value, self._image_rows(name, kwargs))
                else:
                    new[name] = torch.cat([value] * (self.k + 1), dim=0)
        encoded = kwargs.get("mm_encoder_outputs")
        if encoded:
            new["mm_encoder_outputs"] = self._expand_encoded(encoded, ids)
        self.forward_calls += 1
        return args, new

    def _release(self) -> None:
        """Forget the last call: its KV cache (if anything still holds it -- the
        ``past_key_values`` of a ``generate()`` output) is cut back to the original rows
        (:func:`hooks.cache.keep_first_rows`), so that after ``detach()`` plain decoding
        continues it as the unmitigated model's cache of the same tokens -- a chat's next
        turn, say. Under the hooks a continuation of it is refused as before (no prefill
        filled it while they were attached); static, quantized and offloaded caches keep
        their branch rows."""
        state, self.state = self.state, None
        cache = None if state is None else state.cache.current()
        if cache is not None:
            keep_first_rows(cache, state.rows, state.rows * (self.k + 1))

    def _positions_of_the_original(self, kwargs: dict) -> torch.Tensor | None:
        """M-RoPE positions of the original rows, for a forward that came without them.

        Models with multimodal RoPE (Qwen2/2.5/3-VL) compute positions inside ``forward``
        from the attention mask when the caller passes none (a direct ``model(**inputs)``;
        ``generate()`` passes its own). An image-free branch's mask hides the image tokens,
        which would move the text after the image to other positions; computing them here,
        from the unhidden mask, and copying them to the branch rows keeps every branch at
        the original's positions -- as under ``generate()``. Families without the
        transformers method ``compute_3d_position_ids`` take positions from the cache
        position, which hiding does not move."""
        compute = getattr(self.points.model.base_model, "compute_3d_position_ids", None)
        if not self.points.adapter.multimodal_rope or not callable(compute):
            return None
        accepted = inspect.signature(compute).parameters
        args = {name: kwargs.get(name) for name in accepted if name != "self"}
        return compute(**args)

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
        if isinstance(output, tuple) and self.state is not None:
            raise ValueError("contrast branches combine the logits of a ModelOutput; this forward returned a tuple "
                             "(return_dict=False), whose rows would come back uncombined: call it with return_dict=True")
        if self.state is None or output is None or getattr(output, "logits", None) is None:
            return None
        rows = self.state.rows
        logits = output.logits
        if logits.shape[0] != rows * (self.k + 1):
            raise RuntimeError(f"expected {rows * (self.k + 1)} logit rows from the branches, got {logits.shape[0]}")
        parts = logits.split(rows, dim=0)
        output.logits = self.combine(parts[0], parts[1:])
        self.state.cache.made(output)
        self._original_rows_only(output, rows)
        self._restore_rope_state(rows)
        return output

    def _original_rows_only(self, output: Any, rows: int) -> None:
        """The output's hidden states and attentions (``output_hidden_states`` /
        ``output_attentions``, which ``generate()`` returns step by step) cut to the original
        rows, which come first. The KV cache keeps every branch's rows (the next step needs
        them); a direct forward's encoded images (``image_outputs``) hold the original
        images' block, then each branch's."""
        total = rows * (self.k + 1)
        for name in ("hidden_states", "attentions"):
            value = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
            if isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) and v.shape[0] == total
                                                          for v in value):
                setattr(output, name, tuple(v[:rows] for v in value))

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


def _shallow(out: Any) -> Any:
    """A copy of a ModelOutput whose fields can be replaced without touching ``out``."""
    return type(out)(**{k: v for k, v in out.items()})


def _concat_outputs(outputs: list) -> Any:
    """Concatenate encoded image outputs of several row blocks, in order (tensors on dim 0,
    per-image lists / tuples joined, nested lists such as deepstack layers elementwise)."""

    def cat(values: list) -> Any:
        first = values[0]
        if isinstance(first, torch.Tensor):
            return torch.cat(values, dim=0)
        if all(isinstance(v, torch.Tensor) for v in first):
            joined = [t for v in values for t in v]
            return joined if isinstance(first, list) else tuple(joined)
        return type(first)(cat([v[i] for v in values]) for i in range(len(first)))

    base = outputs[0]
    copy = _shallow(base)
    for key in ("pooler_output", "deepstack_features"):
        if getattr(base, key, None) is not None:
            setattr(copy, key, cat([getattr(o, key) for o in outputs]))
    return copy
