"""A scene: a background and a list of objects, rendered exactly at source resolution.

Everything a benchmark needs to score comes from the scene description, not from the
pixels: presence, counts, colours, boxes, per-instance masks, pairwise relations. Because
a scene is data and rendering is a pure function of it (the background texture is drawn
from the scene's own seed), every edit in :mod:`.edits` is exact: removing an object
re-renders the same background under it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from .vocab import CATEGORIES, COLOURS, CONTEXTS, PATTERNS, check_category, check_colour, check_context

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in source pixels (x1, y1 exclusive)

# aspect (width, height) of each shape's box relative to its size
_ASPECT = {"hbar": (1.0, 0.38), "vbar": (0.38, 1.0)}
def aspect(shape: str) -> tuple[float, float]:
    """A shape's box, width and height, per unit of an object's ``size``."""
    return _ASPECT.get(shape, (1.0, 1.0))


NOISE_STD = 6.0  # sensor-like noise on every pixel, seeded per scene

#: The narrowest side an object's box may have, in source pixels. Under it a shape may
#: draw nothing: PIL refuses a box under a pixel, and draws no circle in most boxes under
#: two (measured over random sub-pixel placements); every shape draws from two on.
MIN_SIDE = 2.0


def min_size(shape: str) -> float:
    """The smallest ``size`` whose box of ``shape`` is :data:`MIN_SIDE` wide and tall."""
    return MIN_SIDE / min(aspect(shape))


@dataclass(frozen=True)
class Obj:
    """One object instance. ``cx, cy, size`` are in source pixels; ``uid`` is unique in a scene."""

    uid: int
    category: str
    colour: str
    cx: float
    cy: float
    size: float

    def __post_init__(self) -> None:
        if isinstance(self.uid, bool) or not isinstance(self.uid, numbers.Integral):
            raise ValueError(f"uid must be an integer, got {self.uid!r}")
        check_category(self.category)
        check_colour(self.colour)
        for name in ("cx", "cy", "size"):  # NaN passed every comparison and failed at render time
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not self.size >= min_size(self.shape):
            aw, ah = aspect(self.shape)
            raise ValueError(f"size {self.size!r} gives a {self.category!r} box of {self.size * aw:.2f} x "
                             f"{self.size * ah:.2f} px; each side must be at least {MIN_SIDE:g} px")

    @property
    def shape(self) -> str:
        return CATEGORIES[self.category]

    @property
    def box(self) -> Box:
        aw, ah = aspect(self.shape)
        w, h = self.size * aw, self.size * ah
        return (self.cx - w / 2, self.cy - h / 2, self.cx + w / 2, self.cy + h / 2)

    def replace(self, **changes) -> "Obj":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Scene:
    """A background context plus objects, drawn in order (later objects occlude earlier)."""

    context: str
    objects: tuple[Obj, ...]
    seed: int
    resolution: int = 128
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        check_context(self.context)
        if isinstance(self.objects, list):  # a list is as good: kept as a tuple (the scene is frozen)
            object.__setattr__(self, "objects", tuple(self.objects))
        if not isinstance(self.objects, tuple) or any(not isinstance(o, Obj) for o in self.objects):
            raise ValueError(f"objects must be a tuple of Obj, got {self.objects!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if isinstance(self.resolution, bool) or not isinstance(self.resolution, numbers.Integral) \
                or self.resolution < 8:
            raise ValueError(f"resolution must be an integer of at least 8 pixels, got {self.resolution!r}")
        uids = [o.uid for o in self.objects]
        if len(set(uids)) != len(uids):
            raise ValueError(f"object uids must be unique, got {uids}")

    # -- ground truth ---------------------------------------------------------------
    def visible(self) -> tuple[Obj, ...]:
        """The objects with at least one visible pixel, in drawing order: the ground truth of
        presence and counts follows the pixels. An object is hidden when later objects cover
        all of it (``edits.add`` / ``edits.move`` can do that; generated scenes keep their
        objects apart) or it lies off the canvas (a scene built by hand, or read back at a
        smaller ``resolution``), so masks are read only for objects a later box overlaps or
        the canvas cuts."""
        if "visible" not in self._cache:
            kept, side = [], self.resolution
            for i, obj in enumerate(self.objects):
                x0, y0, x1, y1 = obj.box
                covered = any(_boxes_overlap(obj.box, o.box) for o in self.objects[i + 1 :])
                cut = x0 < 0 or y0 < 0 or x1 > side or y1 > side
                if not (covered or cut) or self.masks()[obj.uid].any():
                    kept.append(obj)
            self._cache["visible"] = tuple(kept)
        return self._cache["visible"]

    def categories(self) -> set[str]:
        return {o.category for o in self.visible()}

    def present(self, category: str) -> bool:
        check_category(category)
        return any(o.category == category for o in self.visible())

    def count(self, category: str) -> int:
        check_category(category)
        return sum(o.category == category for o in self.visible())

    def of(self, category: str) -> list[Obj]:
        check_category(category)
        return [o for o in self.visible() if o.category == category]

    def get(self, uid: int) -> Obj:
        for o in self.objects:
            if o.uid == uid:
                return o
        raise ValueError(f"uid: no object {uid} in this scene (uids: {[o.uid for o in self.objects]})")

    def boxes(self) -> dict[int, Box]:
        """Tight boxes of the visible pixels, per uid (objects fully occluded are omitted)."""
        out = {}
        for uid, mask in self.masks().items():
            ys, xs = np.nonzero(mask)
            if len(xs):
                out[uid] = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
        return out

    def relation(self, a: int, b: int) -> str:
        """Where object ``a`` is relative to ``b`` along the axis of larger separation."""
        oa, ob = self.get(a), self.get(b)
        if oa.uid == ob.uid:
            raise ValueError(f"a, b: object {a} has no relation to itself")
        dx, dy = oa.cx - ob.cx, oa.cy - ob.cy
        if abs(dx) >= abs(dy):
            return "left of" if dx < 0 else "right of"
        return "above" if dy < 0 else "below"

    def visible_fraction(self, uid: int) -> float:
        full = _shape_mask(self.get(uid), self.resolution)
        return float(self.masks()[uid].sum() / max(full.sum(), 1))

    # -- rendering ------------------------------------------------------------------
    def masks(self) -> dict[int, np.ndarray]:
        """Exact per-instance boolean masks of visible pixels at source resolution (read-only:
        they are cached and shared; copy one to edit it)."""
        if "masks" not in self._cache:
            covered = np.zeros((self.resolution, self.resolution), dtype=bool)
            masks: dict[int, np.ndarray] = {}
            for obj in reversed(self.objects):  # last drawn is on top
                own = _shape_mask(obj, self.resolution)
                masks[obj.uid] = own & ~covered
                covered |= own
            for mask in masks.values():  # shared by every caller: the scene's ground truth, read-only
                mask.flags.writeable = False
            self._cache["masks"] = {o.uid: masks[o.uid] for o in self.objects}
        return self._cache["masks"]

    def mask_of(self, category: str) -> np.ndarray:
        """Union mask of every instance of ``category`` (all False if absent)."""
        out = np.zeros((self.resolution, self.resolution), dtype=bool)
        for obj in self.of(category):
            out |= self.masks()[obj.uid]
        return out

    def render(self) -> Image.Image:
        """The RGB image at source resolution.

        Each object is painted inside its own window (:func:`_window`) rather than over the
        whole canvas: its mask and texture are zero outside it, so the pixels are the same
        as a full-canvas pass (``tests/test_world.py`` checks this against one), at about
        half the cost -- rendering was 40% of a vision-pretraining step."""
        if "image" not in self._cache:
            rng = np.random.default_rng(self.seed)
            img = np.empty((self.resolution, self.resolution, 3), dtype=np.float32)
            img[:] = CONTEXTS[self.context]
            masks = self.masks()
            for obj in self.objects:
                win = _window(obj, self.resolution)
                mask = masks[obj.uid][win]
                colour = np.array(COLOURS[obj.colour], dtype=np.float32)
                canvas = img[win]
                canvas[mask] = colour
                canvas[mask & _pattern(PATTERNS[obj.category], self.resolution, obj, win)] = colour * 0.45 + 20
            img += rng.normal(0.0, NOISE_STD, size=img.shape)
            self._cache["image"] = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
        return self._cache["image"].copy()

    def with_objects(self, objects) -> "Scene":
        return Scene(self.context, tuple(objects), self.seed, self.resolution)

    def next_uid(self) -> int:
        return max((o.uid for o in self.objects), default=-1) + 1

    def to_dict(self) -> dict:
        return {
            "context": self.context,
            "seed": self.seed,
            "resolution": self.resolution,
            "objects": [dataclasses.asdict(o) for o in self.objects],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Scene":
        missing = [k for k in ("context", "objects", "seed", "resolution") if k not in data]
        if missing:
            raise ValueError(f"data: a scene needs {missing[0]!r} (and context, objects, seed, resolution)")
        objects = []
        for i, o in enumerate(data["objects"]):
            try:
                objects.append(Obj(**o))
            except TypeError as err:  # a missing or unknown field
                raise ValueError(f"data['objects'][{i}]: {err}") from None
        return cls(data["context"], tuple(objects), data["seed"], data["resolution"])


@functools.lru_cache(maxsize=4)
def _grid(resolution: int) -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:resolution, 0:resolution]
    y.flags.writeable = x.flags.writeable = False
    return y, x


def _window(obj: Obj, resolution: int) -> tuple[slice, slice]:
    """Rows and columns of the canvas that can hold ``obj``'s pixels: its box, widened by a
    pixel for PIL's rounding of fractional corners and clipped to the canvas."""
    x0, y0, x1, y1 = obj.box
    rows = slice(max(0, int(np.floor(y0)) - 1), min(resolution, int(np.ceil(y1)) + 1))
    cols = slice(max(0, int(np.floor(x0)) - 1), min(resolution, int(np.ceil(x1)) + 1))
    return rows, cols


