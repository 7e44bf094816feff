"""DO-Bench's 10-instance protocol (Sec. 3.1) on scenes of the counterfactual world.

Per scene group:

* an **A-object**, present but contextually unconventional (a park object in a kitchen
  and vice versa), small and placed next to other objects -- "off-center and embedded in a
  coherent local cluster, so that recognition depends on localized grounding" (Sec. 3.2).
  Off-center is our reading: its centre lies outside the middle square of half the image's
  side (:func:`off_center`); until session 39 only the cluster was kept, and 9% of
  A-objects had their centre within the middle sixteenth (an audit);
* a **B-object**, contextually typical but absent: a typical object of the scene is
  removed by an exact edit (the background shows through);
* instances A0-A3 and B0-B3 in the Full view (the prior sentence of DO-Bench's templates
  at levels 0-3; for B the positive form, our choice since the paper prints only A), and
  A0 in the Cluster and Crop views cut from the 2x source (128 px for the organism's 64 px
  input) with the given margin.

The A-series (A0-A3 in the Full view, A0's Cluster and Crop views) is asked of the base
scene, with the A-object added and the B-object still there; the B-series of the same scene
with every B-object removed ("Base scenes (A-series) ... Absent counterparts (B-series).
For each scene, we remove a contextually typical B-object", Sec. 3.2), so the two images of
a group differ only in B's existence. Until session 38 both series were cut from the scene
with B removed. The A-object is placed with at least one object within one A-size of it
(:func:`~evaluators.world.views.neighbours`, the rule its Cluster view is cut by), so every
Cluster view holds a cluster: before session 38, 9% of them were the no-neighbour window.

Records carry ``series``, ``level``, ``view`` for :mod:`.metrics`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...organism.tasks import do_prior, existence_question
from ...query import Query
from ...world import BIASED, CATEGORIES, CONTEXT_CATEGORIES, Obj, Scene, World, box_gap, check_count, check_seed, derive_seed, do_views, edits
from ...world.views import check_margin, neighbours



class SceneGroup(NamedTuple):
    """One DO-Bench scene group: ``base`` (A-object added, B-objects there: the A-series'
    image), ``absent`` (``base`` with every B-object removed: the B-series'), the A-object's
    uid in both, and the two categories."""

    base: Scene
    absent: Scene
    a_uid: int
    a_category: str
    b_category: str


def off_center(cx: float, cy: float, resolution: float) -> bool:
    """Is a centre at ``(cx, cy)`` outside the middle square of half the side of a
    ``resolution``-sized image (the middle quarter of its area)? DO-Bench places its
    A-object "off-center" (Sec. 3.2) and gives no distance; this is ours."""
    return max(abs(cx - resolution / 2), abs(cy - resolution / 2)) >= resolution / 4


def _scene_group(world: World, seed: int) -> SceneGroup | None:
    """The group drawn at world seed ``seed``, or None where the scene has no typical object
    to remove or no room for a small A-object next to another."""
    rng = np.random.default_rng([seed, 31])
    scene = world.scene(seed)
    typical = CONTEXT_CATEGORIES[scene.context]
    present_typical = [c for c in typical if scene.present(c)]
    if not present_typical:
        return None
    b_cat = present_typical[int(rng.integers(len(present_typical)))]
    odd = [c for c in CATEGORIES if c not in typical and not scene.present(c)]
    a_cat = odd[int(rng.integers(len(odd)))]
    anchors = list(scene.objects)
    for _ in range(50):  # small, next to an existing object
        anchor = anchors[int(rng.integers(len(anchors)))]
        size = world.sample_size(rng, small=True)
        angle = rng.uniform(0, 2 * np.pi)
        dist = anchor.size / 2 + size / 2 + rng.uniform(3, 8)
        cx, cy = anchor.cx + dist * np.cos(angle), anchor.cy + dist * np.sin(angle)
        obj = Obj(scene.next_uid(), a_cat, world.sample_colour(rng, a_cat), round(float(cx), 2), round(float(cy), 2), size)
        x0, y0, x1, y1 = obj.box
        inside = x0 >= 1 and y0 >= 1 and x1 <= scene.resolution - 1 and y1 <= scene.resolution - 1
        if not inside or not off_center(obj.cx, obj.cy, scene.resolution) or any(box_gap(obj.box, o.box) < world.config.min_gap for o in scene.objects):
            continue
        base = edits.add(scene, obj)
        boxes = base.boxes()
        # "embedded in a coherent local cluster" (Sec. 3.2): a neighbour its Cluster view keeps
        if obj.uid in boxes and neighbours(boxes[obj.uid], [b for u, b in boxes.items() if u != obj.uid]):
            return SceneGroup(base, edits.remove_category(base, b_cat), obj.uid, a_cat, b_cat)
    return None


def scene_groups(seed: int, world: World):
    """The scene groups of the suite built with ``seed``, in order, as ``(world seed,
    SceneGroup)``: tried at the world seeds :func:`derive_seed` gives the
    suite seed and a counter, skipping those :func:`_scene_group` rejects. Endless: take what
    you need."""
    seed, attempt = check_seed(seed), 0
    while True:
        attempt += 1
        s = derive_seed(seed, 31, attempt)
        group = _scene_group(world, s)
        if group is not None:
            yield s, group


def build(n_scenes: int = 20, seed: int = 0, margin: float = 0.1, world: World | None = None) -> list[Query]:
    """``10 * n_scenes`` queries (scene groups that cannot be built are skipped and replaced)."""
    seed = check_seed(seed)
    check_margin(margin)
    check_count(n_scenes, "n_scenes")
    world = world or World(BIASED)
    queries: list[Query] = []
    for built, (_, group) in zip(range(n_scenes), scene_groups(seed, world)):
        views = do_views(group.base, group.a_uid, margin)
        full = {"A": views.full, "B": group.absent.render()}
        sid = f"dobench-{seed}-{built}"
        for level in range(4):
            for series, cat, truth in (("A", group.a_category, "yes"), ("B", group.b_category, "no")):
                prior = do_prior(level, cat, negative=(series == "A"))
                queries.append(Query(f"{sid}-{series}{level}-Full", "dobench", [full[series]],
                                     existence_question(cat, prior), "yes_no", truth,
                                     {"scene_id": sid, "series": series, "level": level, "view": "Full",
                                      "object": cat}))
        for view, image in (("Cluster", views.cluster), ("Crop", views.crop)):
            queries.append(Query(f"{sid}-A0-{view}", "dobench", [image], existence_question(group.a_category),
                                 "yes_no", "yes",
                                 {"scene_id": sid, "series": "A", "level": 0, "view": view,
                                  "object": group.a_category, "margin": margin}))
    return queries
