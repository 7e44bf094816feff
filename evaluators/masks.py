"""Segmentation answers: masks from text (boxes, polygons, run-length encodings) and from
models that return masks, in one form the runner can store and the metrics can read.

What a model may answer (checked in this order):

* a **run-length-encoded mask** -- COCO's uncompressed RLE as JSON,
  ``{"size": [height, width], "counts": [...]}``: run lengths over the mask in column-major
  (Fortran) order, starting with a run of 0s (possibly of length 0). This is also how a
  *returned* mask is stored: :func:`encode_mask` turns an array / PIL image / tensor into
  that JSON, so every answer in ``samples.jsonl`` stays a string and a rerun can re-score
  it. Compressed (string) COCO counts need pycocotools and are refused with a clear error.
* a **polygon** -- JSON ``[[x, y], [x, y], ...]`` (3 or more points, pixels), COCO's flat
  ``[x1, y1, x2, y2, ...]``, several polygons in either form (their union), or
  ``{"polygon": ...}`` / ``{"polygons": ...}`` wrapping any of these. Filled with PIL's polygon fill (boundary pixels
  included), on a grid of the ``shape`` the caller gives (the HalluSegBench protocol passes
  the ground-truth mask's shape, which is the asked image's size in its data and suite).
* a **box** -- coordinate tokens ``<c3> <c5> <c9> <c12>``, PaliGemma's ``<loc....>`` tokens,
  or ``[x0, y0, x1, y1]`` / ``(x0,y0),(x1,y1)`` in the model's coordinate frame
  (:func:`evaluators.answers.parse_box`, :mod:`evaluators.box_frames`), filled ``[y0:y1, x0:x1]``.
* an **abstention** (:func:`~evaluators.answers.parse_box`'s rule): **"none"** / **"no"** as the
  first word, an empty JSON list, or -- given the asked object -- a sentence that draws no
  box and denies that object ("There is no dog in the image"): an empty mask, a valid answer
  (HalluSegBench scores abstention on the counterfactual as right).

Anything else is unreadable: an empty mask that is counted invalid. So is a box or
polygon that covers no pixel of the image (a box with its corners out of order or beyond
the image's edge, a polygon entirely off the image; PIL's fill draws even a degenerate
polygon's boundary pixels, so one on the image is readable): it names a region that is not there, which is not an abstention, and scoring it as
one would give a model that emits malformed boxes HalluSegBench's best leakage scores. Until
session 38 those came back as valid empty masks (an audit: random coordinate tokens scored
73% "abstentions" and no invalid answer).

A mask whose size differs from the ground truth's is resized with nearest neighbour by
the metrics (:func:`evaluators.benchmarks.hallusegbench.metrics.resize_nearest`), as the
HalluSegBench scripts do.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

import numpy as np

from .answers import after_reasoning, parse_box
from .box_frames import DEFAULT_FRAME


def as_mask(value: Any) -> np.ndarray:
    """A 2-D boolean mask from a numpy array, PIL image or torch tensor (``> 0``; leading
    singleton dimensions such as ``(1, H, W)`` are squeezed)."""
    if hasattr(value, "mode") and hasattr(value, "convert"):  # PIL
        value = np.asarray(value.convert("L"))
    elif hasattr(value, "detach") and hasattr(value, "cpu"):  # torch
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    while array.ndim > 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2 or array.size == 0:
        raise ValueError(f"a mask must be 2-D (height, width) and non-empty, got shape {array.shape}")
    return array > 0


def encode_mask(value: Any) -> str:
    """``value`` (array / PIL image / tensor) as COCO uncompressed-RLE JSON text."""
    mask = as_mask(value)
    flat = mask.flatten(order="F").astype(np.int8)
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts = [0, *counts]
    return json.dumps({"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}, separators=(",", ":"))


def decode_rle(rle: dict) -> np.ndarray:
    """COCO uncompressed RLE -> boolean ``(height, width)`` mask."""
    size, counts = rle.get("size"), rle.get("counts")
    if isinstance(counts, str):
        raise ValueError("compressed COCO RLE (string counts) is not supported: decode it with pycocotools "
                         "and return the mask, or send uncompressed counts")
    if (not isinstance(size, (list, tuple)) or len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size)
            or not isinstance(counts, (list, tuple)) or not all(isinstance(c, int) and c >= 0 for c in counts)):
        raise ValueError("RLE must be {'size': [height, width], 'counts': [non-negative ints]}")
    height, width = size
    if sum(counts) != height * width:
        raise ValueError(f"RLE counts sum to {sum(counts)}, the size {height}x{width} needs {height * width}")
    values = np.zeros(len(counts), dtype=bool)
    values[1::2] = True
    flat = np.repeat(values, counts)
    return flat.reshape((height, width), order="F")


def fill_polygons(polygons: Sequence[Sequence[Sequence[float]]], shape: Sequence[int]) -> np.ndarray:
    """The union of filled polygons (pixel coordinates) on a ``(height, width)`` grid."""
    from PIL import Image, ImageDraw

    height, width = (int(s) for s in shape)
    canvas = Image.new("1", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for poly in polygons:
        draw.polygon([(float(x), float(y)) for x, y in poly], fill=1, outline=1)
    return np.asarray(canvas, dtype=bool)


def _polygons(value: Any) -> list | None:
    """``value`` as a list of polygons (each >= 3 ``[x, y]`` points), or None."""
    if isinstance(value, dict):
        value = value.get("polygons", value.get("polygon"))
    if not isinstance(value, list) or not value:
        return None

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def is_point(p: Any) -> bool:
        return isinstance(p, list) and len(p) == 2 and all(number(v) for v in p)

    def flat(p: Any) -> bool:  # COCO's segmentation form: [x1, y1, x2, y2, ...]
        return isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 and all(number(v) for v in p)

    if flat(value):
        value = [value]
    value = [[poly[i : i + 2] for i in range(0, len(poly), 2)] if flat(poly) else poly for poly in value]
    if all(is_point(p) for p in value):
        value = [value]
    if all(isinstance(poly, list) and len(poly) >= 3 and all(is_point(p) for p in poly) for poly in value):
        return value
    return None


_DECODER = json.JSONDecoder()
_OPENER = re.compile(r"[\[{]")


def _json_values(text: str) -> list:
    """Every outermost JSON object or array in ``text`` that parses, in order.

    ``json.JSONDecoder.raw_decode`` parses from each ``[`` / ``{`` and says where the value
    ends, so brackets inside JSON strings (``{"label": "a]"}``) cannot cut a value short."""
    found, pos = [], 0
    while True:
        match = _OPENER.search(text, pos)
        if match is None:
            return found
        try:
            value, end = _DECODER.raw_decode(text, match.start())
        except (ValueError, RecursionError):  # RecursionError: brackets nested ~1000 deep
            pos = match.start() + 1  # not JSON here: look inside it
            continue
        found.append(value)
        pos = end


def answer_mask(answer: Any, shape: Sequence[int], frame: str = DEFAULT_FRAME,
                subject: str | Sequence[str] | None = None, empty_abstains: bool = False) -> tuple[np.ndarray, bool]:
    """``(mask, invalid)`` for a segmentation answer asked on an image of ``shape``
    (``(height, width)``, or an int for a square image). The returned mask has the RLE's own
    size for RLE answers, ``shape`` otherwise. ``frame``: the coordinate frame of a box
    written as numbers (:mod:`evaluators.box_frames`; polygons are read in pixels);
    ``subject``: the object asked for (or its names), whose denial in prose abstains;
    ``empty_abstains``: an empty answer is an abstention (PaliGemma's "detect" answers
    nothing when it finds nothing: :mod:`evaluators.grounding_formats`), else unreadable."""
    height, width = (shape, shape) if isinstance(shape, int) else (int(shape[0]), int(shape[1]))
    empty = np.zeros((height, width), dtype=bool)
    if answer is None:
        return empty, True
    if not isinstance(answer, str):  # a returned mask that was not encoded yet
        try:
            return as_mask(answer), False
        except ValueError:
            return empty, True
    answer = after_reasoning(answer)  # a reasoning model's think block is no answer
    if answer is None:  # cut off while thinking: nothing was answered
        return empty, True
    if empty_abstains and not answer.strip():
        return empty, False
    for value in _json_values(answer):
        if isinstance(value, dict) and "counts" in value:
            try:
                return decode_rle(value), False
            except ValueError:
                return empty, True
        polygons = _polygons(value)
        if polygons is not None:
            filled = fill_polygons(polygons, (height, width))
            return filled, not filled.any()
    box = parse_box(answer, width, height=height, frame=frame, subject=subject)
    if box == "none":
        return empty, False
    if isinstance(box, tuple):
        x0, y0, x1, y1 = (int(round(v)) for v in box)
        empty[max(y0, 0) : max(min(y1, height), 0), max(x0, 0) : max(min(x1, width), 0)] = True
        return empty, not empty.any()
    return empty, True


__all__ = ["answer_mask", "as_mask", "decode_rle", "encode_mask", "fill_polygons"]
