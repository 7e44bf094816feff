"""Causal-HalBench's intervention (Sec. 4.1-4.3) on world scenes.

Objects are chosen as the paper's pipeline chooses them (Sec. 4.1, "Intervention Objects
Selection"), by co-occurrence frequency (:func:`evaluators.world.cooccurrence`, counted on
the world's own scenes as the paper counts on MSCOCO's annotations):

* a **target** ``o_t``: an object of the scene (the paper designates each annotated object
  in turn; we draw one per base scene, uniformly, so that ``n_pairs`` counts base scenes;
  only a category the scene holds once, so that ``X_cf`` lacks it);
* a **contextual object** ``o_c``: another object of the scene, drawn with probability
  proportional to its co-occurrence frequency with ``o_t`` ("Contextual Sampling");
* a **counterfactual object** ``o_cf``: the candidate pool is the :data:`CF_POOL`
  categories absent from the scene of lowest co-occurrence frequency with ``o_c``
  ("Counterfactual Selection"); Gemini's pick among them for visual suitability becomes a
  uniform draw among those that, put in ``o_t``'s place, are at least as large as the
  world's smallest objects (``WorldConfig.small_size``; a fork's thin box holds only a
  2-3 px square, smaller than anything the world draws and under a pixel at the
  organism's input). ``X_cf`` is ``X`` with ``o_t`` replaced in place by ``o_cf`` -- an
  exact version of the paper's inpainting;
* **absent objects** ``o_a``: the :data:`N_ABSENT` categories absent from both images that
  most frequently appear with ``o_t`` (Sec. 4.2, "top-k absent objects that frequently
  appear with the original target object"; k = 2 as Table 1's counts imply: 2774 "no"
  questions for 1387 counterfactual images, on either image type).

Questions (Sec. 4.2-4.3, "Is there {object} in this image?" in the organism's wording):
``Q_c`` (``o_c``, GT yes) and the two ``Q_a`` (GT no) on both images, ``Q_cf`` (``o_cf``,
GT yes) on ``X_cf`` only, and a caption of each image ("describe the image .") scored with
CHAIR (Sec. 5.2) against the image's objects. The caption prompt is ours: the paper's
(Sec. 5.2, Table 4: "Provide a brief description of the given image.") uses words the
organism was not trained on; it
was trained on "describe the image ." object lists.

Until session 33 the suite always took the world's co-occurrence pairs as (``o_c``,
``o_t``) = (knife, fork) or (bench, tree), ``o_a`` from the cue's context and ``o_cf``
from the other one; then the object's name and the background's context alone gave the
answer (a rule using nothing else scored Acc 93, CHR 9, CAC = AAC = 0).

The world's planted pairs (knife -> fork, bench -> tree) are probed only where the paper's
rules meet them: ``o_t`` a companion and ``o_c`` its cue, with the absent questions about
other objects; an absent companion next to its cue is MIOH's hard negatives' and the
organism card's co-occurrence signature's question, not this protocol's.

Records: ``image_type``, ``question_type``, ``pair_id``, ``question`` (CPR pairs the two
absent questions by it) for :mod:`.metrics`, plus the objects of the triplet.
"""

from __future__ import annotations

import numpy as np

from ...answers import after_reasoning
from ...organism.tasks import existence_question
from ...query import Query
from ...world import BIASED, World, check_count, check_seed, derive_seed, edits
from ...world.cooccurrence import Cooccurrence, cooccurrence
from ...world.scene import Scene

#: How many lowest-co-occurrence categories form the counterfactual candidate pool (the
#: paper's "top-k", k not given; 3 of the vocabulary's 10 categories).
CF_POOL = 3
#: Absent questions per image (Table 1: two per counterfactual image).
N_ABSENT = 2
_STREAM = 51
MAX_TRIES = 50  # base scenes tried per pair before a world is refused (BIASED: each of 400 tried gave one)
CAPTION_PROMPT = "describe the image ."


