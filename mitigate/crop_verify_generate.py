"""Crop-and-verify under plain ``model.generate()`` and ``pipeline("image-text-to-text")``.

``attach(model, CropVerify(processor))`` makes the model's own ``generate()`` verify its
answers, with no change to the caller's code. Two owned attribute patches do it (both
restored exactly on ``detach()``, :meth:`hooks.HookGroup.patch_attribute`):

* the processor's ``image_processor.preprocess`` remembers the images it was given (PIL
  images, or arrays / tensors converted to them), keyed by the exact pixels it returned
  (:class:`OriginalImages`) -- ``generate()`` only ever sees the resized pixels, and the
  views must be cut from the *original* image;
* ``model.generate`` runs the caller's generation with the first step's scores and, at
  its prefill, captures every row's localisation map -- the chosen layers' attention
  (:func:`mitigate.localize.capture_first_pass`) or the embeddings' similarity to the
  object's name (``locate="embedding"``); the generation itself is unchanged --,
  gates each row as :meth:`CropVerify.answer` does (:meth:`CropVerify.gate_rows`:
  first-token confidence below ``gate``, not "yes", not a box or free text), localises
  the gated rows' objects from those maps (plus, for attention, one forward of the generic
  prompt, ViCrop's ratio), and re-asks every view of every gated row in one more ``generate()``
  (one per token limit: the views of a yes/no question answer with
  :attr:`CropVerify.yes_no_view_tokens` tokens, those of a count or an attribute with the
  call's own limit).

The views are re-asked with the caller's own prompt tokens: each view is resized to its
original's size, so the family's processor gives it exactly as many image tokens as the
original had and the rows' ``input_ids`` are reused (no chat template is re-applied,
nothing about the prompt is guessed). ``strip_priors`` -- asking the views the question
without the prompt's belief sentences -- deletes the tokens of the sentences
:func:`mitigate.spans.find_prior_spans` finds from the views' rows
(:func:`_without_prior_tokens`), as ``answer()`` deletes them from the text, so both
routes ask the views the same tokens at the same positions. The overturn policy is
:meth:`CropVerify._decide`, the same as ``answer()``'s; an overturned row's returned
sequence is the caller's prompt followed by the chosen view's answer (closed with the
end-of-sequence token when the view's answer was cut at a limit shorter than the call's).

What it cannot verify is an error or is counted, never passed through silently: a call
without ``input_ids`` or pixel inputs, beam search and several returned sequences raise a
``ValueError`` (verification picks between whole answers of one sequence per row); rows
whose original cannot be told -- not preprocessed by the attached processor, several images
per row, pixels that several different images share, or an array / tensor image whose value
range is ambiguous (:func:`_as_pil`) -- are answered unverified, counted in
``stats["no_original"]`` and warned about, the warning saying why; boxes
and free text are never re-asked (``stats["not_verifiable"]``, see
:func:`mitigate.answer_kinds.answer_kind`). The "pair" view needs two images per prompt
and is only available through :meth:`CropVerify.answer`. Returned ``scores`` (when asked
for) are the first pass's; the returned ``past_key_values`` is None when any answer of the
call was overturned (the cache holds the first pass's answers: continuing it would condition
a chat's next turn on the answer that was replaced).

A ``streamer`` receives the *final* answer: a verified row's answer is only known after
the views, and a streamed token cannot be taken back, so the tokens are put to the
streamer once verification is done (prompt first, then one step at a time, as
``generate()`` does) rather than while the first pass runs. The views' pass never streams.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image

from hooks import HookGroup, ModelPoints
from hooks.cache import CACHE_NAMES, drop_output_cache, output_cache

from .answer_kinds import answer_kind
from .crop_verify import ask_by_limit, emitted_probability, view_image
from .localize import object_in_question


def _flat_images(images: Any) -> list:
    """The images of a preprocess call, flattened as the image processors read them: nested
    lists, and a 4-D array or tensor as a batch of images (one image per leading index)."""
    if isinstance(images, (list, tuple)):
        return [im for item in images for im in _flat_images(item)]
    if isinstance(images, (np.ndarray, torch.Tensor)) and images.ndim == 4:
        return [images[i] for i in range(images.shape[0])]
    return [images]


class Unusable:
    """An image of a preprocess call no view can be cut from, or a row whose pixels match
    several different images: ``reason`` says which, for the warning."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unusable({self.reason!r})"


