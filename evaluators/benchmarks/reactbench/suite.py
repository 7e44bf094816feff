"""ReactBench's four cause-driven tasks (Sec. 3.1) on exact world edits, each asked as
multiple choice (MC), short answer (SA) and yes/no (YN) in the standard mode.

* **Relational Erasure** (co-occurrence): a companion (fork) removed from beside its cue
  (knife). YN "is there a fork ...?" (no); SA "how many fork are there ?" (zero); MC which
  of four objects is in the image.
* **Counterfactual Attribute** (language prior): a dominant-colour object recoloured (a
  blue banana). SA "what colour is the banana ?"; YN "is the banana yellow ?" (no); MC over
  four colours.
* **Alteration Tracing** (cross-image comparison): before/after pairs (move, add, remove,
  replace). SA "what changed between the two images ?" (graded by its keywords: the
  object(s) and the verb); YN "was the <object> <verb> ?"; MC over four descriptions.
* **Dense Counting** (fine-grained perception): 3-9 small instances. SA exact count; MC
  over four intervals (the interval setting); YN "are there k ...?" (k right half the time).

Only the ``direct`` inducing dimension, the ``none`` hint and the standard mode are built
here (the organism's vocabulary has no commonsense/premise/absurd phrasings); user data in
the JSON Lines schema can carry the others. Records: ``task``, ``qtype``, ``mode`` and the
task's breakdown field.
"""

from __future__ import annotations

import numpy as np

from ...organism.tasks import NUMBERS, OPTION_LETTERS, existence_question
from ...query import Query
from ...world import BIASED, CATEGORIES, COLOURS, World, change_pair, check_count, check_seed, edits
from ...world.sets import CHANGE_KINDS

VERB = {"remove": "removed", "add": "added", "replace": "replaced", "move": "moved"}


def _mc(question: str, options: list[str]) -> str:
    return f"{question} " + " ".join(f"{OPTION_LETTERS[i]} ) {o}" for i, o in enumerate(options))


def _shuffle(rng, right: str, wrong: list[str]) -> tuple[list[str], str]:
    options = [right, *wrong[:3]]
    order = rng.permutation(len(options))
    options = [options[int(i)] for i in order]
    return options, OPTION_LETTERS[options.index(right)]


