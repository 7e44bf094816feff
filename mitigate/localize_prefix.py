"""ViCrop's generic-prompt maps from the first answer's cached prompt prefix.

ViCrop (Zhang et al., ICLR 2025, Sec. 3) divides the question's attention map by the map
of a generic prompt over the same image (:data:`mitigate.localize.GENERIC_PROMPT`). Both
prompts open with the same tokens -- the chat template's start and the image tokens -- and
where the decoder attends causally over the prompt, those positions' keys and values do not
depend on the text after them. The first answer's ``generate()`` has already computed them
(its KV cache), so the generic map needs only the generic prompt's own tokens run over that
cache, cut after the last image token: on the organism about a tenth of the positions of a
full forward, on a model with hundreds of image tokens far less.

The generic tokens get the positions that follow each row's own prefix, counted from its
first real token, as ``generate()`` counts them for the cache it returns (the cache of a
plain forward over left-padded rows, which counts from the padding, is not what this
expects). The result equals a full forward's maps (float tolerance;
``tests/test_crop_verify.py``, every architecture where it applies). :func:`generic_maps_from_cache` returns None -- and
the caller runs the full forward, :func:`mitigate.localize.image_attention_maps` -- where
reuse would not be exact or cannot be checked:

* the adapter's ``causal_image_prefix`` is false (PaliGemma's prefix-LM attends
  bidirectionally over image and prompt, so the image tokens' states depend on the
  question) or its positions are multimodal RoPE (Qwen2/2.5/3-VL: text positions after an
  image depend on its grid, kept in model state), or the decoder is hybrid (Qwen3.5: a
  linear-attention layer's recurrent state holds the whole prompt and cannot be cut back
  to the image's end);
* the cache is not a plain :class:`~transformers.DynamicCache` of full layers on the
  model's devices (a sliding window may have dropped the image's first tokens; an
  offloaded cache keeps its layers elsewhere), or it holds more rows than the
  prompt (a contrast mitigation's branches), or a hook group acts on the model's forward
  (:func:`hooks.groups_on`: another mitigation might act on the short forward differently
  than on a full one);
* a row's real tokens are not contiguous, a generic row is right-padded, the generic
  prompt's prefix differs from the question's up to the last image token, its pixel inputs
  differ from the question's (one token layout, another image), or the generic prompts'
  own tokens differ in length between rows.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from transformers import DynamicCache

from hooks import groups_on, resolve
from hooks.cache import cache_parameter
from hooks.capture import AttentionCapture

from .localize import QUERIES, _query_weights, capture_until_done, captured_maps, default_layers


def _real_span(mask: torch.Tensor | None, row: int, length: int) -> tuple[int, int] | None:
    """``[start, end)`` of a row's real tokens, or None if they are not contiguous."""
    if mask is None:
        return 0, length
    real = mask[row].bool().nonzero().flatten()
    if len(real) == 0 or int(real[-1] - real[0]) + 1 != len(real):
        return None
    return int(real[0]), int(real[-1]) + 1


def _same_pixels(points, inputs: dict, rows: Sequence[int], generic_inputs: dict) -> bool:
    """Whether the generic rows' pixel inputs are exactly those of ``rows`` of the first pass
    (same token ids do not mean the same image on a fixed-grid model). Per row where a pixel
    input has one entry per prompt; else only for the whole batch in its order."""
    for key in (*points.pixel_inputs, *points.image_inputs):
        if (key in inputs) != (key in generic_inputs):
            return False
        if key not in inputs:
            continue
        mine, theirs = inputs[key], generic_inputs[key]
        if not isinstance(mine, torch.Tensor) or not isinstance(theirs, torch.Tensor):
            return False
        if mine.shape[0] == inputs["input_ids"].shape[0] and theirs.shape[0] == len(rows):
            mine = mine[list(rows)]
        elif list(rows) != list(range(inputs["input_ids"].shape[0])):
            return False
        if mine.shape != theirs.shape or not torch.equal(mine, theirs.to(mine.device)):
            return False
    return True