def _as_pil(image: Any, do_rescale: bool, factor: float, data_format: Any = None) -> Image.Image | Unusable:
    """``image`` as the PIL image the views are cut from, as the model saw it: a PIL image as
    it is; an array or tensor ((H, W), (H, W, C) or (C, H, W), read as the processor reads
    it) converted where its value range is unambiguous -- the processor multiplies it by
    ``factor`` when ``do_rescale`` (uint8 0-255 under the default 1/255, float 0-255), and
    takes it as it is otherwise (float in [0, 1]); the views, PIL images, are rescaled by the
    default 1/255. A float image in [0, 1] that ``do_rescale`` rescales again (transformers
    warns of it) could as well be a dark 0-255 image: :class:`Unusable`, as is any other
    type or range."""
    if isinstance(image, Image.Image):
        return image
    kind = type(image).__name__ if not isinstance(image, (np.ndarray, torch.Tensor)) else \
        f"{'a torch tensor' if isinstance(image, torch.Tensor) else 'a numpy array'} image of shape " \
        f"{tuple(image.shape)} and dtype {str(image.dtype).replace('torch.', '')}"
    if not isinstance(image, (np.ndarray, torch.Tensor)):
        return Unusable(f"an image of type {kind} cannot be cut into views")
    if isinstance(image, torch.Tensor):
        image = image.detach()
        image = (image.float() if image.dtype == torch.bfloat16 else image).numpy(force=True)
    if image.ndim not in (2, 3) or image.size == 0:
        return Unusable(f"{kind} is not one image")
    if image.ndim == 3:
        from transformers.image_utils import ChannelDimension, infer_channel_dimension_format

        try:
            channels = ChannelDimension(data_format) if data_format is not None else \
                infer_channel_dimension_format(image)
        except ValueError:
            return Unusable(f"{kind}: its channel axis cannot be told")
        if channels == ChannelDimension.FIRST:
            image = np.moveaxis(image, 0, -1)
        if image.shape[-1] not in (1, 3, 4):
            return Unusable(f"{kind} has {image.shape[-1]} channels")
        image = image[..., 0] if image.shape[-1] == 1 else image
    floating = np.issubdtype(image.dtype, np.floating)
    if not (floating or np.issubdtype(image.dtype, np.integer) or image.dtype == np.bool_):
        return Unusable(f"{kind} holds no pixel values")
    values = image.astype(np.float64)
    low, high = float(values.min()), float(values.max())
    if floating and do_rescale and 0.0 <= low and high <= 1.0:
        return Unusable(f"{kind} has float values in [0, 1], which do_rescale=True rescales again: pass "
                        "do_rescale=False to the processor, or uint8 images")
    values = values * (factor * 255.0 if do_rescale else 255.0)  # in the views' 0-255 units
    if values.min() < -0.5 or values.max() > 255.5:
        return Unusable(f"{kind} has values the processor does not read as 0-255 pixels "
                        f"({low:g} to {high:g}, do_rescale={do_rescale})")
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))


#: The dtypes a preprocessed pixel tensor is recorded under (:func:`_fingerprint`): a
#: generate() call may receive it cast to any of them.
_CASTS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

#: (from, to) casts that keep every value: a tensor cast this way is found by casting it
#: back (:func:`_probe`), so its digest need not be recorded (float64's was the costliest).
_WIDENING = {(torch.bfloat16, torch.float32), (torch.bfloat16, torch.float64),
             (torch.float16, torch.float32), (torch.float16, torch.float64), (torch.float32, torch.float64)}


def _digest(tensor: torch.Tensor) -> bytes:
    """SHA-256 of a host tensor's exact bytes, with its shape and dtype (SHA-256 because it
    is the fastest of hashlib's on CPUs with SHA instructions: 1 GB/s against blake2b's 0.6)."""
    digest = hashlib.sha256(repr((tuple(tensor.shape), str(tensor.dtype))).encode())
    digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.digest()


def _fingerprint(pixels: torch.Tensor, casts: tuple = ()) -> frozenset:
    """Digests of the exact bytes of ``pixels`` as it is and cast to each of ``casts`` that
    rounds (a widening cast is undone by :func:`_probe` instead): a copy cast to bf16 / fp16
    / fp64 or moved to another device is matched exactly (casts round the same on every
    device), and another image's pixels -- however close -- are not."""
    host = pixels.detach().to("cpu").contiguous()
    rounding = [c for c in casts if c != host.dtype and (host.dtype, c) not in _WIDENING]
    return frozenset(_digest(tensor) for tensor in (host, *(host.to(c) for c in rounding)))


def _probe(pixels: torch.Tensor) -> frozenset:
    """The digests under which ``pixels`` may have been recorded: its own, and, for every
    dtype it could have been widened from, that of the narrower tensor it casts back to
    exactly (checked bit for bit, so a value the narrow dtype cannot hold matches nothing)."""
    host = pixels.detach().to("cpu").contiguous()
    digests = {_digest(host)}
    for narrow in _CASTS:
        if (narrow, host.dtype) in _WIDENING and _round_trips(host.reshape(-1)[:4096], narrow):  # a cheap screen
            back = host.to(narrow)
            if _round_trips(host, narrow, back):
                digests.add(_digest(back))
    return frozenset(digests)


def _round_trips(values: torch.Tensor, narrow: torch.dtype, back: torch.Tensor | None = None) -> bool:
    back = values.to(narrow) if back is None else back
    return back.to(values.dtype).view(torch.uint8).equal(values.view(torch.uint8))


def _matches(probe: frozenset, recorded: frozenset) -> bool:
    return not probe.isdisjoint(recorded)


@dataclass(frozen=True)
class Original:
    """An image a preprocess call received, and the keyword settings of that call."""

    image: Image.Image
    settings: dict


def _same_image(a: Any, b: Any) -> bool:
    a, b = (x.image if isinstance(x, Original) else x for x in (a, b))
    return a is b or (isinstance(a, Image.Image) and isinstance(b, Image.Image) and a.size == b.size
                      and a.mode == b.mode and a.tobytes() == b.tobytes())


