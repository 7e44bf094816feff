"""Composite samples built from scenes and exact edits: DO-Bench view triples,
HalluSegBench factual/counterfactual pairs, ReactBench before/after pairs and MIOH
multi-image sets. Each returns scenes (data) plus the ground truth needed to score it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from . import edits
from .generator import World, check_seed, derive_seed
from .scene import Obj, Scene
from .views import MARGINS, check_margin, cluster_box, crop_box, cut, pixel_bounds
from .vocab import CATEGORIES, COLOURS, CONTEXT_CATEGORIES, check_category

CHANGE_KINDS = ("move", "add", "remove", "replace")
MIOH_CONDITIONS = ("easy", "hard_positive", "hard_negative")


# -- DO-Bench: Full / Cluster / Crop ---------------------------------------------------
@dataclass(frozen=True)
class Views:
    """The three DO-Bench views of one target; boxes are in source pixels.

    ``cluster_box`` / ``crop_box`` are the views' exact (fractional) boxes; each image is
    cut at the integer window :func:`~evaluators.world.views.pixel_bounds` gives for its box
    (``windows``), which may be a pixel wider. Annotations map into a view by that window:
    :meth:`box_in` for a box, :meth:`mask_in` for a source mask (the target's:
    ``target_box``, ``scene.masks()[uid]``)."""

    full: Image.Image
    cluster: Image.Image
    crop: Image.Image
    cluster_box: tuple[float, float, float, float]
    crop_box: tuple[float, float, float, float]
    margin: float
    target_box: tuple[float, float, float, float] | None = None

    def as_dict(self) -> dict[str, Image.Image]:
        return {"Full": self.full, "Cluster": self.cluster, "Crop": self.crop}

    @property
    def windows(self) -> dict[str, tuple[int, int, int, int]]:
        """Each view's integer window in the source image, ``(x0, y0, x1, y1)``: the pixels it holds."""
        w, h = self.full.size
        return {"Full": (0, 0, w, h), "Cluster": pixel_bounds(self.cluster_box, w, h),
                "Crop": pixel_bounds(self.crop_box, w, h)}

    def _window(self, view: str) -> tuple[int, int, int, int]:
        windows = self.windows
        if view not in windows:
            raise ValueError(f"view must be one of {list(windows)}, got {view!r}")
        return windows[view]

    def box_in(self, box, view: str) -> tuple[float, float, float, float]:
        """A source-pixel box in ``view``'s own pixel coordinates (not clipped to the view)."""
        x0, y0, _, _ = self._window(view)
        return (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0)

    def mask_in(self, mask: np.ndarray, view: str) -> np.ndarray:
        """A source-resolution mask cut to ``view``'s pixels (the same shape as its image)."""
        if mask.shape != (self.full.height, self.full.width):
            source = (self.full.height, self.full.width)
            raise ValueError(f"mask: shape {mask.shape} is not the source image's {source}")
        x0, y0, x1, y1 = self._window(view)
        return mask[y0:y1, x0:x1]


def do_views(scene: Scene, uid: int, margin: float = 0.1) -> Views:
    """Full, Cluster and Crop views of object ``uid``, cut from the source-resolution render."""
    check_margin(margin)
    boxes = scene.boxes()
    if uid not in boxes:
        scene.get(uid)  # raises for an unknown uid
        raise ValueError(f"uid: object {uid} is fully occluded; it has no view")
    image = scene.render()
    r = scene.resolution
    target = boxes[uid]
    cbox = cluster_box(target, [b for u, b in boxes.items() if u != uid], r, r, margin)
    kbox = crop_box(target, r, r, margin)
    return Views(image, cut(image, cbox), cut(image, kbox), cbox, kbox, margin, target)


