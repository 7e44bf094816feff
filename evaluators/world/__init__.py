"""A procedural, seeded counterfactual world: scenes whose every edit is exact.

Scenes are data (:class:`Scene`: a context and objects with category, colour, position,
size) rendered at a source resolution (``WorldConfig.resolution``, 128 px: 2x the organism's
64 px input) above the model's, so a crop carries real extra detail. The knobs of a real training set's statistics live in :class:`WorldConfig`
(:data:`BIASED` trains the organism). Interventions (:mod:`.edits`), DO-Bench views
(:mod:`.views`) and composite samples for the five benchmarks (:mod:`.sets`) build on it.
"""

#: Which data a seed gives: bumped whenever the scenes, views or sets drawn from the same
#: seeds change, so that training caches written from other data are refused. 2 (session 30):
#: set builders hash their seeds (derive_seed), square views cut square, objects need 2 px a
#: side, ``scene(n_objects=k)`` is exact. 1: everything before.
DATA_VERSION = 2

from . import edits  # noqa: E402
from .generator import BIASED, UNBIASED, World, WorldConfig, box_gap, check_count, check_seed, check_subset, derive_seed
from .scene import Obj, Scene
from .sets import (
    CHANGE_KINDS, MIOH_CONDITIONS, ChangePair, ImageSet, SegmentationPair, Views, change_pair, do_views,
    image_set, segmentation_pair,
)
from .views import MARGINS, cluster_box, coverage, crop_box, cut, grow, pixel_bounds
from .vocab import CATEGORIES, COLOURS, CONTEXT_CATEGORIES, CONTEXTS, REASONING, RELATIONS, SYNONYMS

__all__ = [
    "BIASED", "DATA_VERSION", "CATEGORIES", "CONTEXT_CATEGORIES", "box_gap", "check_count", "check_subset", "CHANGE_KINDS", "COLOURS", "CONTEXTS", "ChangePair", "ImageSet", "MARGINS",
    "MIOH_CONDITIONS", "Obj", "REASONING", "RELATIONS", "SYNONYMS", "Scene", "SegmentationPair", "UNBIASED", "Views", "World",
    "WorldConfig", "change_pair", "check_seed", "derive_seed", "cluster_box", "coverage", "crop_box", "cut", "do_views", "edits", "grow", "pixel_bounds",
    "image_set", "segmentation_pair",
]