def _one(candidates: list) -> Original | Unusable | None:
    """A row's original among the images whose pixels it matched (the most recent
    first): None when none did; :class:`Unusable` when they are different images -- pixels
    that several images share (a detail lost to the resize) do not say which it is. The same
    image preprocessed with other settings has other pixels, so a match is one call's."""
    if not candidates:
        return None
    if all(_same_image(candidates[0], c) for c in candidates[1:]):
        return candidates[0]
    return Unusable(f"its pixels match {len(candidates)} different images the attached processor preprocessed, "
                    "so which one is its original is ambiguous")


def image_pixel_names(points: ModelPoints) -> tuple[str, ...]:
    """The adapter's pixel inputs that carry images (not videos, which are never verified)."""
    return tuple(name for name in points.pixel_inputs if "video" not in name)


def pixel_input(inputs, names: Sequence[str]):
    """The first of the pixel inputs ``names`` (:func:`image_pixel_names`) that ``inputs``
    holds, or None: the image a model call or a preprocess call carries, under whichever
    name the family's processor gives it (Video-LLaVA's returns ``pixel_values_images``)."""
    for name in names:
        if inputs.get(name) is not None:
            return inputs[name]
    return None


class OriginalImages:
    """The images of the last ``keep`` preprocess calls, each findable by its pixels.

    A later ``generate()`` finds its originals by matching its ``pixel_values`` exactly
    (:func:`_fingerprint`: a cast to bf16 / fp16 / fp64 or a move to another device is
    matched, any other change is not). Where the image processor returns one row per image
    (fixed grids, tiled LLaVA-NeXT), a preprocess call whose rows are the call's rows in the
    same order gives each row its own original -- position by position, so two images whose
    pixels differ by less than a cast's rounding, or not at all, are never swapped -- and
    otherwise each row is matched on its own among every recorded image: rows preprocessed
    one call at a time and stacked (``pipeline(..., batch_size=2)`` does this) or
    reordered are found too. A row whose pixels match several different images is
    ambiguous: :class:`Unusable`, never a guess. Where the processor flattens the patches of
    several images into one tensor (Qwen2-VL) the whole call's tensor must match."""

    def __init__(self, keep: int = 16, names: Sequence[str] = ("pixel_values",)) -> None:
        # per call: ("rows", a fingerprint per image) or ("whole", the tensor's), its images
        # (each as an Original: the PIL image and the call's preprocessing settings)
        self._seen: deque = deque(maxlen=keep)
        self.keep = keep
        # the fingerprints (not the images) of calls that fell out of ``_seen``: a miss on one
        # of them is told apart from pixels never preprocessed here, in the warning
        self._forgotten: deque = deque(maxlen=4096)
        self._pausing = threading.local()  # per thread: another thread's preprocess is still recorded
        self.names = tuple(names)  # the pixel inputs a preprocess call may return, first found read

    @property
    def paused(self) -> bool:
        """Whether this thread's preprocess calls are the views' own (not recorded): set by the
        verifying call, for its thread only -- a request preprocessed meanwhile in another
        thread must be found by its own generate() later."""
        return getattr(self._pausing, "on", False)

    @paused.setter
    def paused(self, value: bool) -> None:
        self._pausing.on = bool(value)

    def record(self, images: Any, out: Any, do_rescale: bool = True, factor: float = 1 / 255,
               data_format: Any = None, settings: dict | None = None) -> None:
        """Remember a preprocess call: its ``images`` (as PIL images, :func:`_as_pil`, with
        the call's rescaling), the pixels it returned (``out["pixel_values"]``, or the
        first of ``names`` it holds: Video-LLaVA's processor returns ``pixel_values_images``)
        and the keyword ``settings`` it was called with, which the views are preprocessed
        with again (:func:`preprocess_settings`)."""
        pixels = pixel_input(out, self.names) if hasattr(out, "get") else None
        if self.paused or not isinstance(pixels, torch.Tensor):
            return
        settings = dict(settings or {})
        if len(self._seen) == self.keep:  # the oldest call is dropped by the append below
            kind, fps, _ = self._seen[0]
            self._forgotten.extend(fps if kind == "rows" else [fps])
        flat = [Original(_as_pil(im, do_rescale, factor, data_format), settings) for im in _flat_images(images)]
        if pixels.dim() >= 2 and len(pixels) == len(flat):  # one row per image
            self._seen.append(("rows", [_fingerprint(row, _CASTS) for row in pixels], flat))
        else:
            self._seen.append(("whole", _fingerprint(pixels, _CASTS), flat))

    def forgotten(self, pixels: torch.Tensor) -> bool:
        """Whether ``pixels`` (or one of its rows) was preprocessed here in a call since dropped
        from the ``keep`` most recent ones."""
        if not self._forgotten:
            return False
        probes = [_probe(pixels)] + ([_probe(row) for row in pixels] if pixels.dim() >= 2 else [])
        return any(_matches(p, fp) for p in probes for fp in self._forgotten)

    def find(self, pixels: torch.Tensor) -> list[Image.Image | Unusable | None] | None:
        """Per image row of ``pixels``, its original (a PIL image), :class:`Unusable` (it
        cannot be cut, or is ambiguous) or None (not found); None when nothing matches."""
        found = self.find_originals(pixels)
        return None if found is None else [f.image if isinstance(f, Original) else f for f in found]

    def find_originals(self, pixels: torch.Tensor) -> list[Original | Unusable | None] | None:
        """:meth:`find`, each image with the settings of the preprocess call it came from."""
        calls = list(reversed(self._seen))  # the most recent first
        rows_calls = [(fps, images) for kind, fps, images in calls if kind == "rows"]
        if rows_calls and pixels.dim() >= 2:
            mine = [_probe(row) for row in pixels]
            in_order = [images for fps, images in rows_calls
                        if len(fps) == len(mine) and all(_matches(m, fp) for m, fp in zip(mine, fps))]
            found = []
            for row, digest in enumerate(mine):
                if in_order:  # the call that preprocessed exactly these rows, in this order
                    candidates = [images[row] for images in in_order]
                else:
                    candidates = [im for fps, images in rows_calls for fp, im in zip(fps, images) if _matches(digest, fp)]
                found.append(_one(candidates))
            if any(f is not None for f in found):
                return found
        wholes = [(fp, images) for kind, fp, images in calls if kind == "whole"]
        if wholes:
            mine = _probe(pixels)
            matched = [images for fp, images in wholes if _matches(mine, fp)]
            if matched:
                same = [images for images in matched if len(images) == len(matched[0])]
                return [_one([images[i] for images in same]) for i in range(len(matched[0]))]
        return None