def triplet(scene: Scene, stats: Cooccurrence, rng: np.random.Generator,
            min_size: float = 0.0) -> tuple[str, str, str, list[str]] | None:
    """``(o_t, o_c, o_cf, [o_a, ...])`` for ``scene`` by the rules in the module notes, or
    None when no object of the scene admits all of them. ``min_size``: the smallest size
    (in source pixels, as ``Obj.size``) ``o_cf`` may have in ``o_t``'s place."""
    present = sorted(scene.categories())
    targets = [c for c in present if scene.count(c) == 1]
    for t in (targets[i] for i in rng.permutation(len(targets))):
        context = [c for c in present if c != t]
        if not context:
            continue
        weights = np.array([stats(t, c) for c in context], dtype=float)
        # no sampled scene held them together: every candidate alike (the paper's sampling
        # has no such case; COCO pairs that never co-occur are not drawn either way)
        weights = weights / weights.sum() if weights.sum() > 0 else np.full(len(context), 1 / len(context))
        o_c = context[int(rng.choice(len(context), p=weights))]
        absent = [c for c in stats.counts if c not in present]
        pool = stats.ranked(o_c, absent, lowest=True)[:CF_POOL]
        obj = scene.of(t)[0]
        fits = [c for c in pool if edits.can_replace(obj, c) and edits.replaced_size(obj, c) >= min_size]
        if not fits:
            continue
        o_cf = fits[int(rng.integers(len(fits)))]
        o_a = stats.ranked(t, [c for c in absent if c != o_cf])[:N_ABSENT]
        if len(o_a) < N_ABSENT:
            continue
        return t, o_c, o_cf, o_a
    return None


def build(n_pairs: int = 30, seed: int = 0, world: World | None = None) -> list[Query]:
    seed = check_seed(seed)
    check_count(n_pairs, "n_pairs")
    world = world or World(BIASED)
    stats = cooccurrence(world)
    min_size = world.config.small_size[0] * world.config.resolution
    queries: list[Query] = []
    s, built = 0, 0
    while built < n_pairs:
        s += 1
        if s > MAX_TRIES * n_pairs:
            raise ValueError(f"world: only {built} of {n_pairs} pairs in {s - 1} scenes; its scenes rarely hold "
                             "a target with a contextual object, a counterfactual and two absent objects")
        scene = world.scene(derive_seed(seed, _STREAM, s))
        chosen = triplet(scene, stats, np.random.default_rng([seed, _STREAM, s]), min_size)
        if chosen is None:
            continue
        target, o_c, o_cf, o_a = chosen
        uid = scene.of(target)[0].uid
        counterfactual = edits.replace(scene, uid, o_cf)
        pid = f"chb-{seed}-{built}"
        about = {"pair_id": pid, "context": scene.context, "target": target, "context_object": o_c,
                 "counterfactual_object": o_cf,
                 "counterfactual_size": round(next(o.size for o in counterfactual.objects if o.uid == uid), 2)}
        for image_type, img in (("original", scene), ("counterfactual", counterfactual)):
            image = img.render()
            rows = [("contextual", "contextual", o_c, "yes")]
            rows += [(f"absent{k}", "absent", obj, "no") for k, obj in enumerate(o_a)]
            if image_type == "counterfactual":
                rows.append(("counterfactual", "counterfactual", o_cf, "yes"))
            queries.append(Query(f"{pid}-{image_type}-caption", "causal_halbench", [image], CAPTION_PROMPT, "text",
                                 None, {"image_type": image_type, "objects": sorted(img.categories()), **about}))
            for name, qtype, obj, truth in rows:
                question = existence_question(obj)
                queries.append(Query(f"{pid}-{image_type}-{name}", "causal_halbench", [image], question, "yes_no",
                                     truth, {"image_type": image_type, "question_type": qtype, "object": obj,
                                             "question": question, **about}))
        built += 1
    return queries


def assemble(rows: list[dict]) -> list[dict]:
    """Caption answers become CHAIR records (``caption``, ``objects``); QA rows pass through.

    A pair (``pair_id``: an original image and its counterfactual) with an image that could
    not be asked (``invalid_input``: missing or corrupt) is left out whole: CAC and AAC
    compare the two images' accuracies (Eq. 4-5), and keeping the other image's answers had
    compared 12 original contextual answers with 11 counterfactual ones (an audit: a model
    that answers both images alike scored CAC -6.8 instead of 0). The runner counts the
    unusable inputs; rows without a ``pair_id`` are kept one by one.

    In the authors' ``qa.json`` (:mod:`evaluators.benchmarks.protocols`) ``pair_id`` is the
    base image, so what goes whole is the original *and every counterfactual made from it*:
    one missing counterfactual file also leaves out its siblings' answers. That is a choice:
    the original is asked each question once per counterfactual and nothing in the file
    links a repeat to its counterfactual, so the original's side cannot be cut to match the
    counterfactuals that remain; dropping the group keeps CAC and AAC comparing the same
    images, at the cost of answers that could be read."""
    broken = {r["pair_id"] for r in rows if r.get("invalid_input") and r.get("pair_id") is not None}
    out = []
    for r in rows:
        if r.get("invalid_input") or (r.get("pair_id") is not None and r["pair_id"] in broken):
            continue
        if "objects" in r and "question_type" not in r:
            # a reasoning model's think block is no caption (evaluators.answers.after_reasoning)
            out.append({**r, "caption": after_reasoning(r.get("answer") or "") or ""})
        else:
            out.append(r)
    return out
