"""Where is the queried object? The model's own attention, normalised as ViCrop does.

ViCrop (Zhang et al., ICLR 2025): the attention from the last prompt token to the image
tokens, at a middle layer, divided elementwise by the same map for a generic prompt (so
regions every prompt attends to cancel out); then the window of a few sizes that holds the
most of that ratio is the object's box.

Only the chosen layers compute attention weights, and only for the query positions read:
:class:`hooks.capture.AttentionCapture` recomputes them from the queries and keys each
chosen layer's attention call receives, leaving the call (sdpa, eager, flash) and the
model's output untouched. So the maps can come from a forward of their own
(:func:`image_attention_maps`) or ride along the caller's ``generate()`` at its prefill
(:func:`arm` before, :func:`captured_maps` after) -- which is how crop-and-verify
localises without an extra pass over the question.

Two extensions, both off by default (ViCrop's choices are the defaults):

* ``queries`` -- whose attention is read: ViCrop's ``"last"`` token, the mean over the
  ``"question"`` (the text after the image), or the ``"object"``: the tokens that name the
  queried object (:func:`object_token_mask`; the object is given by the caller or read
  from the question by :func:`object_in_question`). A model that matches image tokens
  against the words of the question does so at the word, not at the last token.
* ``heads`` -- how the heads of the chosen layers are combined: ViCrop's ``"mean"``, or
  ``"peak"``: per query, the one head whose image-attention map puts the largest share on a
  single image token (:func:`select_heads`). This is a per-query, label-free reading of
  Kang et al., "Your Large Vision-Language Model Only Needs A Few Attention Heads for Visual
  Grounding" (CVPR 2025, arXiv 2503.06287), who find that a few *localization heads* --
  heads that attend to the image and whose map is spatially concentrated -- ground the
  referred object while the head mean is a blur. They pick heads once, over a dataset, by
  image-attention sum and spatial entropy; with no dataset at inference time we pick per
  query, by the peak share (a concentration criterion computed from the one query's map).

Measured on the organism (a 4-layer decoder; 100 held-out scenes of the localisation
probes, seeds disjoint from every suite; a hit is a window covering half the object's box;
``python -m evaluators.organism.localisation -n 100 --layers 0 --queries ... --heads ...
--generic ...``, chance = the same window size placed at random): ViCrop's default (last
token, head mean, layers 1-2) hits 5% (chance 6.8%). At layer 0, without the generic row:
the object's tokens with the peak head 61% (chance 6.8%; 64% and 6.9% on 100 other scenes,
``--seed 1000070000``), with the head mean 43% (11.1%), the last token with the peak head
25% (6.8%); the object's tokens with the peak head and ViCrop's ratio 55% (6.8%). That
model appears to match an image patch to the question's object word in its first layer,
in one or two heads; its last token reads the word rather than the image.

Image tokens map back to the image through the adapter's token layout
(:mod:`hooks.layout`): square grids (with or without a CLS token), Qwen's and Pixtral's
dynamic resolution, LLaVA-NeXT / OneVision AnyRes (base image + unpadded high-resolution
grid, newline tokens left out) and Idefics3 / SmolVLM / InternVL tiles with their
thumbnail; :func:`region_heat` paints each region's map onto the image. A layout that
cannot account for a row's image tokens (several images in one row, Gemma 3's
pan-and-scan crops) raises a clear error: pass boxes from a detector instead.
"""

from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch
from torch import nn

import re

from hooks import HookGroup, ModelPoints, resolve
from hooks.capture import AttentionCapture
from hooks.layout import FULL, Region, content_indices, within

GENERIC_PROMPT = "describe the image ."  # ViCrop: "Write a general description of the image."