def _same_settings(a: dict, b: dict) -> bool:
    """Whether two preprocess calls' settings agree (by ``repr`` where ``==`` is ambiguous:
    an array among them)."""
    try:
        return bool(a == b)
    except (ValueError, RuntimeError):
        return repr(a) == repr(b)


def one_setting(found: list | None) -> tuple[list | None, dict]:
    """The rows' originals (:meth:`OriginalImages.find_originals`) as images, and the one
    preprocessing setting their views are made with: the first found row's call's. A row
    whose original was preprocessed with other settings is :class:`Unusable` (answered
    unverified, said why): its views would get other token counts than its prompt holds."""
    if found is None:
        return None, {}
    first = next((f for f in found if isinstance(f, Original)), None)
    settings = first.settings if first is not None else {}
    images = []
    for f in found:
        if isinstance(f, Original) and not _same_settings(f.settings, settings):
            images.append(Unusable("its image was preprocessed with other settings than this call's other rows "
                                   f"({f.settings} vs {settings}); one call's views are preprocessed with one setting"))
        else:
            images.append(f.image if isinstance(f, Original) else f)
    return images, settings


#: keyword arguments of a preprocess call that are not settings to repeat for the views:
#: its data and what to return, and how the *caller's* inputs were given -- their layout and
#: value range: the views are PIL images in 0-255 (:func:`_as_pil` brings arrays and tensors
#: there), so a caller's ``do_rescale=False`` for [0, 1] tensors must not reach them (their
#: pixels reached the model 255 times too large)
_NOT_SETTINGS = ("images", "videos", "return_tensors", "input_data_format", "do_rescale", "rescale_factor")


def preprocess_settings(kwargs: dict) -> dict:
    """The keyword settings of a preprocess call to repeat when its images' views are
    preprocessed. A family's processor adds settings of its own at call time, which its image
    processor's saved config does not hold: InternVL's and Aya Vision's ``crop_to_patches=True``,
    Pixtral's (Mistral 3's) ``patch_size`` times the merge size, LLaVA-NeXT's ``do_pad`` --
    the views of such a call, preprocessed without them, got other token counts than the
    caller's prompt holds (1 tile instead of 7; 17 token rows instead of 18)."""
    return {k: v for k, v in kwargs.items() if k not in _NOT_SETTINGS}


def _row_inputs(kwargs: dict, rows: list[int], images: list[Image.Image], image_processor, device,
                settings: dict | None = None) -> dict:
    """The model inputs of ``rows`` of a call, with each row's image replaced by ``images``:
    per-token tensors (ids, masks, token types) are taken row by row, the pixel inputs are
    the image processor's output for the new images, with the ``settings`` of the preprocess
    call that made the caller's pixels (:func:`preprocess_settings`)."""
    ids = kwargs["input_ids"]
    with_pixels = dict(image_processor(images=[[im] for im in images], return_tensors="pt", **(settings or {})))
    out: dict = {}
    index = torch.tensor(rows, device=ids.device)
    for key, value in kwargs.items():
        if key in with_pixels:
            continue
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == ids.shape:
            out[key] = value.index_select(0, index.to(value.device))
    for key, value in with_pixels.items():
        if key in kwargs:  # only what the caller's call carried (the processor may return more)
            out[key] = value.to(device) if isinstance(value, torch.Tensor) else value
    return out


