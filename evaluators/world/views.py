"""DO-Bench's PerceptionAbility views -- Full, Cluster, Crop -- as box geometry.

DO-Bench (Sec. 3.2, "Evidence concentration") cuts two views from the same scene: *Cluster*
keeps the target and its immediate surrounding objects, *Crop* isolates the target "with
a consistent margin rule"; Table 3 reports margins of 10% and 20%. The paper does not
spell the rule out, so these are our choices, used by the evaluators and by the
crop-and-verify mitigation alike:

* **margin**: the box grows by ``margin x width`` on the left and right and
  ``margin x height`` on the top and bottom (so 10% adds 20% to each dimension);
* **square**: the grown box is then widened along its shorter side to a square, centred,
  because VLM processors resize to a fixed aspect and a non-square crop would distort the
  object; it is shifted (not shrunk) to stay inside the image, and only clipped when the
  square would be larger than the image;
* **neighbours** (Cluster): objects whose box gap to the target is at most
  ``neighbour_radius x max(target width, height)``; the cluster box is the union of the
  target and those boxes, then margin and square as above. With no neighbour in reach the
  Cluster view is the target box grown by ``2 x neighbour_radius`` of its size per side
  (still strictly more context than Crop), shifted like the square to stay inside the image.

All boxes are ``(x0, y0, x1, y1)`` floats in the source image's pixels, ``x1``/``y1``
exclusive. Views are cut from the original, full-resolution image, never from the model's
resized input.
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable, Sequence

from PIL import Image

Box = tuple[float, float, float, float]
MARGINS = (0.1, 0.2)


def check_margin(margin: float) -> float:
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not 0.0 <= margin <= 1.0:
        raise ValueError(f"margin must be a fraction in [0, 1] (DO-Bench uses 0.1 and 0.2), got {margin!r}")
    return float(margin)


def check_box(box: Sequence[float], width: int, height: int, argument: str = "box") -> Box:
    if len(box) != 4:
        raise ValueError(f"{argument} must be (x0, y0, x1, y1), got {box!r}")
    x0, y0, x1, y1 = (float(v) for v in box)
    if not (x1 > x0 and y1 > y0):
        raise ValueError(f"{argument} {box!r} is empty (need x1 > x0 and y1 > y0)")
    if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
        raise ValueError(f"{argument} {box!r} is outside the {width}x{height} image")
    return (x0, y0, x1, y1)


def _shift_inside(box: Box, width: int, height: int) -> Box:
    """``box`` shifted (not shrunk) to lie inside the image; clipped only on an axis where it
    is longer than the image."""
    out = []
    for lo, hi, limit in ((box[0], box[2], width), (box[1], box[3], height)):
        s = min(hi - lo, float(limit))
        start = min(max((lo + hi) / 2 - s / 2, 0.0), limit - s)
        out.append((start, start + s))
    (nx0, nx1), (ny0, ny1) = out
    return (nx0, ny0, nx1, ny1)


def _square_inside(box: Box, width: int, height: int) -> Box:
    x0, y0, x1, y1 = box
    half = max(x1 - x0, y1 - y0) / 2
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    return _shift_inside((cx - half, cy - half, cx + half, cy + half), width, height)


def grow(box: Box, margin: float, width: int, height: int, *, square: bool = True) -> Box:
    """``box`` grown by ``margin`` of its size on each side, squared, kept inside the image."""
    margin = check_margin(margin)
    x0, y0, x1, y1 = check_box(box, width, height)
    w, h = x1 - x0, y1 - y0
    grown = (x0 - margin * w, y0 - margin * h, x1 + margin * w, y1 + margin * h)
    if square:
        return _square_inside(grown, width, height)
    return (max(grown[0], 0.0), max(grown[1], 0.0), min(grown[2], width), min(grown[3], height))


def crop_box(target: Box, width: int, height: int, margin: float = 0.1) -> Box:
    """DO-Bench's Crop view: the target with a margin."""
    return grow(target, margin, width, height)


def coverage(window: Box, box: Box) -> float:
    """Share of ``box``'s area inside ``window`` (1.0: wholly inside, 0.0: disjoint)."""
    ix = max(0.0, min(window[2], box[2]) - max(window[0], box[0]))
    iy = max(0.0, min(window[3], box[3]) - max(window[1], box[1]))
    area = (box[2] - box[0]) * (box[3] - box[1])
    return ix * iy / area if area > 0 else 0.0


