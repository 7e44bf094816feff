"""Causal-HalBench's intervention (Sec. 3-4) on world scenes with a co-occurring pair.

The world's co-occurrence knob makes ``knife -> fork`` and ``bench -> tree`` high
co-occurrence pairs. For a base scene X holding both, the *target* o_t (the companion) is
replaced in place by a low co-occurrence object o_cf (one from the other context), giving
X_cf -- an exact version of the paper's counterfactual inpainting. Questions (Sec. 4.3):

* contextual ``Q_c``: the cue o_c (present in X and X_cf; GT yes);
* absent ``Q_a``: an object of the scene's context absent from both images (GT no);
* counterfactual ``Q_cf``: o_cf, asked on X_cf only (GT yes);
* a caption of X and of X_cf ("describe the image ."), scored with CHAIR (Sec. 5.2) against
  the scene's objects.

Our choice where the paper leaves room: Q_a picks a context-typical absent object, the
kind a co-occurrence prior would complete. Records: ``image_type``, ``question_type``,
``pair_id`` for :mod:`.metrics`.
"""

from __future__ import annotations

import numpy as np

from ...organism.tasks import existence_question
from ...query import Query
from ...world import BIASED, CONTEXT_CATEGORIES, World, check_count, check_seed, derive_seed, edits



def build(n_pairs: int = 30, seed: int = 0, world: World | None = None) -> list[Query]:
    seed = check_seed(seed)
    check_count(n_pairs, "n_pairs")
    world = world or World(BIASED)
    rng = np.random.default_rng([seed, 51])
    queries: list[Query] = []
    s, built = 0, 0
    while built < n_pairs:
        s += 1
        scene = world.scene(derive_seed(seed, 51, s))
        pair = next(((c, t) for c, t, _ in world.config.cooccurrence
                     if scene.count(c) == 1 and scene.count(t) == 1), None)
        if pair is None:
            continue
        cue, target = pair
        home = next(ctx for ctx, cats in CONTEXT_CATEGORIES.items() if cue in cats)
        typical = CONTEXT_CATEGORIES[home]
        other = [c for ctx, cats in CONTEXT_CATEGORIES.items() if ctx != home for c in cats]
        cf = [c for c in other if not scene.present(c) and edits.can_replace(scene.of(target)[0], c)]
        absent = [c for c in typical if not scene.present(c)]
        if not cf or not absent:
            continue
        o_cf = cf[int(rng.integers(len(cf)))]
        o_a = absent[int(rng.integers(len(absent)))]
        counterfactual = edits.replace(scene, scene.of(target)[0].uid, o_cf)
        pid = f"chb-{seed}-{built}"
        for image_type, img in (("original", scene), ("counterfactual", counterfactual)):
            rows = [("contextual", cue, "yes"), ("absent", o_a, "no")]
            if image_type == "counterfactual":
                rows.append(("counterfactual", o_cf, "yes"))
            queries.append(Query(f"{pid}-{image_type}-caption", "causal_halbench", [img.render()],
                                 "describe the image .", "text", None,
                                 {"image_type": image_type, "objects": sorted(img.categories()), "pair_id": pid}))
            for qtype, obj, truth in rows:
                queries.append(Query(f"{pid}-{image_type}-{qtype}", "causal_halbench", [img.render()],
                                     existence_question(obj), "yes_no", truth,
                                     {"image_type": image_type, "question_type": qtype, "pair_id": pid,
                                      "object": obj, "target": target}))
        built += 1
    return queries


def assemble(rows: list[dict]) -> list[dict]:
    """Caption answers become CHAIR records (``caption``, ``objects``); QA rows pass through."""
    out = []
    for r in rows:
        if r.get("invalid_input"):
            continue
        if "objects" in r and "question_type" not in r:
            out.append({**r, "caption": r.get("answer") or ""})
        else:
            out.append(r)
    return out