def _without_prior_tokens(views: dict, points: ModelPoints, tokenizer) -> dict:
    """``views`` with the prompt's belief / assertion tokens deleted from every row, as
    :meth:`CropVerify.answer` deletes those sentences from the text
    (:func:`mitigate.crop_verify.without_priors`): the same detector
    (:func:`mitigate.spans.find_prior_spans`) on the decoded prompt, the tokens it covers
    removed from the ids and from every per-token input, the rows left-padded again.

    Deleted, not masked: masking the span (context mode at strength 1) keeps the later
    tokens' positions, so the views would see the question further from the image than a
    prompt without the sentence puts it -- and the two routes would answer differently.
    For a word-level tokenizer (the organism) the rows equal the tokens of the stripped
    text; for a subword tokenizer a span's boundary tokens may differ from re-tokenising.
    Unchanged when no row has a span. One known difference: a prompt that is *only* a
    belief sentence keeps it in ``answer()`` (nothing else to ask), while here its row keeps
    only the chat template's tokens -- the caller's template cannot be told apart from the
    question in the ids."""
    from .prior import PriorSuppression

    ids = views["input_ids"]
    spans = PriorSuppression(tokenizer).span_mask(points, ids)
    if not bool(spans.any()):
        return views
    mask = views.get("attention_mask")
    keep = ~spans if mask is None else (mask.bool() & ~spans)
    per_token = {k: v for k, v in views.items() if isinstance(v, torch.Tensor) and v.shape == ids.shape}
    length = int(keep.sum(-1).max())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = dict(views)
    for key, value in per_token.items():
        fill = pad if key == "input_ids" else -100 if key == "labels" else 0  # labels: no target
        rows = []
        for row in range(ids.shape[0]):
            kept = value[row][keep[row].to(value.device)]
            # left padding: decoder-only generation continues from each row's last token
            rows.append(torch.nn.functional.pad(kept, (length - kept.shape[0], 0), value=fill))
        out[key] = torch.stack(rows)
    if mask is None and bool((keep.sum(-1) < length).any()):
        out["attention_mask"] = torch.stack(
            [torch.nn.functional.pad(torch.ones(int(n), dtype=torch.long, device=ids.device), (length - int(n), 0))
             for n in keep.sum(-1)])
    return out


def _replay(streamer, sequences: torch.Tensor, start: int) -> None:
    """Put ``sequences`` to ``streamer`` as ``generate()`` does: the prompt, each new step, end."""
    streamer.put(sequences[:, :start].cpu())
    for t in range(start, sequences.shape[1]):
        streamer.put(sequences[:, t].cpu())
    streamer.end()


def _by_name(model, args: tuple, kwargs: dict) -> dict:
    """A ``generate()`` call's arguments, every one by name: its positional arguments bound to
    the model's ``generate`` parameters (``generate(ids, GenerationConfig(...),
    logits_processor)``), as the model's own ``generate()`` would read them; a call it would
    refuse raises its ``TypeError``."""
    if not args:
        return dict(kwargs)
    import inspect

    from transformers import GenerationMixin

    signature = inspect.signature(type(model).generate)
    if any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
        # a wrapper's generate(self, *args, **kwargs) names nothing: read the arguments as the
        # generate() it passes them to does
        signature = inspect.signature(GenerationMixin.generate)
    bound = signature.bind(model, *args, **kwargs)
    out = {}
    for name, value in list(bound.arguments.items())[1:]:  # not self
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:  # **kwargs, **generate_kwargs
            out.update(value)
        else:
            out[name] = value
    return out


def _with_settings(kwargs: dict, **settings: Any) -> dict:
    """``kwargs`` with generation ``settings``: in a copy of the call's ``generation_config``
    where it passes one (transformers warns about a config and generation keywords in one
    call), else as keywords; a None setting is left out of the keywords (unset)."""
    config = kwargs.get("generation_config")
    if config is None:
        out = {**kwargs, **{k: v for k, v in settings.items() if v is not None}}
        for name in (k for k, v in settings.items() if v is None):
            out.pop(name, None)
        return out
    import copy

    config = copy.deepcopy(config)
    for name, value in settings.items():
        setattr(config, name, value)
    return {**{k: v for k, v in kwargs.items() if k not in settings}, "generation_config": config}


def _call_setting(kwargs: dict, model, name: str) -> Any:
    """A generation setting as this ``generate()`` call sees it: its keyword, else its
    ``generation_config``'s, else the model's."""
    if kwargs.get(name) is not None:
        return kwargs[name]
    for config in (kwargs.get("generation_config"), model.generation_config):
        if getattr(config, name, None) is not None:
            return getattr(config, name)
    return None


def _new_token_bounds(kwargs: dict, model, start: int) -> tuple[int | None, int | None]:
    """The call's most and fewest new tokens, as ``generate()`` derives them: ``max_new_tokens``
    (``min_new_tokens``) where set, else ``max_length`` (``min_length``, when positive) less
    the prompt's ``start`` tokens; None where neither is set."""
    cap = _call_setting(kwargs, model, "max_new_tokens")
    if cap is None:
        length = _call_setting(kwargs, model, "max_length")
        cap = None if length is None else max(0, int(length) - start)
    floor = _call_setting(kwargs, model, "min_new_tokens")
    if floor is None:
        length = _call_setting(kwargs, model, "min_length")
        floor = max(0, int(length) - start) if length else None
    return cap, floor


def _eos_ids(kwargs: dict, model) -> list[int]:
    """The end-of-sequence ids of this call (its own ``eos_token_id`` first)."""
    eos = _call_setting(kwargs, model, "eos_token_id")
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return [eos] if isinstance(eos, int) else list(eos or [])


def _through_eos(row: torch.Tensor, start: int, eos: list[int]) -> torch.Tensor:
    """``row`` up to and including its first end-of-sequence token after ``start`` (a view's
    row carries the view batch's padding after it; the caller's batch pads it again)."""
    if not eos:
        return row
    hits = torch.isin(row[start:], torch.tensor(eos, device=row.device)).nonzero()
    return row[: start + int(hits[0]) + 1] if len(hits) else row


