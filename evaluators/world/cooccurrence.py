"""How often two categories share a scene in a world: the "annotation statistics" that
co-occurrence-based benchmarks select their objects by.

Causal-HalBench (Sec. 4.1-4.2) picks its contextual object ``o_c`` by co-occurrence
frequency with the target ``o_t``, its counterfactual object ``o_cf`` among the objects of
lowest co-occurrence frequency with ``o_c``, and its absent objects ``o_a`` among those
that "frequently appear with" ``o_t`` -- frequencies the paper takes from MSCOCO's
annotations. Here they are counted on a fixed sample of the world's own scenes, the
counterpart of a training set's annotations.

Our choice where the paper is silent: the frequency of a pair is the number of sampled
scenes holding both categories (at least one instance each), the count POPE's
adversarial setting ranks by; it is symmetric. The sample is fixed (``n_scenes`` scenes of
stream 53 under seed 0), not drawn from a suite's seed, so every suite of one world ranks
objects by the same statistics, as every split of a dataset shares its annotations.
"""

from __future__ import annotations

from itertools import combinations

from .generator import World, WorldConfig, check_count, derive_seed
from .vocab import CATEGORIES, check_category

_STREAM = 53
_CACHE: dict[tuple[str, int], "Cooccurrence"] = {}


class Cooccurrence:
    """Pair counts over ``n_scenes`` scenes of a world: ``counts[a][b]`` scenes hold both
    ``a`` and ``b`` (``counts[a][a]``: scenes holding ``a``)."""

    def __init__(self, counts: dict[str, dict[str, int]], n_scenes: int) -> None:
        self.counts = counts
        self.n_scenes = n_scenes

    def __call__(self, a: str, b: str) -> int:
        return self.counts[check_category(a, "a")][check_category(b, "b")]

    def ranked(self, category: str, candidates, *, lowest: bool = False) -> list[str]:
        """``candidates`` by their co-occurrence with ``category``, most frequent first
        (``lowest=True``: least frequent first); ties keep the vocabulary's order."""
        row = self.counts[check_category(category)]
        order = {c: i for i, c in enumerate(CATEGORIES)}
        sign = 1 if lowest else -1
        return sorted(candidates, key=lambda c: (sign * row[check_category(c, "candidates")], order[c]))


def cooccurrence(world: World | WorldConfig, n_scenes: int = 4000) -> Cooccurrence:
    """The pair counts of ``world`` (a :class:`World` or its config) over ``n_scenes`` of its
    scenes; computed once per world and size."""
    config = world.config if isinstance(world, World) else world
    if not isinstance(config, WorldConfig):
        raise ValueError(f"world must be a World or WorldConfig, got {type(world).__name__}")
    check_count(n_scenes, "n_scenes")
    key = (repr(config), n_scenes)
    if key not in _CACHE:
        sampler = World(config)
        counts = {a: {b: 0 for b in CATEGORIES} for a in CATEGORIES}
        for i in range(n_scenes):
            present = sorted(sampler.scene(derive_seed(0, _STREAM, i)).categories())
            for a in present:
                counts[a][a] += 1
            for a, b in combinations(present, 2):
                counts[a][b] += 1
                counts[b][a] += 1
        _CACHE[key] = Cooccurrence(counts, n_scenes)
    return _CACHE[key]


__all__ = ["Cooccurrence", "cooccurrence"]