def default_layers(points: ModelPoints) -> list[int]:
    """ViCrop's choice: a middle layer (and its neighbour for small models). In a hybrid
    decoder (attention in some layers only), the two attention layers nearest those; layers
    that reuse an earlier layer's keys (Gemma 4's KV-shared ones, which compute only the last
    query at generate()'s prefill) are passed over while others remain."""
    n = points.num_layers
    middle = sorted({max(0, n // 2 - 1), n // 2})
    shared = set(points.kv_shared_layers)
    usable = [i for i in points.attention_layers if i not in shared] or points.attention_layers
    if all(i in usable for i in middle):
        return middle
    return sorted(sorted(usable, key=lambda i: (min(abs(i - m) for m in middle), i))[:2])


#: Which prompt positions' attention is read: ViCrop's last token, the mean over the text
#: after the (last) image -- the question and the generation prompt --, or the tokens that
#: name the queried object.
QUERIES = ("last", "question", "object")
#: How the heads of the chosen layers are combined: ViCrop's mean, or the single most
#: concentrated head per query (Kang et al. 2025, read per query; see the module docstring).
HEADS = ("mean", "peak")

# where a question names its object: "is there a dog", "are there any red cups", "how many
# forks", "what colour is the ball", "where is the bench", "in which image is the bird";
# articles and quantifiers are not part of the name
_OBJECT_PATTERNS = tuple(re.compile(p, re.I) for p in (
    r"\b(?:is|are)\s+there\s+(?:(?:an?|any|some|the|one|two|three|\d+)\s+)?(?P<object>[a-z][a-z \-]*?)\s+"
    r"(?:in|on|visible|present|at|inside|within)\b",
    r"\bhow\s+many\s+(?P<object>[a-z][a-z \-]*?)\s+(?:are|is|can|do|does|in|on)\b",
    r"\bwhat\s+colou?r\s+(?:is|are)\s+(?:the|a|an)\s+(?P<object>[a-z][a-z \-]*?)\s*(?:\?|$|\s+in\b|\s+on\b)",
    r"\bwhere\s+(?:is|are)\s+(?:the|a|an)\s+(?P<object>[a-z][a-z \-]*?)\s*(?:\?|$|\s+in\b)",
    r"\bin\s+which\s+image\s+(?:is|are)\s+(?:there\s+)?(?:the|a|an)?\s*(?P<object>[a-z][a-z \-]*?)\s*(?:\?|$)",
))


#: Words the patterns above can take for a name when the name itself is missing.
_NOT_OBJECTS = frozenset({"a", "an", "the", "any", "some", "one", "two", "three"})


def object_in_question(prompt: str) -> str | None:
    """The object a question asks about ("Is there a dog in the image?" -> "dog"), or None.

    The *last* question of the prompt decides (a belief sentence before it may name the same
    object; the attention read is the question's)."""
    best = None
    for pattern in _OBJECT_PATTERNS:
        for match in pattern.finditer(prompt):
            if match.group("object").strip().lower() in _NOT_OBJECTS:
                continue  # "is there an in the image": the name was lost (a tokenizer's unknown word)
            if best is None or match.start() > best.start():
                best = match
    return best.group("object").strip() if best else None


def name_matches(phrase: str, text: str) -> list[re.Match]:
    """Where ``phrase`` occurs in ``text`` as whole words (case-insensitive)."""
    return list(re.finditer(r"(?<!\w)" + re.escape(phrase.strip()) + r"(?!\w)", text, re.I))


def object_token_mask(tokenizer, points: ModelPoints, input_ids: torch.Tensor,
                      objects: Sequence[str | None], strict: bool = True) -> torch.Tensor:
    """``(batch, seq)`` mask of the tokens of each row's object phrase, at its last
    occurrence in the row's text (case-insensitive, whole words). A row whose object is None
    gets an all-False row (its last token is read instead). A phrase that is not in its
    row's text is a ``ValueError`` naming it -- or, with ``strict=False`` (phrases read from
    the questions of a whole batch, where a tokenizer may have turned a word into an
    unknown token), an all-False row too."""
    from .spans import Span, decode_with_offsets, spans_to_mask

    if len(objects) != input_ids.shape[0]:
        raise ValueError(f"objects: {len(objects)} given for {input_ids.shape[0]} rows")
    skip = {i for i in (points.image_token_id, points.video_token_id) if i is not None}
    skip |= set(getattr(tokenizer, "all_special_ids", []) or [])
    mask = torch.zeros(input_ids.shape, dtype=torch.bool)
    for row, phrase in enumerate(objects):
        if phrase is None:
            continue
        if not isinstance(phrase, str) or not phrase.strip():
            raise ValueError(f"objects: row {row} has {phrase!r}; expected a non-empty string or None")
        text, offsets = decode_with_offsets(tokenizer, input_ids[row].tolist(), skip)
        found = name_matches(phrase, text)
        if not found and not strict:
            continue
        if not found:
            raise ValueError(f"objects: {phrase!r} does not occur in the prompt of row {row}: {text!r}")
        last = found[-1]
        mask[row] = spans_to_mask(offsets, [Span(last.start(), last.end(), last.group(0), "object")],
                                  input_ids.shape[1])
    return mask.to(input_ids.device)


def _question_weights(inputs: dict, image: torch.Tensor) -> torch.Tensor:
    """``(batch, seq)`` weights summing to 1 per row over the text after the last image."""
    ids = inputs["input_ids"]
    pos = torch.arange(ids.shape[1], device=ids.device)
    last_image = torch.where(image, pos, torch.full_like(pos, -1)).amax(dim=1, keepdim=True)
    w = (pos[None, :] > last_image).float()
    mask = inputs.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        w = w * mask.to(w.device).float()
    return w / w.sum(dim=1, keepdim=True).clamp(min=1.0)


def _query_weights(inputs: dict, image: torch.Tensor, queries: str, object_mask: torch.Tensor | None):
    """``(batch, seq)`` weights over the query positions whose attention is read, or None for
    the last token only. Under ``"object"`` a row without object tokens reads its last token."""
    if queries == "question":
        return _question_weights(inputs, image)
    if queries != "object":
        return None
    if object_mask is None:
        raise ValueError("queries='object' needs object_mask (object_token_mask(...)): which tokens name the object")
    ids = inputs["input_ids"]
    if object_mask.shape != ids.shape:
        raise ValueError(f"object_mask has shape {tuple(object_mask.shape)}, input_ids {tuple(ids.shape)}")
    w = object_mask.to(ids.device).float()
    w[w.sum(dim=1) == 0, -1] = 1.0  # no object named: the last token, as ViCrop
    return w / w.sum(dim=1, keepdim=True)


@torch.no_grad()
def image_attention_maps(model: nn.Module, inputs: dict, layers: Sequence[int] | None = None,
                         queries: str = "last", object_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per batch row, a ``(len(layers) * heads, n_image_tokens)`` tensor: each chosen layer's
    heads' attention from the query positions (``queries``, :data:`QUERIES`) to the row's
    image tokens, in ``input_ids`` order."""
    if queries not in QUERIES:
        raise ValueError(f"queries must be one of {QUERIES}, got {queries!r}")
    points = resolve(model)
    capture = AttentionCapture(points, layers if layers is not None else default_layers(points))
    arm(capture, inputs, queries, object_mask)
    # Under an attached contrast mitigation (VCD, prior suppression's output mode) the
    # forward also runs the branches, appended after the original rows: the capture keeps
    # the original rows only.
    capture_until_done(capture, lambda: model(**inputs, use_cache=False))
    return captured_maps(capture, inputs)


class StopForward(Exception):
    """Ends a forward that only localises once what it reads has been captured (after the
    last captured layer, :func:`capture_until_done`; at the decoder's input,
    :func:`mitigate.localize_embedding.capture_embeddings`)."""


def capture_until_done(capture: AttentionCapture, forward) -> None:
    """Run ``forward()`` (a forward that only localises) with the armed ``capture`` attached,
    and end it once the last captured layer's attention has run: the later decoder layers
    and the LM head's logits at every position would be thrown away -- on a 7B model with
    ViCrop's middle layers, about half the decoder and a ``(positions x vocabulary)``
    product. The hooks are removed whatever happens."""
    last = max(capture.layers)

    def stop(index, module, args, kwargs, output):
        if not capture.wants(last):  # every chosen layer has recorded: nothing later is read
            raise StopForward

    with HookGroup("localize") as group:
        capture.attach(group)
        capture.points.add_hook(group, "attention.output", stop, layers=[last])
        try:
            forward()
        except StopForward:
            pass


def arm(capture: AttentionCapture, inputs: dict, queries: str = "last",
        object_mask: torch.Tensor | None = None) -> None:
    """Arm ``capture`` for the next forward over ``inputs`` (the query positions of
    ``queries``, :data:`QUERIES`): call before the model (or its ``generate()``) runs."""
    if queries not in QUERIES:
        raise ValueError(f"queries must be one of {QUERIES}, got {queries!r}")
    ids = inputs["input_ids"]
    image = capture.points.image_token_mask(ids)
    capture.arm(ids.shape[0], ids.shape[1], _query_weights(inputs, image, queries, object_mask))


@contextlib.contextmanager
def capture_first_pass(model: nn.Module, inputs: dict, *, layers: Sequence[int] | None = None, queries: str = "last",
                       objects: Sequence[str | None] | None = None, tokenizer=None, strict: bool = True):
    """Capture the localisation maps of ``inputs``' rows at the prefill of whatever runs the
    model inside the block -- typically the caller's own ``generate()``, whose output the
    capture leaves unchanged. Yields a dict whose ``"maps"`` (per row, ``(layers * heads,
    n_image_tokens)``, as :func:`image_attention_maps`) is filled when the block ends.
    ``queries="object"`` needs ``objects`` (one phrase or None per row) and the ``tokenizer``;
    ``strict`` is :func:`object_token_mask`'s. ``"unnamed"`` lists the rows whose phrase was
    not found among their tokens (read at their last token, as a row without a phrase)."""
    points = resolve(model)
    capture = AttentionCapture(points, layers if layers is not None else default_layers(points))
    object_mask = None
    if queries == "object":
        if objects is None or tokenizer is None:
            raise ValueError("queries='object' needs objects (one per row) and the tokenizer")
        object_mask = object_token_mask(tokenizer, points, inputs["input_ids"], objects, strict)
    result: dict = {"unnamed": [] if object_mask is None else
                    [row for row, o in enumerate(objects) if o is not None and not bool(object_mask[row].any())]}
    with HookGroup("localize:first-pass") as group:
        group.keep_generate_uncompiled(points.model)  # a compiled step would keep the capture (hooks.compiled)
        capture.attach(group)
        arm(capture, inputs, queries, object_mask)
        yield result
    result["maps"] = captured_maps(capture, inputs)


def captured_maps(capture: AttentionCapture, inputs: dict) -> list[torch.Tensor]:
    """Per row of ``inputs``, the captured ``(layers * heads, n_image_tokens)`` maps."""
    image = capture.points.image_token_mask(inputs["input_ids"])
    attention = capture.take()  # (rows, layers * heads, seq)
    return [attention[row][:, image[row].to(attention.device)] for row in range(attention.shape[0])]


def last_token_image_attention(model: nn.Module, inputs: dict, layers: Sequence[int] | None = None,
                               queries: str = "last", object_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per batch row, the attention (mean over heads and ``layers``) from the last token
    (``queries="question"``: mean over the text after the image; ``"object"``: over the
    tokens of ``object_mask``) to each of the row's image tokens, in ``input_ids`` order."""
    return [m.mean(dim=0) for m in image_attention_maps(model, inputs, layers, queries, object_mask)]


def _content(maps: torch.Tensor, content: int | torch.Tensor) -> torch.Tensor:
    """The columns of ``maps`` that hold image content: after ``content`` leading tokens (an
    int, e.g. 1 for CLS), or at the indices given (:func:`hooks.layout.content_indices`,
    which leaves out CLS and newline tokens)."""
    if isinstance(content, int):
        return maps[:, content:]
    return maps[:, content.to(maps.device)]


def peak_head(maps: torch.Tensor, content: int | torch.Tensor = 0) -> int:
    """Index of the head of a ``(heads, n_image_tokens)`` stack whose map (over the content
    tokens, see :func:`_content`) puts the largest share of its image attention on one token."""
    grid = _content(maps, content).float()
    share = grid.max(dim=1).values / grid.sum(dim=1).clamp(min=1e-12)
    return int(share.argmax())


def select_heads(maps: torch.Tensor, content: int | torch.Tensor = 0, heads: str = "mean",
                 generic: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(map, generic_map)`` from ``(heads, n_image_tokens)`` stacks of a query and of its
    generic prompt (or None): both head means (``"mean"``, ViCrop), or both maps of the
    query's :func:`peak_head` (``"peak"``), so the ratio compares a head with itself."""
    if heads not in HEADS:
        raise ValueError(f"heads must be one of {HEADS}, got {heads!r}")
    if heads == "mean":
        return maps.mean(dim=0), None if generic is None else generic.mean(dim=0)
    h = peak_head(maps, content)
    return maps[h], None if generic is None else generic[h]


#: Relative gap under which two windows' scores are a tie (float64 rounding of one sum of
#: heat is ~1e-13 relative; a real difference in the heat under two windows is far larger).
TIE = 1e-9


def best_window(heat: torch.Tensor, width: int, height: int, sizes: Sequence[float] = (0.25, 0.4, 0.6)) -> tuple:
    """The square window (side = each fraction of the short side) holding the largest mean
    of ``heat`` (a grid upsampled to the image), as ``(x0, y0, x1, y1)`` in pixels.

    Windows overlap heavily, so near-equal scores are common (two windows covering the same
    heat cells). The integral image is summed in float64 -- in float32 its rounding over an
    image's pixels was larger than the gap between the best windows, so the same heat gave
    different boxes batched and alone -- and scores within :data:`TIE` (relative) of the
    best of all sizes count as tied: the first in (size, y, x) order wins. A NaN score (NaN
    or infinite heat) never wins; with no finite window the box is the whole image."""
    up = torch.nn.functional.interpolate(heat[None, None].float(), size=(height, width), mode="nearest")[0, 0]
    integral = torch.nn.functional.pad(up.double().cumsum(0).cumsum(1), (1, 0, 1, 0))
    windows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = []
    for frac in sizes:  # every window of a size at once
        side = max(1, int(round(frac * min(width, height))))
        stride = max(1, side // 4)
        if side > height or side > width:
            continue
        ys = torch.arange(0, height - side + 1, stride, device=integral.device)
        xs = torch.arange(0, width - side + 1, stride, device=integral.device)
        total = (integral[ys + side][:, xs + side] - integral[ys][:, xs + side]
                 - integral[ys + side][:, xs] + integral[ys][:, xs])
        scores = (total / (side * side) * math.sqrt(frac)).flatten()  # favour larger windows on ties
        windows.append((scores.nan_to_num(nan=-math.inf), ys, xs, side))
    finite = [float(w[0].max()) for w in windows if bool(torch.isfinite(w[0]).any())]
    if not finite:
        return (0.0, 0.0, float(width), float(height))
    top = max(finite)
    for scores, ys, xs, side in windows:  # the first tied best in (size, y, x) order
        hits = (scores >= top - TIE * abs(top)).nonzero()
        if len(hits):
            k = int(hits[0])
            y, x = int(ys[k // len(xs)]), int(xs[k % len(xs)])
            return (float(x), float(y), float(x + side), float(y + side))
    return (0.0, 0.0, float(width), float(height))


def region_heat(query: torch.Tensor, generic: torch.Tensor | None, regions: Sequence[Region], width: int,
                height: int, eps: float = 1e-6, max_side: int = 512, normalise: bool = True,
                shown: tuple[float, float, float, float] = FULL) -> torch.Tensor:
    """ViCrop's ratio map -- ``query / generic`` attention per image token, or ``query``
    alone without a generic map -- painted onto the image through the layout's regions
    (:mod:`hooks.layout`), on a canvas of the image's aspect ratio (long side at most
    ``max_side``; :func:`best_window` scales it to the image).

    With several regions, each region's map is divided by its own mean before painting, and where regions overlap
    (a thumbnail under its tiles, LLaVA-NeXT's base image under the high-resolution grid)
    the normalised maps are averaged. ViCrop has one grid and says nothing here; the mean
    normalisation is our choice so that a region's weight does not depend on how many
    tokens it has or how much attention its tokens share (the thumbnail's few tokens each
    draw more attention than one of many tiles' tokens). A one-region layout is painted as
    it is (the division would change no window, but could flip a near-tie by rounding).
    ``normalise=False`` paints every region as it is (values that are comparable across
    regions and images, such as cosine similarities). ``shown`` is the part of the image the
    processor's output holds (:func:`hooks.layout.visible_box`: a CLIP processor's centre
    crop); the regions cover it, and the rest of the image, which the model never saw, has
    no heat (0)."""
    scale = min(1.0, max_side / max(width, height))
    canvas_w, canvas_h = max(1, round(width * scale)), max(1, round(height * scale))
    total = torch.zeros(canvas_h, canvas_w)
    count = torch.zeros(canvas_h, canvas_w)
    for region in within(list(regions), shown):
        idx = region.indices().to(query.device)
        values = query[idx].float()
        if generic is not None:
            values = values / (generic[idx].float() + eps)
        if len(regions) > 1 and normalise:
            values = values / values.mean().clamp(min=eps)
        values = values.cpu()
        x0, y0, x1, y1 = region.box
        left, top = round(x0 * canvas_w), round(y0 * canvas_h)
        right, bottom = max(left + 1, round(x1 * canvas_w)), max(top + 1, round(y1 * canvas_h))
        painted = torch.nn.functional.interpolate(values[None, None], size=(bottom - top, right - left), mode="nearest")
        # a padded crop reaches past the image: only the part on the canvas is painted
        cl, ct, cr, cb = max(left, 0), max(top, 0), min(right, canvas_w), min(bottom, canvas_h)
        if cl >= cr or ct >= cb:
            continue
        total[ct:cb, cl:cr] += painted[0, 0, ct - top : cb - top, cl - left : cr - left]
        count[ct:cb, cl:cr] += 1
    sx0, sy0, sx1, sy1 = shown
    inside = (slice(max(0, round(sy0 * canvas_h)), min(canvas_h, round(sy1 * canvas_h))),
              slice(max(0, round(sx0 * canvas_w)), min(canvas_w, round(sx1 * canvas_w))))
    if not bool((count[inside] > 0).all()):
        raise ValueError("the layout's regions do not cover the part of the image the model was shown")
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros(()))


@torch.no_grad()
def attention_boxes(model: nn.Module, inputs: dict, sizes: Sequence[tuple[int, int]], *,
                    layers: Sequence[int] | None = None, queries: str = "last", heads: str = "mean",
                    object_mask: torch.Tensor | None = None, generic_rows: bool = True,
                    generic_inputs: dict | None = None, shown: Sequence[tuple] | None = None) -> list[tuple]:
    """The queried object's box, ``(x0, y0, x1, y1)`` in original pixels, for each query of
    ``inputs`` (one image per row; ``sizes`` the original ``(width, height)`` per query).

    With ``generic_rows`` the rows come in pairs -- the query, then the same image under the
    generic prompt -- and the map is ViCrop's ratio; ``generic_inputs`` gives those generic
    rows as a separate batch instead (one row per query, e.g. when the queries' inputs come
    from the caller's ``generate()``); with neither, the map is the query's attention alone.
    The generic rows are read at their last token (or their question, under
    ``queries="question"``). Heads are combined by ``heads`` (:func:`select_heads`), the map
    is painted through the adapter's token layout (:func:`region_heat`) and the window
    holding most of it is the box (:func:`best_window`); ``shown``: per query, the part of its
    image the processor showed (:func:`hooks.layout.visible_box`)."""
    per = 2 if generic_rows and generic_inputs is None else 1
    rows = inputs["input_ids"].shape[0]
    if rows != per * len(sizes):
        raise ValueError(f"{rows} rows for {len(sizes)} queries" + (" (query, generic) pairs" if per == 2 else ""))
    maps = image_attention_maps(model, inputs, layers, queries, object_mask)
    generic_maps = None
    if generic_inputs is not None:
        if generic_inputs["input_ids"].shape[0] != len(sizes):
            raise ValueError(f"generic_inputs: {generic_inputs['input_ids'].shape[0]} rows for {len(sizes)} queries")
        generic_maps = image_attention_maps(model, generic_inputs, layers, generic_queries(queries))
    elif per == 2:
        generic_maps, maps = maps[1::2], maps[0::2]
    return boxes_from_maps(resolve(model), maps, inputs, [per * i for i in range(len(sizes))], sizes, heads=heads,
                           generic_maps=generic_maps, shown=shown)


def generic_queries(queries: str) -> str:
    """Where the generic prompt's attention is read: its last token (or its question, under
    ``queries="question"``) -- it names no object."""
    return "last" if queries == "object" else queries


def boxes_from_maps(points: ModelPoints, maps: Sequence[torch.Tensor], inputs: dict, rows: Sequence[int],
                    sizes: Sequence[tuple[int, int]], *, heads: str = "mean",
                    generic_maps: Sequence[torch.Tensor] | None = None,
                    shown: Sequence[tuple] | None = None) -> list[tuple]:
    """Boxes from captured maps: query ``i``'s ``(layers * heads, n_image_tokens)`` map
    ``maps[i]`` belongs to row ``rows[i]`` of ``inputs`` (for its token layout) and to an
    original image of ``sizes[i]``; ``generic_maps[i]`` is its generic prompt's map (ViCrop's
    ratio) or absent. Heads are combined by ``heads`` (:func:`select_heads`), the map is
    painted through the adapter's token layout (:func:`region_heat`; ``shown[i]``: the part of
    image ``i`` the processor showed, :func:`hooks.layout.visible_box`, default all of it) and
    the window holding most of it is the box (:func:`best_window`)."""
    if shown is not None and len(shown) != len(maps):
        raise ValueError(f"{len(maps)} maps, {len(shown)} shown boxes")
    if not len(maps) == len(rows) == len(sizes) or (generic_maps is not None and len(generic_maps) != len(maps)):
        raise ValueError(f"{len(maps)} maps, {len(rows)} rows, {len(sizes)} sizes"
                         + ("" if generic_maps is None else f", {len(generic_maps)} generic maps"))
    boxes = []
    for i, (row, (width, height)) in enumerate(zip(rows, sizes)):
        regions = points.token_regions(maps[i].shape[-1], inputs, row, (width, height))
        generic = None if generic_maps is None else generic_maps[i]
        if generic is not None and generic.shape != maps[i].shape:
            raise ValueError(f"query {i}: the generic prompt's image has {generic.shape[-1]} tokens, the query's "
                             f"{maps[i].shape[-1]}")
        query, generic = select_heads(maps[i], content_indices(regions), heads, generic)
        heat = region_heat(query, generic, regions, width, height, shown=FULL if shown is None else shown[i])
        boxes.append(best_window(heat, width, height))
    return boxes