def _gap(a: Box, b: Box) -> float:
    dx = max(b[0] - a[2], a[0] - b[2], 0.0)
    dy = max(b[1] - a[3], a[1] - b[3], 0.0)
    return max(dx, dy)


def neighbours(target: Box, others: Iterable[Box], neighbour_radius: float = 1.0) -> list[Box]:
    """The boxes of ``others`` within ``neighbour_radius`` times the target's longer side of
    it (gap between the boxes along the axis where they are furthest apart; touching or
    overlapping boxes are at 0): the "immediate neighbours" :func:`cluster_box` takes into the
    Cluster view. DO-Bench gives no distance; one object size is our choice, so that a
    neighbour would fit between the two."""
    if isinstance(neighbour_radius, bool) or not isinstance(neighbour_radius, numbers.Real) \
            or not math.isfinite(neighbour_radius) or not neighbour_radius > 0:
        raise ValueError(f"neighbour_radius must be a positive number, got {neighbour_radius!r}")
    reach = neighbour_radius * max(target[2] - target[0], target[3] - target[1])
    return [tuple(b) for b in others if _gap(target, b) <= reach]


def cluster_box(
    target: Box, others: Iterable[Box], width: int, height: int, margin: float = 0.1,
    neighbour_radius: float = 1.0,
) -> Box:
    """DO-Bench's Cluster view: the target and its immediate neighbours, with a margin.
    ``others`` are the other objects' boxes (the target's own left out by the caller: a
    neighbour whose box equals the target's, overlapping it, is a neighbour).

    The margin is taken on the cluster's box, not the target's, so the Cluster view need
    not contain the Crop view: a target at the cluster's edge can get less margin on that
    side than its Crop gives it (37 of ~1,600 views in an audit, by 2 px). DO-Bench calls
    the views hierarchical but states no nesting rule; this is our reading of "the target
    and its immediate neighbours" with the paper's margin rule."""
    target = check_box(target, width, height, "target")
    near = neighbours(target, [check_box(b, width, height, "others") for b in others], neighbour_radius)
    if not near:
        pad = 2 * neighbour_radius * max(target[2] - target[0], target[3] - target[1])
        # shifted, not clipped, at the border: a target near an edge gets as much context
        union = _shift_inside((target[0] - pad, target[1] - pad, target[2] + pad, target[3] + pad), width, height)
    else:
        union = (min(b[0] for b in [target, *near]), min(b[1] for b in [target, *near]),
                 max(b[2] for b in [target, *near]), max(b[3] for b in [target, *near]))
    return grow(union, margin, width, height)


def pixel_bounds(box: Box, width: int, height: int) -> tuple[int, int, int, int]:
    """The integer pixel window :func:`cut` takes for ``box``: the smallest that contains it,
    and square when the box is.

    Flooring one edge and ceiling the other gives a square box sides that differ by a pixel
    when its two axes fall differently on the pixel grid: a third of DO-Bench's square Crop
    views were a pixel wider than tall (10% on a 10 px crop), which the processor's resize
    then stretched. The shorter side is then widened by the missing pixel, on the side the
    box reaches further into its border pixel (kept inside the image). Rounding instead
    would cut off pixels of small objects (PIL draws a whole pixel a box only touches).
    """
    import math

    box = check_box(box, width, height)
    x0, y0, x1, y1 = math.floor(box[0]), math.floor(box[1]), min(math.ceil(box[2]), width), min(math.ceil(box[3]), height)
    if math.isclose(box[2] - box[0], box[3] - box[1], rel_tol=1e-9, abs_tol=1e-9):
        side = max(x1 - x0, y1 - y0)
        x0, x1 = _widen(x0, x1, side, box[0] - x0, x1 - box[2], width)
        y0, y1 = _widen(y0, y1, side, box[1] - y0, y1 - box[3], height)
    return (x0, y0, x1, y1)


def _widen(lo: int, hi: int, side: int, slack_lo: float, slack_hi: float, limit: int) -> tuple[int, int]:
    """``[lo, hi)`` widened to ``side`` pixels (as far as the image allows): the pixel goes
    where the box leaves less of its border pixel empty."""
    while hi - lo < min(side, limit):
        grow_hi = (slack_hi <= slack_lo and hi < limit) or lo == 0
        lo, hi = (lo, hi + 1) if grow_hi else (lo - 1, hi)
    return lo, hi


def cut(image: Image.Image, box: Box) -> Image.Image:
    """The region ``box`` of ``image``, at the integer bounds :func:`pixel_bounds` gives."""
    return image.crop(pixel_bounds(box, image.width, image.height))