# -- HalluSegBench: factual / counterfactual -------------------------------------------
@dataclass(frozen=True)
class SegmentationPair:
    factual: Scene
    counterfactual: Scene
    uid: int
    factual_label: str
    counterfactual_label: str

    @property
    def factual_mask(self) -> np.ndarray:
        return self.factual.masks()[self.uid]

    @property
    def counterfactual_mask(self) -> np.ndarray:
        """Mask of the *factual* label in the counterfactual image: empty by construction."""
        return self.counterfactual.mask_of(self.factual_label)

    @property
    def replacement_mask(self) -> np.ndarray:
        """Mask of the replacing object (counterfactual label) in the counterfactual image."""
        return self.counterfactual.masks()[self.uid]


def segmentation_pair(world: World, seed: int) -> SegmentationPair:
    """A scene and the same scene with one object replaced by another category in place.

    The replacing category c' is drawn among the absent ones that fit the place and are
    typical of the scene's context, and only where none is from the others: HalluSegBench
    (Sec. 3) asks for a replacement that is "contextually plausible" in the object's
    location. Until session 33 c' was drawn from every absent category, so it was mostly
    out of context (73% of pairs) while the original object was mostly in context (83-90%),
    and "the label is usual for the background" told the factual from the textual query
    80% of the time without seeing the object (a review's blind audit)."""
    seed = check_seed(seed)
    rng = np.random.default_rng([seed, 3])
    for attempt in range(100):
        scene = world.scene(derive_seed(seed, 3, attempt))
        singles = [o for o in scene.objects if scene.count(o.category) == 1 and o.size >= 0.12 * scene.resolution]
        if singles:
            break
    else:  # pragma: no cover - the biased world nearly always has a large single object
        raise ValueError(f"seed: no scene with a large single object found for seed {seed}")
    obj = singles[int(rng.integers(len(singles)))]
    absent = [c for c in CATEGORIES if not scene.present(c) and edits.can_replace(obj, c)]
    typical = [c for c in absent if c in CONTEXT_CATEGORIES[scene.context]]
    pool = typical or absent
    new = pool[int(rng.integers(len(pool)))]
    return SegmentationPair(scene, edits.replace(scene, obj.uid, new), obj.uid, obj.category, new)


# -- ReactBench: before / after --------------------------------------------------------
@dataclass(frozen=True)
class ChangePair:
    before: Scene
    after: Scene
    kind: str
    category: str
    detail: str  # e.g. the replacing category, or the direction of a move


def change_pair(world: World, seed: int, kind: str) -> ChangePair:
    """A scene and one exact alteration of it: ``move``, ``add``, ``remove`` or ``replace``."""
    seed = check_seed(seed)
    if kind not in CHANGE_KINDS:
        raise ValueError(f"kind must be one of {CHANGE_KINDS}, got {kind!r}")
    rng = np.random.default_rng([seed, 4])
    for attempt in range(100):
        before = world.scene(derive_seed(seed, 4, attempt))
        singles = [o for o in before.objects if before.count(o.category) == 1]
        absent = [c for c in CATEGORIES if not before.present(c)]
        if not singles or not absent:
            continue
        obj = singles[int(rng.integers(len(singles)))]
        if kind == "remove":
            return ChangePair(before, edits.remove(before, obj.uid), kind, obj.category, "")
        if kind == "replace":
            absent = [c for c in absent if edits.can_replace(obj, c)]
            if not absent:
                continue
            new = absent[int(rng.integers(len(absent)))]
            return ChangePair(before, edits.replace(before, obj.uid, new), kind, obj.category, new)
        if kind == "add":
            new = absent[int(rng.integers(len(absent)))]
            placed = world.place(rng, list(before.objects), new, world.sample_colour(rng, new),
                                 world.sample_size(rng, False), uid=before.next_uid())
            if placed is not None:
                return ChangePair(before, edits.add(before, placed), kind, new, "")
            continue
        # move: to a free spot at least a third of the image away
        others = [o for o in before.objects if o.uid != obj.uid]
        spot = world.place(rng, others, obj.category, obj.colour, obj.size, uid=obj.uid)
        if spot is not None and np.hypot(spot.cx - obj.cx, spot.cy - obj.cy) > before.resolution / 3:
            after = edits.move(before, obj.uid, spot.cx, spot.cy)
            dx, dy = spot.cx - obj.cx, spot.cy - obj.cy
            direction = ("right" if dx > 0 else "left") if abs(dx) >= abs(dy) else ("down" if dy > 0 else "up")
            return ChangePair(before, after, kind, obj.category, direction)
    raise ValueError(f"seed: could not build a {kind!r} change for seed {seed}")  # pragma: no cover