def build(n_per_task: int = 10, seed: int = 0, world: World | None = None) -> list[Query]:
    seed = check_seed(seed)
    check_count(n_per_task, "n_per_task")
    world = world or World(BIASED)
    rng = np.random.default_rng([seed, 61])
    queries: list[Query] = []
    base = seed * 1_000_003 + 6_000_000_000
    dominant = {c: colour for c, (colour, _) in world.config.dominant_colour.items()}

    def q(qid, task, qtype, images, prompt, kind, truth, extra, options=None):
        queries.append(Query(qid, "reactbench", images, prompt, kind, truth,
                             {"task": task, "qtype": qtype, "mode": "standard", **extra}, options=options))

    # Relational Erasure
    k, s = 0, base
    while k < n_per_task:
        s += 1
        scene = world.scene(s)
        pair = next(((c, t) for c, t, _ in world.config.cooccurrence if scene.present(c) and scene.present(t)), None)
        if pair is None:
            continue
        cue, target = pair
        erased = edits.remove_category(scene, target)
        img, rid, extra = [erased.render()], f"react-{seed}-re-{k}", {"dimension": "direct", "target": target}
        q(f"{rid}-YN", "relational_erasure", "YN", img, existence_question(target), "yes_no", "no", extra)
        q(f"{rid}-SA", "relational_erasure", "SA", img, f"how many {target} are there ?", "number", 0, extra)
        present = sorted(erased.categories())
        absent = [c for c in CATEGORIES if c not in present and c != target]
        right = present[int(rng.integers(len(present)))]
        options, letter = _shuffle(rng, right, [target] + list(rng.choice(absent, 2, replace=False)))
        q(f"{rid}-MC", "relational_erasure", "MC", img, _mc("which is in the image ?", options), "option", letter,
          extra, options)
        k += 1

    # Counterfactual Attribute
    k, s = 0, base + 100_000
    while k < n_per_task:
        s += 1
        scene = world.scene(s)
        objs = [o for o in scene.objects if o.category in dominant and scene.count(o.category) == 1
                and o.size >= 0.12 * scene.resolution]
        if not objs:
            continue
        obj = objs[0]
        usual = dominant[obj.category]
        other = [c for c in COLOURS if c != usual][k % (len(COLOURS) - 1)]
        img = [edits.recolour(scene, obj.uid, other).render() if obj.colour != other else scene.render()]
        rid, extra = f"react-{seed}-ca-{k}", {"dimension": "direct", "object": obj.category}
        q(f"{rid}-SA", "counterfactual_attribute", "SA", img, f"what colour is the {obj.category} ?", "choice", other,
          extra, list(COLOURS))
        q(f"{rid}-YN", "counterfactual_attribute", "YN", img, f"is the {obj.category} {usual} ? answer yes or no .",
          "yes_no", "no", extra)
        wrong = [usual] + [c for c in COLOURS if c not in (usual, other)]
        options, letter = _shuffle(rng, other, [wrong[0], *rng.choice(wrong[1:], 2, replace=False)])
        q(f"{rid}-MC", "counterfactual_attribute", "MC", img, _mc(f"what colour is the {obj.category} ?", options),
          "option", letter, extra, options)
        k += 1

    # Alteration Tracing
    for k in range(n_per_task):
        kind = CHANGE_KINDS[k % len(CHANGE_KINDS)]
        pair = change_pair(world, base + 200_000 + k, kind)
        if kind == "replace":
            said = f"the {pair.category} was replaced by a {pair.detail}"
            keys = [pair.category, "replaced", pair.detail]
        elif kind == "move":
            said, keys = f"the {pair.category} moved {pair.detail}", [pair.category, "moved", pair.detail]
        elif kind == "add":
            said, keys = f"a {pair.category} was added", [pair.category, "added"]
        else:
            said, keys = f"the {pair.category} was removed", [pair.category, "removed"]
        imgs, rid, extra = [pair.before.render(), pair.after.render()], f"react-{seed}-at-{k}", {"hint": "none"}
        q(f"{rid}-SA", "alteration_tracing", "SA", imgs, "what changed between the two images ?", "keywords", keys,
          extra)
        q(f"{rid}-YN", "alteration_tracing", "YN", imgs, f"was the {pair.category} {VERB[kind]} ? answer yes or no .",
          "yes_no", "yes", extra)
        others = [f"the {c} was removed" for c in CATEGORIES if c != pair.category]
        options, letter = _shuffle(rng, said, list(rng.choice(others, 3, replace=False)))
        q(f"{rid}-MC", "alteration_tracing", "MC", imgs, _mc("what changed between the two images ?", options),
          "option", letter, extra, options)

    # Dense Counting
    intervals = [(0, 2), (3, 5), (6, 8), (9, 11)]
    for k in range(n_per_task):
        category = list(CATEGORIES)[int(rng.integers(len(CATEGORIES)))]
        count = int(rng.integers(3, 10))
        scene = world.dense_scene(base + 300_000 + k, category, count, small=True)
        img, rid = [scene.render()], f"react-{seed}-dc-{k}"
        q(f"{rid}-SA", "dense_counting", "SA", img, f"how many {category} are there ?", "number", count,
          {"count_setting": "exact"})
        texts = [f"{NUMBERS[a]} to {NUMBERS[b] if b < len(NUMBERS) else 'ten'}" for a, b in intervals]
        right = next(i for i, (a, b) in enumerate(intervals) if a <= count <= b)
        q(f"{rid}-MC", "dense_counting", "MC", img, _mc(f"how many {category} are there ?", texts), "option",
          OPTION_LETTERS[right], {"count_setting": "interval", "interval": list(intervals[right])}, texts)
        asked = count if rng.random() < 0.5 else int(rng.choice([c for c in range(2, 11) if c != count]))
        q(f"{rid}-YN", "dense_counting", "YN", img,
          f"are there {NUMBERS[asked]} {category} ? answer yes or no .", "yes_no",
          "yes" if asked == count else "no", {"count_setting": "exact"})
    return queries
