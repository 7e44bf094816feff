"""Where is the queried object? The image tokens whose embedding is nearest its name's.

A VLM's projector maps every image patch into the language model's input space, where the
prompt's word embeddings live, and its alignment training (LLaVA's stage 1, "feature
alignment") pulls a patch that shows a dog towards the embedding of "dog". So the patches
of the queried object can be read off the decoder's input: the cosine similarity between
each image token's embedding and the mean embedding of the prompt tokens that name the
object (:func:`mitigate.localize.object_token_mask` finds them), shifted so that
the least similar image token of the row is 0, is a heat map; the window holding most of
it (:func:`mitigate.localize.best_window`, through the adapter's token layout) is the box.

Reading object identity off image-token positions follows Neo et al., "Towards
Interpreting Visual Information Processing in Vision-Language Models" (ICLR 2025,
arXiv 2410.07149), who find object information localised at the object's own image
tokens and read it with the logit lens. The logit lens needs the decoder's later layers and
output head; we read the *input* embeddings against the *input* word embeddings, which
needs nothing but what the first pass already computes: the embeddings are captured by a
pre-hook on the decoder stack (``language_model.input``) at the prefill of the caller's
own forward or ``generate()``, so localising costs no extra pass (ViCrop's attention ratio
costs one forward of a generic prompt). The shift to a zero minimum is our choice: cosine
similarities are signed, and :func:`mitigate.localize.region_heat` and the window search
expect non-negative heat.

**Zoomed search** (``CropVerify(locate="zoom")``, :func:`tile_boxes`, :func:`peak_box`):
an object smaller than a patch barely moves its token, so the same similarity is read on
``zoom_grid`` x ``zoom_grid`` tiles of the image, each cut and resized to the image's size
as a view is, in a forward that stops at the decoder's input (:func:`embedding_maps`: the
vision tower and projector run, the decoder does not); the box is a square of
:data:`ZOOM_SIDE` of the short side around the most similar token of all tiles. Tiling is
how high-resolution VLMs (LLaVA-NeXT's AnyRes, Idefics3's tiles) see small things at their
encoder's resolution; here it only serves to find the object.

Measured on organism v17 (``python -m evaluators.organism.localisation -n 100 --locate
embedding|zoom``, a hit is a window covering half the object's box): on 100 held-out scenes
the whole-image map hits 94% and the zoomed search 88% (chance 7-11%); on DO-Bench's
A-objects (3-10 px of 128, ``--probe dobench``) 37.5% and 75%, ViCrop's attention 0%
(``docs/results/crop_verify_locate.md``). Its limits: a model whose projector output does
not live near the word embeddings (the modality gap can be large in contrastively trained
towers) gives a flat or misleading map; a prompt that does not name the object gives no
map at all.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch
from torch import nn

from hooks import HookGroup, ModelPoints, resolve

from .localize import StopForward, region_heat

#: The zoomed search's window side, as a fraction of the image's short side (our choice: the
#: smallest of :func:`mitigate.localize.best_window`'s sizes; DO-Bench's small objects are
#: 3-10 px of a 128 px image, so a 32 px window with the Crop view's margin holds them).
ZOOM_SIDE = 0.25


def similarity_maps(embeds: torch.Tensor, image_mask: torch.Tensor, object_mask: torch.Tensor,
                    shift: bool = True) -> list[torch.Tensor | None]:
    """Per row, a ``(1, n_image_tokens)`` heat map: the cosine similarity of each image
    token's embedding (``embeds``: ``(rows, seq, dim)``, the decoder's input) to the mean
    embedding of the row's object tokens (``object_mask``), minus its minimum over the row
    (``shift=False``: the similarities themselves, comparable across rows). None for a row
    whose ``object_mask`` is empty (nothing names the object)."""
    if embeds.shape[:2] != image_mask.shape or object_mask.shape != image_mask.shape:
        raise ValueError(f"embeddings {tuple(embeds.shape)}, image mask {tuple(image_mask.shape)} and object mask "
                         f"{tuple(object_mask.shape)} do not agree")
    maps: list[torch.Tensor | None] = []
    for row in range(embeds.shape[0]):
        named = object_mask[row].to(embeds.device)
        if not bool(named.any()):
            maps.append(None)
            continue
        image = embeds[row][image_mask[row].to(embeds.device)].float()
        if image.shape[0] == 0:  # a text-only row of a mixed batch
            maps.append(None)
            continue
        target = embeds[row][named].float().mean(dim=0, keepdim=True)
        heat = torch.nn.functional.cosine_similarity(image, target, dim=-1)
        maps.append((heat - heat.min() if shift else heat)[None])
    return maps


@contextlib.contextmanager
def capture_embeddings(model: nn.Module, inputs: dict, object_mask: torch.Tensor, *, shift: bool = True,
                       stop: bool = False):
    """Capture the decoder's input embeddings of ``inputs``' rows at the first forward run
    inside the block (the prefill of the caller's ``generate()``, whose output is left
    unchanged) and yield a dict whose ``"maps"`` -- per row, :func:`similarity_maps`' heat
    for the tokens of ``object_mask`` (``(rows, seq)``, e.g.
    :func:`mitigate.localize.object_token_mask`) -- is filled when the block ends. Under an
    attached contrast mitigation the forward also carries the branches' rows, appended
    after the caller's: only the caller's rows are kept. ``shift``: :func:`similarity_maps`'.
    ``stop=True`` ends the forward once the embeddings are read -- the decoder layers never
    run -- for a forward that is only there to localise."""
    points = resolve(model)
    ids = inputs["input_ids"]
    if object_mask.shape != ids.shape:
        raise ValueError(f"object_mask has shape {tuple(object_mask.shape)}, input_ids {tuple(ids.shape)}")
    seen: dict = {}

    def record(module, args, kwargs):
        if "embeds" in seen:  # the decoding steps after the prefill
            return None
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise ValueError(f"{points.model_type}: the decoder was not called with inputs_embeds, so the image "
                             "tokens' embeddings cannot be read; use CropVerify(locate='attention')")
        seen["embeds"] = embeds[: ids.shape[0]].detach()
        if stop:
            raise StopForward
        return None

    result: dict = {}
    with HookGroup("localize:embeddings") as group:
        group.keep_generate_uncompiled(points.model)  # a compiled step would keep the capture (hooks.compiled)
        points.add_hook(group, "language_model.input", record)
        try:
            yield result
        except StopForward:
            pass
    if "embeds" not in seen:
        raise ValueError("no forward ran inside capture_embeddings(): nothing was captured")
    embeds = seen["embeds"]
    if embeds.shape[1] != ids.shape[1]:
        raise ValueError(f"the decoder's input has {embeds.shape[1]} positions, input_ids {ids.shape[1]}")
    result["maps"] = similarity_maps(embeds, points.image_token_mask(ids), object_mask, shift)


@torch.no_grad()
def embedding_maps(model: nn.Module, inputs: dict, object_mask: torch.Tensor, shift: bool = True) -> list[torch.Tensor | None]:
    """:func:`capture_embeddings`' maps from a forward of their own over ``inputs``, ended at
    the decoder's input (the vision tower and projector run, the decoder does not)."""
    with capture_embeddings(model, inputs, object_mask, shift=shift, stop=True) as captured:
        model(**inputs, use_cache=False)
    return captured["maps"]