@torch.no_grad()
def generic_maps_from_cache(model: nn.Module, cache, inputs: dict, rows: Sequence[int], generic_inputs: dict,
                            layers: Sequence[int] | None = None, queries: str = "last") -> list[torch.Tensor] | None:
    """Per entry of ``rows`` (rows of ``inputs``, the first pass whose ``cache`` this is), the
    ``(layers * heads, n_image_tokens)`` map of the matching row of ``generic_inputs`` (the
    generic prompt over the same image), as :func:`mitigate.localize.image_attention_maps`
    gives it -- or None where reuse does not apply (module docstring)."""
    if queries not in QUERIES:
        raise ValueError(f"queries must be one of {QUERIES}, got {queries!r}")
    points = resolve(model)
    adapter = points.adapter
    if adapter.multimodal_rope or not adapter.causal_image_prefix or adapter.linear_attention:
        return None  # a hybrid decoder's recurrent state cannot be cut back to the image's end
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False) or any(cache.is_sliding):
        return None  # an offloaded cache keeps its layers on another device; a window may have dropped the image
    if groups_on(model):
        return None
    ids, mask = inputs["input_ids"], inputs.get("attention_mask")
    gids, gmask = generic_inputs["input_ids"], generic_inputs.get("attention_mask")
    if gids.shape[0] != len(rows) or not cache.layers or cache.layers[0].keys.shape[0] != ids.shape[0]:
        return None
    if not _same_pixels(points, inputs, rows, generic_inputs):
        return None
    image, gimage = points.image_token_mask(ids), points.image_token_mask(gids)
    spans, suffixes = [], []
    for j, row in enumerate(rows):
        span, gspan = _real_span(mask, row, ids.shape[1]), _real_span(gmask, j, gids.shape[1])
        if span is None or gspan is None or not bool(image[row].any()):
            return None
        if gspan[1] != gids.shape[1]:  # a right-padded generic row: a full forward reads its padding
            return None
        end = int(image[row].nonzero().max()) + 1  # the cached prefix ends at the last image token
        gend = int(gimage[j].nonzero().max()) + 1 if bool(gimage[j].any()) else -1
        prefix = ids[row, span[0] : end]
        if gend - gspan[0] != len(prefix) or not torch.equal(gids[j, gspan[0] : gend].to(prefix.device), prefix):
            return None
        spans.append((span[0], end))
        suffixes.append(gids[j, gend : gspan[1]])
    if len({len(s) for s in suffixes}) != 1 or len(suffixes[0]) == 0:
        return None
    longest = max(end - start for start, end in spans)
    n_suffix = len(suffixes[0])
    device = ids.device

    capture = AttentionCapture(points, layers if layers is not None else default_layers(points))
    # the prefix of each row, right-aligned under left padding, as keys / values and as ids;
    # only the layers the forward reaches before it stops (capture_until_done)
    new_cache = DynamicCache()
    for index, layer in enumerate(cache.layers[: max(capture.layers) + 1]):
        keys, values = (t.new_zeros(len(rows), t.shape[1], longest, t.shape[3]) for t in (layer.keys, layer.values))
        for j, ((start, end), row) in enumerate(zip(spans, rows)):
            keys[j, :, longest - (end - start) :] = layer.keys[row, :, start:end]
            values[j, :, longest - (end - start) :] = layer.values[row, :, start:end]
        new_cache.update(keys, values, index)
    # padding of the key layout: a text id (the generic prompt's first own token), never an image token
    key_ids = torch.full((len(rows), longest + n_suffix), int(suffixes[0][0]), dtype=ids.dtype, device=device)
    key_mask = torch.zeros_like(key_ids)
    for j, ((start, end), row) in enumerate(zip(spans, rows)):
        key_ids[j, longest - (end - start) : longest] = ids[row, start:end]
        key_mask[j, longest - (end - start) :] = 1
        key_ids[j, longest:] = suffixes[j].to(device)
    layout = {"input_ids": key_ids, "attention_mask": key_mask}
    lengths = torch.tensor([end - start for start, end in spans], device=device)
    position_ids = lengths[:, None] + torch.arange(n_suffix, device=device)[None, :]

    weights = _query_weights(layout, points.image_token_mask(key_ids), queries, None)
    capture.arm(len(rows), n_suffix, None if weights is None else weights[:, longest:], prefix=longest)
    extra = {}
    if "token_type_ids" in generic_inputs:  # Gemma3: the suffix is text
        extra["token_type_ids"] = torch.zeros_like(key_ids[:, longest:])
    capture_until_done(capture, lambda: model(
        input_ids=key_ids[:, longest:], attention_mask=key_mask, position_ids=position_ids,
        **{cache_parameter(model.forward)[0] or "past_key_values": new_cache}, use_cache=True, **extra))
    # the capture holds (rows, layers x heads, longest + n_suffix): read it through the key layout
    return captured_maps(capture, layout)