# -- MIOH: multi-image sets ------------------------------------------------------------
@dataclass(frozen=True)
class ImageSet:
    scenes: tuple[Scene, ...]
    target: str
    condition: str
    holders: tuple[int, ...]  # indices of the images that contain the target

    @property
    def answer_index(self) -> int | None:
        """The single image holding the target, or None ("none of the above")."""
        return self.holders[0] if len(self.holders) == 1 else None


def image_set(world: World, seed: int, n_images: int, target: str, condition: str = "easy",
              *, present: bool = True, holder_unusual: bool = False, swap_in: bool = False) -> ImageSet:
    """``n_images`` scenes where the target is in exactly one image (``present``) or none.

    * ``easy``: the target, when present, is large; the other images have no cue for it:
      they are of the other context than the target's usual one and hold no object that
      co-occurs with it.
    * ``hard_positive``: the target is present and small.
    * ``hard_negative``: every image is of the target's usual context (a park for a dog) and
      holds its co-occurrence cue where it has one (a knife for a fork); the target, when
      present, is large in one of them. MIOH (Sec. 4.3) builds hard negatives from (image,
      object) pairs where the object is absent but co-occurring objects suggest it, and a
      question over N images includes "0 to N" such challenging examples: the other images
      may hold the target. (Its existence example, App. Fig. I, is a set of N, answered "No,
      in none of them"; the checkmark there precedes the right option.) Our choice: sets
      with and without the target, so that "none" is not right by construction; the holder
      holds the cue too, so only the target itself tells it from the others.

    ``holder_unusual`` (easy sets only): the holder too is of the target's unusual context
    and without its cue, so no image's background or cue points at it. The MIOH suite asks
    for it; the organism's training data keeps the default (a holder of any context), so
    its weights are unchanged. Without it, the holder was the only image that could be of
    the target's usual context (half of the sets) or hold its cue (a third), and picking
    that image scored 61-69% on easy sets where "none" scores 25 (a review's blind audit).

    ``swap_in``: one of the holder's own objects is removed before the target is placed (at a
    free spot, as always), so the holder holds as many objects, and as much object area, as
    the other images would: one of the target's size class (small in hard-positive sets,
    large otherwise), never a hard negative's cue; where there is none, a large target
    displaces an object of any size and a small one displaces nothing. Without it the target
    is added, the holder holds one object more on average, and "the image with the most
    objects" picked the holder in 65% / 51% / 63% of easy / HP / HN sets of 2-4 images
    against 36% by chance (session 34's audit); removing an object of any size instead left
    a size cue ("the least total object area" picked a hard positive's holder in 37-40% of
    sets of 4 against 25). Now both rules pick it in 20-28% of sets of 4 in every condition
    (300 sets each). The MIOH suite asks for it; the organism's training data keeps the
    default, so its weights are unchanged.
    """
    seed = check_seed(seed)
    check_category(target, "target")
    if condition not in MIOH_CONDITIONS:
        raise ValueError(f"condition must be one of {MIOH_CONDITIONS}, got {condition!r}")
    if isinstance(n_images, bool) or not isinstance(n_images, (int, np.integer)) or not 1 <= n_images <= 10:
        raise ValueError(f"n_images must be an int in [1, 10], got {n_images!r}")
    n_images = int(n_images)  # numpy ints too, as seeds are
    if not isinstance(present, bool):
        raise ValueError(f"present must be a bool, got {present!r}")
    if condition == "hard_positive" and not present:
        raise ValueError("present: hard positives have the target present; pass present=True")
    if not isinstance(holder_unusual, bool) or (holder_unusual and condition != "easy"):
        raise ValueError(f"holder_unusual: True applies to easy sets only, got {holder_unusual!r} for {condition!r}")
    if not isinstance(swap_in, bool):
        raise ValueError(f"swap_in must be a bool, got {swap_in!r}")
    rng = np.random.default_rng([seed, 5])
    cue = next((c for c, comp, _ in world.config.cooccurrence if comp == target), None)
    usual = next((c for c, members in CONTEXT_CATEGORIES.items() if target in members), None)
    unusual = next((c for c in CONTEXT_CATEGORIES if c != usual), None) if usual is not None else None
    holder = int(rng.integers(n_images)) if present else None
    scenes = []
    for i in range(n_images):
        bare = i != holder or holder_unusual  # an easy image that gives no hint of the target
        context = {"hard_negative": usual, "easy": unusual if bare else None}.get(condition)
        scene = world.scene(derive_seed(seed, 5, i), context=context)
        scene = _without(scene, target)
        if condition == "hard_negative" and cue is not None and not scene.present(cue):
            scene = _with(world, rng, scene, cue, small=False)
        if condition == "easy" and cue is not None and bare:
            scene = _without(scene, cue)
        if i == holder:  # room is made without taking a hard negative's cue out again
            keep = (cue,) if condition == "hard_negative" and cue is not None else ()
            small = condition == "hard_positive"
            if swap_in:
                scene = _make_room(world, rng, scene, small, keep)
            scene = _with(world, rng, scene, target, small=small, keep=keep)
        scenes.append(scene)
    holders = tuple(i for i, s in enumerate(scenes) if s.present(target))
    return ImageSet(tuple(scenes), target, condition, holders)


