"""Seeded scene sampling with the statistics of a real training set as explicit knobs.

A :class:`WorldConfig` states the biases: which objects each context favours, which
objects travel together (co-occurrence), which categories nearly always have one colour
(dominant attributes), and how often objects are small. :class:`World` samples scenes
from it; ``World(config).scene(seed)`` is a pure function of ``(config, seed)``.

The shipped organism is trained on :data:`BIASED` and probed on scenes from
:data:`UNBIASED` (or on exact edits of biased scenes), so any hallucination it shows
comes from the statistics below, not from code.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from .scene import Obj, Scene, min_size
from .vocab import CATEGORIES, COLOURS, CONTEXT_CATEGORIES, CONTEXTS, check_category, check_colour, check_context


@dataclass(frozen=True)
class WorldConfig:
    """The knobs of a world. All probabilities are in [0, 1]; sizes are fractions of the side."""

    resolution: int = 128
    n_objects: tuple[int, int] = (2, 5)  # inclusive range of objects per scene
    # context -> category -> sampling weight
    context_weights: dict[str, dict[str, float]] = field(default_factory=dict)
    # (cue, companion, p): when cue is present, companion is present with probability p
    cooccurrence: tuple[tuple[str, str, float], ...] = ()
    # category -> (colour, p): the category has that colour with probability p
    dominant_colour: dict[str, tuple[str, float]] = field(default_factory=dict)
    small_fraction: float = 0.3
    large_size: tuple[float, float] = (0.16, 0.26)
    small_size: tuple[float, float] = (0.055, 0.08)
    min_gap: float = 2.0  # pixels between object boxes

    def __post_init__(self) -> None:
        if not isinstance(self.resolution, int) or self.resolution < 32:
            raise ValueError(f"resolution must be an int >= 32, got {self.resolution!r}")
        if not _is_number(self.min_gap) or not math.isfinite(self.min_gap) or self.min_gap < 0:
            raise ValueError(f"min_gap must be a finite number of pixels >= 0, got {self.min_gap!r}")
        _check_pair(self.n_objects, "n_objects")
        lo, hi = self.n_objects
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (lo, hi)) or not 1 <= lo <= hi <= 12:
            raise ValueError(f"n_objects must satisfy 1 <= min <= max <= 12, got {self.n_objects}")
        for context, weights in self.context_weights.items():
            check_context(context, "context_weights")
            for category, w in weights.items():
                check_category(category, "context_weights")
                if not _is_number(w) or not math.isfinite(w) or w < 0:
                    raise ValueError(f"context_weights[{context!r}][{category!r}] must be a finite number >= 0")
            if weights and not sum(weights.values()) > 0:
                raise ValueError(f"context_weights[{context!r}] must not all be 0")
        for entry in self.cooccurrence:
            if not isinstance(entry, (tuple, list)) or len(entry) != 3:
                raise ValueError(f"cooccurrence: each entry must be (cue, companion, probability), got {entry!r}")
        for cue, companion, p in self.cooccurrence:
            check_category(cue, "cooccurrence")
            check_category(companion, "cooccurrence")
            _check_prob(p, "cooccurrence")
        for category, entry in self.dominant_colour.items():
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise ValueError(f"dominant_colour[{category!r}] must be (colour, probability), got {entry!r}")
        for category, (colour, p) in self.dominant_colour.items():
            check_category(category, "dominant_colour")
            check_colour(colour, "dominant_colour")
            _check_prob(p, "dominant_colour")
        _check_prob(self.small_fraction, "small_fraction")
        for name in ("large_size", "small_size"):
            _check_pair(getattr(self, name), name)
            a, b = getattr(self, name)
            if not (_is_number(a) and _is_number(b)) or not 0 < a <= b < 0.5:
                raise ValueError(f"{name} must satisfy 0 < min <= max < 0.5, got {(a, b)}")

    def replace(self, **changes) -> "WorldConfig":
        return dataclasses.replace(self, **changes)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_pair(value, argument: str) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{argument} must be a (min, max) pair, got {value!r}")


def _check_prob(p: float, argument: str) -> None:
    if not (_is_number(p) and 0.0 <= p <= 1.0):
        raise ValueError(f"{argument}: probability must be in [0, 1], got {p!r}")


def check_seed(seed: int, argument: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**63:
        raise ValueError(f"{argument} must be a non-negative integer, got {seed!r}")
    return int(seed)


def derive_seed(seed: int, *stream: int) -> int:
    """The world seed of draw ``stream`` (e.g. ``(suite tag, attempt)``) under ``seed``, in
    ``[0, 2**63)``.

    A hash (numpy's ``SeedSequence``), not arithmetic: ``seed * 97 + attempt`` overflowed the
    seed range for large seeds and reused seed + 1's scenes from attempt 97 on. Distinct
    ``(seed, *stream)`` give independent seeds; the same give the same.
    """
    parts = [check_seed(seed), *(check_seed(part, "stream") for part in stream)]
    # fixed-width words behind a count: SeedSequence reads [2**32] as the words [0, 1], the
    # same as [0, 1], and a missing word as a zero one
    words = [len(parts)] + [w for part in parts for w in (part & 0xFFFFFFFF, part >> 32)]
    high, low = np.random.SeedSequence(words).generate_state(2, np.uint32)
    return ((int(high) << 32) | int(low)) >> 1


def check_subset(values, allowed: tuple, argument: str) -> tuple:
    """A non-empty subset of ``allowed`` as a tuple (suite options), or a ValueError naming it."""
    values = tuple(values)
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ValueError(f"{argument}: must be a non-empty subset of {allowed}, got {values!r}")
    return values


def check_count(value: int, argument: str) -> int:
    """A positive int size argument (suite sizes, image counts), or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{argument} must be a positive int, got {value!r}")
    return value


_KITCHEN, _PARK = CONTEXT_CATEGORIES["kitchen"], CONTEXT_CATEGORIES["park"]

#: The biased world the organism is trained on. Each bias is a knob a probe can target:
#: knife -> fork and bench -> tree co-occur; bananas are yellow, trees green, plates white;
#: kitchens hold kitchen things and parks park things; 35% of objects are small.
BIASED = WorldConfig(
    context_weights={
        "kitchen": {**{c: 1.0 for c in _KITCHEN}, **{c: 0.08 for c in _PARK}},
        "park": {**{c: 1.0 for c in _PARK}, **{c: 0.08 for c in _KITCHEN}},
    },
    cooccurrence=(("knife", "fork", 0.92), ("bench", "tree", 0.92)),
    dominant_colour={"banana": ("yellow", 0.95), "tree": ("green", 0.95), "plate": ("white", 0.9)},
    small_fraction=0.35,
)

#: The same world without the biases: uniform categories, no co-occurrence, uniform colours.
UNBIASED = WorldConfig(
    context_weights={ctx: {c: 1.0 for c in CATEGORIES} for ctx in CONTEXTS},
    small_fraction=0.35,
)


class World:
    """Samples scenes from a :class:`WorldConfig`; every method is deterministic in its seed."""

    def __init__(self, config: WorldConfig = BIASED) -> None:
        if not isinstance(config, WorldConfig):
            raise ValueError(f"config must be a WorldConfig, got {type(config).__name__}")
        self.config = config

    # -- sampling pieces ------------------------------------------------------------
    def _weights(self, context: str) -> tuple[list[str], np.ndarray]:
        weights = self.config.context_weights.get(context) or {c: 1.0 for c in CATEGORIES}
        names = [c for c in CATEGORIES if weights.get(c, 0.0) > 0]
        w = np.array([weights[c] for c in names], dtype=float)
        return names, w / w.sum()

    def sample_colour(self, rng: np.random.Generator, category: str) -> str:
        dominant = self.config.dominant_colour.get(category)
        if dominant is not None and rng.random() < dominant[1]:
            return dominant[0]
        others = [c for c in COLOURS if dominant is None or c != dominant[0]]
        return others[int(rng.integers(len(others)))]

    def sample_size(self, rng: np.random.Generator, small: bool | None = None) -> float:
        if small is None:
            small = rng.random() < self.config.small_fraction
        lo, hi = self.config.small_size if small else self.config.large_size
        return float(rng.uniform(lo, hi) * self.config.resolution)

    def place(
        self, rng: np.random.Generator, scene_objects: list[Obj], category: str, colour: str, size: float,
        uid: int, tries: int = 200,
    ) -> Obj | None:
        """An object of ``category`` at a random free spot (no box overlap), or None.

        ``size`` is raised to the shape's :func:`~evaluators.world.scene.min_size` (two pixels
        on its narrow side): at low resolutions a small bar or ball would otherwise draw
        nothing. At the default 128 px no sampled size is that small, so generated scenes are
        unchanged."""
        r = self.config.resolution
        size = max(size, min_size(CATEGORIES[check_category(category)]))
        for _ in range(tries):
            probe = Obj(uid, category, colour, 0.0, 0.0, size)
            x0, y0, x1, y1 = probe.box
            w, h = x1 - x0, y1 - y0
            cx = float(rng.uniform(w / 2 + 1, r - w / 2 - 1))
            cy = float(rng.uniform(h / 2 + 1, r - h / 2 - 1))
            obj = probe.replace(cx=round(cx, 2), cy=round(cy, 2))
            if all(box_gap(obj.box, o.box) >= self.config.min_gap for o in scene_objects):
                return obj
        return None

    # -- scenes ---------------------------------------------------------------------
    def scene(self, seed: int, *, context: str | None = None, n_objects: int | None = None) -> Scene:
        """A scene drawn with the world's statistics.

        ``n_objects`` given: exactly that many objects. A co-occurrence companion then takes
        the place of the last drawn category that belongs to no co-occurrence pair; when
        every other drawn category belongs to one (``n_objects=2``: a knife and a bench) it
        is left out, so with few objects a companion follows its cue a little less often
        than configured (BIASED, 0.92: about 0.88 at two objects, 0.96 at three, where
        chance adds to it). An object with no free spot is a ValueError (ten large objects
        do not always fit). Left out, the count is drawn from ``config.n_objects``, a
        companion joins on top, and an object with no free spot is left out, as always.
        """
        seed = check_seed(seed)
        rng = np.random.default_rng([seed, 1])
        if context is None:
            context = list(CONTEXTS)[int(rng.integers(len(CONTEXTS)))]
        check_context(context)
        lo, hi = self.config.n_objects
        n = int(rng.integers(lo, hi + 1)) if n_objects is None else n_objects
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 12:
            raise ValueError(f"n_objects must be an int in [1, 12], got {n!r}")
        names, probs = self._weights(context)
        if n_objects is not None and n > len(names):
            raise ValueError(f"n_objects: the {context!r} context has only {len(names)} categories, asked for {n}")
        chosen = list(rng.choice(names, size=min(n, len(names)), replace=False, p=probs))
        paired = {c for pair in self.config.cooccurrence for c in pair[:2]}
        for cue, companion, p in self.config.cooccurrence:
            if cue in chosen and companion not in chosen and rng.random() < p:
                if n_objects is None:
                    chosen.append(companion)  # one-directional: the companion may also appear alone
                    continue
                free = [i for i, c in enumerate(chosen) if c not in paired]
                if free:
                    chosen[free[-1]] = companion
        objects: list[Obj] = []
        for category in chosen:
            obj = self.place(rng, objects, str(category), self.sample_colour(rng, str(category)),
                             self.sample_size(rng), uid=len(objects), tries=200 if n_objects is None else 1000)
            if obj is not None:
                objects.append(obj)
            elif n_objects is not None:
                raise ValueError(f"n_objects: cannot fit {n} objects apart in a {self.config.resolution}px scene "
                                 f"(seed {seed})")
        return Scene(context, tuple(objects), seed, self.config.resolution)

    def dense_scene(self, seed: int, category: str, count: int, *, context: str | None = None,
                    distractors: int = 2, small: bool | None = True) -> Scene:
        """Many instances of one category (dense counting), plus up to ``distractors`` objects
        of other categories (as many as find a free spot: the count is exact, the distractors
        are clutter, and ``count`` instances already fill much of the canvas)."""
        seed = check_seed(seed)
        check_category(category)
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 0 <= count <= 12:
            raise ValueError(f"count must be an int in [0, 12], got {count!r}")
        if isinstance(distractors, bool) or not isinstance(distractors, numbers.Integral) or distractors < 0:
            raise ValueError(f"distractors must be a non-negative int, got {distractors!r}")
        if small is not None and not isinstance(small, bool):
            raise ValueError(f"small must be True, False or None, got {small!r}")
        count, distractors = int(count), int(distractors)
        rng = np.random.default_rng([seed, 2])
        context = context or list(CONTEXTS)[int(rng.integers(len(CONTEXTS)))]
        check_context(context)
        objects: list[Obj] = []
        for _ in range(count):
            obj = self.place(rng, objects, category, self.sample_colour(rng, category),
                             self.sample_size(rng, small), uid=len(objects), tries=500)
            if obj is None:
                raise ValueError(f"count: cannot fit {count} instances of {category!r} without overlap")
            objects.append(obj)
        others = [c for c in CATEGORIES if c != category]
        for _ in range(distractors):
            other = others[int(rng.integers(len(others)))]
            obj = self.place(rng, objects, other, self.sample_colour(rng, other), self.sample_size(rng, False),
                             uid=len(objects))
            if obj is not None:
                objects.append(obj)
        return Scene(context, tuple(objects), seed, self.config.resolution)


def box_gap(a, b) -> float:
    """Distance between two boxes (0 if they touch or overlap; negative overlap reported as 0)."""
    dx = max(b[0] - a[2], a[0] - b[2], 0.0)
    dy = max(b[1] - a[3], a[1] - b[3], 0.0)
    if dx == 0.0 and dy == 0.0:
        return -1.0 if _overlap(a, b) else 0.0
    return max(dx, dy)


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