def _pattern(name: str, resolution: int, obj: Obj, window: tuple[slice, slice] | None = None) -> np.ndarray:
    """Boolean texture over the image (or over ``window`` of it), anchored at the object's
    box corner (period ~6 px)."""
    x0, y0 = obj.box[0], obj.box[1]
    y, x = _grid(resolution)
    if window is not None:
        y, x = y[window], x[window]
    u, v = x - x0, y - y0
    if name == "solid":
        return np.zeros(x.shape, dtype=bool)
    if name == "hstripes":
        return (v // 3) % 2 == 0
    if name == "vstripes":
        return (u // 3) % 2 == 0
    if name == "checker":
        return ((u // 3) + (v // 3)) % 2 == 0
    if name == "bigchecker":
        return ((u // 6) + (v // 6)) % 2 == 0
    if name == "diagonal":
        return ((u + v) // 3) % 2 == 0
    if name == "antidiagonal":
        return ((u - v) // 3) % 2 == 0
    if name == "dots":
        return (u % 6 < 3) & (v % 6 < 3)
    if name == "grid":
        return (u % 6 < 2) | (v % 6 < 2)
    if name == "rings":
        cx, cy = (obj.box[0] + obj.box[2]) / 2, (obj.box[1] + obj.box[3]) / 2
        return (np.hypot(x - cx, y - cy) // 3) % 2 == 0
    raise ValueError(f"no pattern {name!r}")  # pragma: no cover


def _boxes_overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _shape_mask(obj: Obj, resolution: int) -> np.ndarray:
    canvas = Image.new("L", (resolution, resolution), 0)
    _draw_shape(ImageDraw.Draw(canvas), obj.shape, obj.box, obj.size)
    return np.asarray(canvas) > 0


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: Box, size: float) -> None:
    x0, y0, x1, y1 = box
    # PIL treats the end coordinate as inclusive (and refuses an end before the start, which
    # float rounding gives a box exactly MIN_SIDE wide)
    x1, y1 = max(x1 - 1, x0), max(y1 - 1, y0)
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    line = max(1, round(size * 0.2))
    if shape == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=255)
    elif shape == "ring":
        draw.ellipse((x0, y0, x1, y1), outline=255, width=line)
    elif shape in ("square", "hbar", "vbar"):
        draw.rectangle((x0, y0, x1, y1), fill=255)
    elif shape == "frame":
        draw.rectangle((x0, y0, x1, y1), outline=255, width=line)
    elif shape == "triangle":
        draw.polygon([(mx, y0), (x1, y1), (x0, y1)], fill=255)
    elif shape == "inv_triangle":
        draw.polygon([(x0, y0), (x1, y0), (mx, y1)], fill=255)
    elif shape == "diamond":
        draw.polygon([(mx, y0), (x1, my), (mx, y1), (x0, my)], fill=255)
    elif shape == "plus":
        t = (x1 - x0) * 0.18
        draw.rectangle((mx - t, y0, mx + t, y1), fill=255)
        draw.rectangle((x0, my - t, x1, my + t), fill=255)
    else:  # pragma: no cover - vocab and drawing are kept in step by a test
        raise ValueError(f"no drawing for shape {shape!r}")