def _ended(row: torch.Tensor, start: int, eos: list[int]) -> torch.Tensor:
    """``row`` closed with the end-of-sequence token if its answer (after ``start``) has
    none: a yes/no view's answer cut at its own token limit, shorter than the caller's, is
    a whole answer ("yes"), and the caller's row reads as one that ended."""
    if not eos or bool(torch.isin(row[start:], torch.tensor(eos, device=row.device)).any()):
        return row
    return torch.cat([row, row.new_tensor([eos[0]])])


def _pad_cat(rows: list[torch.Tensor], pad: int) -> torch.Tensor:
    length = max(r.shape[-1] for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, length - r.shape[-1]), value=pad) for r in rows])


class VerifiedGenerate:
    """The ``generate`` a :class:`mitigate.CropVerify` puts on the model while attached."""

    def __init__(self, cv, points: ModelPoints, generate: Callable, originals: OriginalImages) -> None:
        self.cv, self.points, self.generate, self.originals = cv, points, generate, originals
        self.model = points.model

    def __call__(self, *args: Any, **kwargs: Any):
        kwargs = _by_name(self.model, args, kwargs)
        args = ()
        if kwargs.get("inputs") is not None and kwargs.get("input_ids") is None:  # generate(inputs=ids), by name
            kwargs["input_ids"] = kwargs.pop("inputs")
        cv = self.cv
        ids, pixels = kwargs.get("input_ids"), pixel_input(kwargs, image_pixel_names(self.points))
        # as generate() reads them: the keyword, else the call's generation_config, else the
        # model's (a GenerationConfig leaves what it does not set to None, and generate() then
        # takes the model's: its num_beams=3 from generation_config.json applies)
        beams = _call_setting(kwargs, self.model, "num_beams") or 1
        returned = _call_setting(kwargs, self.model, "num_return_sequences") or 1
        if cv.tau >= 1.0:  # no view can reach the threshold: exactly the unmitigated generate()
            if ids is not None:  # counted as answer() counts them
                cv.stats["queries"] += ids.shape[0]
            return self.generate(*args, **kwargs)
        if ids is None:
            raise ValueError("crop-and-verify needs input_ids (it re-asks the views with the caller's own prompt tokens)")
        if pixels is None:
            raise ValueError("crop-and-verify needs an image: this generate() call has no pixel inputs "
                             f"({', '.join(image_pixel_names(self.points))})")
        if beams > 1 or returned > 1:
            asked = " and ".join(f"{k}={v}" for k, v in (("num_beams", beams), ("num_return_sequences", returned))
                                 if v > 1)
            raise ValueError(f"crop-and-verify verifies one answer per row; {asked} is not supported while it is "
                             "attached (detach it, or generate with one beam and one sequence)")
        streamer = kwargs.pop("streamer", None)
        want_dict = bool(_call_setting(kwargs, self.model, "return_dict_in_generate"))
        tok = cv.processor.tokenizer
        images, settings = one_setting(self.originals.find_originals(pixels))
        if images is not None:  # as answer() does: refuse images too small for views before any pass
            cv.check_view_size([im for im in images if isinstance(im, Image.Image)])
        # the gate and tau read the model's own first-step distribution (output_logits), not the
        # scores after the call's temperature / top-k / top-p: a sampling config (Qwen2-VL's
        # shipped top_k=1) would make every confidence 1 and verify nothing, silently
        first = _with_settings(kwargs, output_logits=True, return_dict_in_generate=True)
        captured, objects = {"maps": None}, None
        prompts = [tok.decode(row, skip_special_tokens=True) for row in ids]
        if cv.localizer is None:
            objects = [object_in_question(p) for p in prompts] if cv.needs_objects() else None
        if cv.localizer is None and cv.locate != "zoom":  # the rows' maps, captured at this very call's prefill
            with cv.capture(self.model, kwargs, objects) as captured:
                out = self.generate(**first)
        else:
            out = self.generate(**first)
        rows, start = ids.shape[0], ids.shape[1]
        texts = [t.strip() for t in tok.batch_decode(out.sequences[:, start:], skip_special_tokens=True)]
        probs = torch.softmax(out.logits[0].float(), dim=-1)
        confidence = emitted_probability(probs, out.sequences[:, start])
        cv.stats["queries"] += rows
        gated = cv.gate_rows(texts, confidence, prompts)
        if gated:
            gated = self._with_originals(gated, images, rows, pixels)
        boxes = None
        if gated and cv.localizer is None and cv.locate == "embedding":
            gated, _ = cv.located(gated, [captured["maps"][i] for i in gated])  # nothing named: unverified, counted
        elif gated and cv.localizer is None and cv.locate == "zoom":
            gated, boxes = cv.located(gated, self._zoom_boxes(kwargs, gated, [images[i] for i in gated],
                                                                    [prompts[i] for i in gated],
                                                                    [objects[i] for i in gated], settings))
        elif gated and objects is not None:
            # named by no question (answer() refuses them) or in words the tokenizer does not
            # know: queries="object" reads their last token instead; counted
            cv.not_found(sum(objects[i] is None for i in gated))
            cv.count_unnamed(gated, captured)
        if gated:
            first_sequences = out.sequences
            out.sequences = self._verify(kwargs, gated, [images[i] for i in gated], texts, confidence, out.sequences,
                                         captured["maps"], boxes, cache=output_cache(out), settings=settings)
            if output_cache(out) is not None and not torch.equal(out.sequences, first_sequences):
                # the cache holds the first pass's answers, an overturned one among them: a chat
                # continued over it would be conditioned on the answer thrown away. None: the
                # next turn recomputes its prefix from the returned sequences
                drop_output_cache(out)
        if streamer is not None:
            _replay(streamer, out.sequences, start)
        return out if want_dict else out.sequences

    def _with_originals(self, gated: list[int], images: list | None, rows: int,
                        pixels: torch.Tensor | None = None) -> list[int]:
        """The ``gated`` rows whose original image is known and can be cut; the others are
        answered unverified, counted in ``stats["no_original"]`` and warned about, saying why."""
        if images is None and pixels is not None and self.originals.forgotten(pixels):
            left, why = [], (f"they were preprocessed more than {self.originals.keep} preprocess calls before this "
                             "generate(), and only the originals of the last "
                             f"{self.originals.keep} are kept (CropVerify(..., keep_originals=N))")
        elif images is None:
            left, why = [], ("its pixels match no image the attached processor preprocessed in this process "
                             "(preprocess while attached and in this process -- not in DataLoader workers, "
                             "whose calls the attached processor never sees -- and pass its pixel_values "
                             "unchanged but for a cast or a move)")
        elif len(images) != rows:
            left, why = [], (f"its pixels hold {len(images)} images for {rows} rows; crop-and-verify cuts the "
                             "views of one image per row")
        else:
            left = [i for i in gated if isinstance(images[i], Image.Image)]
            reasons: dict[str, list[int]] = {}  # why -> its rows
            for i in gated:
                if i not in left:
                    reason = images[i].reason if isinstance(images[i], Unusable) else \
                        "its pixels match no image the attached processor preprocessed"
                    reasons.setdefault(reason, []).append(i)
            why = "; ".join(f"row{'s' * (len(r) > 1)} {', '.join(map(str, r))}: {reason}"
                            for reason, r in reasons.items())
        if len(left) < len(gated):
            self.cv.stats["no_original"] = self.cv.stats.get("no_original", 0) + len(gated) - len(left)
            warnings.warn(f"crop_verify: {len(gated) - len(left)} answer(s) of this generate() call are not verified: "
                          f"{why}", stacklevel=3)
        return left

    def _verify(self, kwargs, gated, images, texts, confidence, sequences, maps, boxes=None, cache=None,
                settings: dict | None = None) -> torch.Tensor:
        cv, model, tok = self.cv, self.model, self.cv.processor.tokenizer
        device = kwargs["input_ids"].device
        image_processor = cv.processor.image_processor
        self.originals.paused = True
        try:
            prompts = [tok.decode(kwargs["input_ids"][i], skip_special_tokens=True) for i in gated]
            if boxes is None:
                boxes = self._boxes(kwargs, maps, gated, images, prompts, cache, settings)
            asked = cv.asked_views()
            k = len(asked)
            built_all = [cv.view_boxes(image, box) for image, box in zip(images, boxes)]
            # resized to the original's size: the same number of image tokens, the same prompt ids
            # framed where the processor cuts a centre square, so that it keeps the whole view
            view_images = [view_image(image, built[v], shown) for image, built, shown
                           in zip(images, built_all, cv.shown(self.points, images, settings)) for v in asked]
            # a yes/no question's views answer with fewer tokens (CropVerify.view_tokens): one
            # generate() per token limit, each with its rows' inputs
            # the caller's limits as this call sees them (keyword, its generation_config, the model's)
            # max_length / min_length become new-token counts of this prompt: a view's prompt
            # may be shorter (strip_priors), and it must stop where the caller's answer would
            cap, floor = _new_token_bounds(kwargs, model, kwargs["input_ids"].shape[1])
            limits = [cv.view_tokens(answer_kind(texts[i], p), cap, floor) for i, p in zip(gated, prompts)]
            groups = {}
            for limit in dict.fromkeys(limits):
                queries = [j for j, other in enumerate(limits) if other == limit]
                groups[limit] = _row_inputs(kwargs, [gated[j] for j in queries for _ in asked],
                                            [view_images[j * k + v] for j in queries for v in range(k)],
                                            image_processor, device, settings)
        finally:
            self.originals.paused = False
        per_image = {*self.points.pixel_inputs, *self.points.image_inputs}

        def ask(queries: list[int], limit: int | None) -> list:
            views = groups[limit]
            if cv.strip_priors:
                views = _without_prior_tokens(views, self.points, tok)
            # not the caller's cache object: the first pass filled it with the caller's rows
            passthrough = {key: v for key, v in kwargs.items()
                           if key not in views and key not in per_image and key not in CACHE_NAMES}
            allowed = passthrough.get("prefix_allowed_tokens_fn")
            if allowed is not None:  # the caller's per-row constraint, by the caller's row of each view
                owners = [gated[j] for j in queries for _ in range(k)]
                passthrough["prefix_allowed_tokens_fn"] = lambda row, ids: allowed(owners[row], ids)
            settings = {"output_logits": True, "return_dict_in_generate": True}
            if limit is not None:  # the limit says it; max_length beside it would warn
                settings.update(max_new_tokens=limit, max_length=None)
            if floor:
                settings.update(min_new_tokens=floor if limit is None else min(floor, limit), min_length=None)
            vout = self.generate(**_with_settings({**passthrough, **views}, **settings))
            answers = vout.sequences[:, views["input_ids"].shape[1]:]
            vtexts = [t.strip() for t in tok.batch_decode(answers, skip_special_tokens=True)]
            vprobs = torch.softmax(vout.logits[0].float(), dim=-1)
            return [(t, p, a, limit, c) for t, p, a, c in zip(vtexts, vprobs, answers,
                                                              emitted_probability(vprobs, answers[:, 0]))]

        items = ask_by_limit(limits, k, ask)
        start = kwargs["input_ids"].shape[1]
        eos = _eos_ids(kwargs, model)
        rows = list(sequences)
        for j, (i, box, built) in enumerate(zip(gated, boxes, built_all)):
            result = {"answer": texts[i], "first_answer": texts[i], "confidence": float(confidence[i]),
                      "verified": False, "views": {}}
            views = items[j * k : (j + 1) * k]
            cv._decide(result, box, built, [v[0] for v in views], torch.stack([v[1] for v in views]), prompts[j],
                       confidence=torch.stack([v[4] for v in views]))
            if result.get("chosen") is not None:  # the caller's prompt, then the chosen view's answer
                _, _, answer, limit, _ = views[asked.index(result["chosen"])]
                row = _through_eos(torch.cat([sequences[i, :start], answer.to(sequences.device)]), start, eos)
                shortened = limit is not None and (cap is None or limit < cap)  # cut by the view's own limit
                rows[i] = _ended(row, start, eos) if shortened else row
        pad = getattr(model.generation_config, "pad_token_id", None)
        pad = tok.pad_token_id if pad is None else pad
        return _pad_cat([r.to(sequences.device) for r in rows], int(pad if pad is not None else 0))

    def _zoom_boxes(self, kwargs: dict, gated: list[int], images: list[Image.Image], prompts: list[str],
                    objects: list[str | None], settings: dict | None = None) -> list:
        """``locate="zoom"``'s boxes for the gated rows, the tiles asked with the caller's own
        prompt ids and preprocessing ``settings`` (as the views are); None where no object is named."""
        cv = self.cv
        device = kwargs["input_ids"].device

        def tile_inputs(rows, tile_images):
            return _row_inputs(kwargs, [gated[r] for r in rows], tile_images, cv.processor.image_processor, device,
                               settings)

        self.originals.paused = True
        try:
            return cv.zoom_boxes(self.model, images, prompts, objects, tile_inputs=tile_inputs, settings=settings)
        finally:
            self.originals.paused = False

    def _boxes(self, kwargs: dict, maps, gated: list[int], images: list[Image.Image], prompts: list[str],
               cache=None, settings: dict | None = None) -> list[tuple]:
        """The gated rows' boxes: the caller's detector, or the maps captured at the first
        pass's prefill (:meth:`mitigate.CropVerify.boxes_from_capture`)."""
        if self.cv.localizer is not None:
            return self.cv.detector_boxes(images, prompts)
        return self.cv.boxes_from_capture(self.model, kwargs, maps, gated, images, cache=cache, settings=settings)


