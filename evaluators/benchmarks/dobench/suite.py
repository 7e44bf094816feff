"""DO-Bench's 10-instance protocol (Sec. 3.1) on scenes of the counterfactual world.

Per scene group:

* an **A-object**, present but contextually unconventional (a park object in a kitchen
  and vice versa), small and placed next to other objects -- "off-center and embedded in a
  coherent local cluster, so that recognition depends on localized grounding";
* a **B-object**, contextually typical but absent: a typical object of the scene is
  removed by an exact edit (the background shows through);
* instances A0-A3 and B0-B3 in the Full view (the prior sentence of DO-Bench's templates
  at levels 0-3; for B the positive form, our choice since the paper prints only A), and
  A0 in the Cluster and Crop views cut from the 2x source (128 px for the organism's 64 px
  input) with the given margin.

Our departure (session 37's audit): every instance of a group, A's included, is cut from
the one scene with A added *and* B removed, so the A- and B-questions are asked of the same
image and differ only in the object asked about. The paper's A-series is the base scene
("Base scenes (A-series) ... Absent counterparts (B-series). For each scene, we remove a
contextually typical B-object", Sec. 3.2), with B still in it; a future suite version may
cut A0-A3 and its views from the scene before the removal (it would move every DO-Bench
figure in the README). About 9% of groups have no neighbour of A within one A-size, so
their Cluster view is :func:`~evaluators.world.views.cluster_box`'s no-neighbour window.

Records carry ``series``, ``level``, ``view`` for :mod:`.metrics`.
"""

from __future__ import annotations

import numpy as np

from ...organism.tasks import do_prior, existence_question
from ...query import Query
from ...world import BIASED, CATEGORIES, CONTEXT_CATEGORIES, Obj, World, box_gap, check_count, check_seed, derive_seed, do_views, edits
from ...world.views import check_margin



def _scene_group(world: World, seed: int):
    """(scene with A added and B removed, A uid, A category, B category) or None."""
    rng = np.random.default_rng([seed, 31])
    scene = world.scene(seed)
    typical = CONTEXT_CATEGORIES[scene.context]
    present_typical = [c for c in typical if scene.present(c)]
    if not present_typical:
        return None
    b_cat = present_typical[int(rng.integers(len(present_typical)))]
    scene = edits.remove_category(scene, b_cat)
    odd = [c for c in CATEGORIES if c not in typical and not scene.present(c)]
    a_cat = odd[int(rng.integers(len(odd)))]
    anchors = list(scene.objects)
    if not anchors:
        return None
    for _ in range(50):  # small, next to an existing object
        anchor = anchors[int(rng.integers(len(anchors)))]
        size = world.sample_size(rng, small=True)
        angle = rng.uniform(0, 2 * np.pi)
        dist = anchor.size / 2 + size / 2 + rng.uniform(3, 8)
        cx, cy = anchor.cx + dist * np.cos(angle), anchor.cy + dist * np.sin(angle)
        obj = Obj(scene.next_uid(), a_cat, world.sample_colour(rng, a_cat), round(float(cx), 2), round(float(cy), 2), size)
        x0, y0, x1, y1 = obj.box
        inside = x0 >= 1 and y0 >= 1 and x1 <= scene.resolution - 1 and y1 <= scene.resolution - 1
        if inside and all(box_gap(obj.box, o.box) >= world.config.min_gap for o in scene.objects):
            return edits.add(scene, obj), obj.uid, a_cat, b_cat
    return None


def scene_groups(seed: int, world: World):
    """The scene groups of the suite built with ``seed``, in order, as ``(world seed,
    (scene, A uid, A category, B category))``: tried at the world seeds :func:`derive_seed` gives the
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
        scene, a_uid, a_cat, b_cat = group
        views = do_views(scene, a_uid, margin)
        sid = f"dobench-{seed}-{built}"
        for level in range(4):
            for series, cat, truth in (("A", a_cat, "yes"), ("B", b_cat, "no")):
                prior = do_prior(level, cat, negative=(series == "A"))
                queries.append(Query(f"{sid}-{series}{level}-Full", "dobench", [views.full],
                                     existence_question(cat, prior), "yes_no", truth,
                                     {"scene_id": sid, "series": series, "level": level, "view": "Full",
                                      "object": cat}))
        for view, image in (("Cluster", views.cluster), ("Crop", views.crop)):
            queries.append(Query(f"{sid}-A0-{view}", "dobench", [image], existence_question(a_cat), "yes_no", "yes",
                                 {"scene_id": sid, "series": "A", "level": 0, "view": view, "object": a_cat,
                                  "margin": margin}))
    return queries