def _make_room(world: World, rng: np.random.Generator, scene: Scene, small: bool, keep: tuple[str, ...]) -> Scene:
    """``scene`` without one of its objects of the size class ``small`` (a random one, never of
    a category in ``keep``); where there is none, without one of any size for a large target
    and unchanged for a small one (``image_set``'s ``swap_in``)."""
    mine = [o for o in scene.objects if o.category not in keep]
    alike = [o for o in mine if _is_small(world, o) == small] or (mine if not small else [])
    return edits.remove(scene, alike[int(rng.integers(len(alike)))].uid) if alike else scene


def _is_small(world: World, obj) -> bool:
    """Whether ``obj`` was drawn from the world's small size class (the classes do not overlap)."""
    return obj.size <= world.config.small_size[1] * world.config.resolution


def _without(scene: Scene, category: str) -> Scene:
    return edits.remove_category(scene, category) if scene.present(category) else scene


def _with(world: World, rng: np.random.Generator, scene: Scene, category: str, *, small: bool,
          keep: tuple[str, ...] = ()) -> Scene:
    """``scene`` with one ``category`` object added; where it does not fit, the last object
    (of a category not in ``keep``) is removed to make room."""
    for _ in range(20):
        obj = world.place(rng, list(scene.objects), category, world.sample_colour(rng, category),
                          world.sample_size(rng, small), uid=scene.next_uid())
        if obj is not None:
            return edits.add(scene, obj)
        movable = [o for o in scene.objects if o.category not in keep]
        if not movable:
            break
        scene = edits.remove(scene, movable[-1].uid)  # make room
    raise ValueError(f"cannot place {category!r}")  # pragma: no cover


__all__ = [
    "CHANGE_KINDS", "ChangePair", "ImageSet", "MARGINS", "MIOH_CONDITIONS", "SegmentationPair", "Views",
    "change_pair", "do_views", "image_set", "segmentation_pair", "COLOURS", "Obj",
]