def attach_verified_generate(cv, points: ModelPoints, group: HookGroup) -> None:
    """Patch the processor's ``preprocess`` and the model's ``generate`` (owned by ``group``)."""
    image_processor = cv.processor.image_processor
    originals = OriginalImages(keep=cv.keep_originals, names=image_pixel_names(points))
    preprocess = image_processor.preprocess

    def remembering(images, *args, **kwargs):
        out = preprocess(images, *args, **kwargs)

        def setting(name, default):  # as this call reads it: its keyword, else the processor's own
            value = kwargs.get(name)
            value = getattr(image_processor, name, None) if value is None else value
            return default if value is None else value

        originals.record(images, out, do_rescale=bool(setting("do_rescale", True)),
                         factor=float(setting("rescale_factor", 1 / 255)), data_format=kwargs.get("input_data_format"),
                         settings=preprocess_settings(kwargs))
        return out

    group.patch_attribute(image_processor, "preprocess", remembering)
    # transformers serialises an image processor from its instance __dict__ (to_dict: repr,
    # print, save_pretrained), where the patch lives: leave the patches out, as if unattached
    own_to_dict = image_processor.to_dict

    def to_dict(*args, **kwargs):
        out = own_to_dict(*args, **kwargs)
        for name in ("preprocess", "to_dict"):
            out.pop(name, None)
        return out

    group.patch_attribute(image_processor, "to_dict", to_dict)
    from .base import OneCallAtATime

    serial = group.patched(points.model, "generate")
    if isinstance(serial, OneCallAtATime):  # this attach()'s lock around it: verify inside it (the
        # whole verified call, views included, is one call); the lock's patch restores generate on detach
        serial.inner = VerifiedGenerate(cv, points, serial.inner, originals)
    else:
        group.patch_attribute(points.model, "generate", VerifiedGenerate(cv, points, points.model.generate, originals))