def tile_boxes(width: int, height: int, grid: int) -> list[tuple[float, float, float, float]]:
    """The ``grid`` x ``grid`` tiles of a ``width`` x ``height`` image, row by row."""
    if not isinstance(grid, int) or grid < 1:
        raise ValueError(f"zoom_grid must be a positive integer, got {grid!r}")
    return [(j * width / grid, i * height / grid, (j + 1) * width / grid, (i + 1) * height / grid)
            for i in range(grid) for j in range(grid)]


def peak_box(points: ModelPoints, maps: Sequence[torch.Tensor], inputs: dict, rows: Sequence[int],
             tiles: Sequence[tuple], size: tuple[int, int], side: float = ZOOM_SIDE) -> tuple[float, float, float, float]:
    """The zoomed search's box in an image of ``size``: ``maps[i]`` is the unshifted
    similarity map (:func:`similarity_maps`, ``shift=False``) of the view of tile
    ``tiles[i]`` (cut from the image and resized to ``size``, as the views are), which is
    row ``rows[i]`` of ``inputs`` (for its token layout). Each map is painted onto its view
    through the layout (:func:`mitigate.localize.region_heat`, on similarity + 1 so the heat
    is positive, not normalised per region, so that tiles compare by similarity; where a
    layout's regions overlap -- a thumbnail under tiles -- they are averaged); the most
    similar place over all tiles -- the centre of the pixels holding
    the largest value -- is the centre of a square of ``side`` times the short side, moved
    inside the image. A peak, not :func:`best_window`'s densest window: an object smaller
    than a patch lights one token, which a window's mean dilutes among its neighbours. Each
    tile's view is framed so that the processor keeps the whole tile
    (:func:`mitigate.crop_verify.view_image`), so its map covers the tile."""
    width, height = size
    best = None
    for heat, row, (x0, y0, x1, y1) in zip(maps, rows, tiles):
        regions = points.token_regions(heat.shape[-1], inputs, row, size)
        canvas = region_heat(heat[0].float() + 1.0, None, regions, width, height, normalise=False)
        top = float(canvas.max())
        if best is not None and top <= best[0]:
            continue
        ys, xs = (canvas == top).nonzero(as_tuple=True)
        rows_, cols = canvas.shape
        cx = x0 + (float(xs.float().mean()) + 0.5) / cols * (x1 - x0)
        cy = y0 + (float(ys.float().mean()) + 0.5) / rows_ * (y1 - y0)
        best = (top, cx, cy)
    if best is None:
        raise ValueError("peak_box: no tile maps")
    length = side * min(width, height)
    left = min(max(0.0, best[1] - length / 2), width - length)
    upper = min(max(0.0, best[2] - length / 2), height - length)
    return (float(left), float(upper), float(left + length), float(upper + length))
