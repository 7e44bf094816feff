"""ReactBench's four cause-driven tasks (Sec. 3.1) on exact world edits, each asked as
multiple choice (MC), short answer (SA) and yes/no (YN) in the standard mode.

* **Relational Erasure** (co-occurrence): a companion (fork) removed from beside its cue
  (knife). YN "is there a fork ...?" (no); SA "how many fork are there ?" (zero); MC which
  of four objects is in the image.
* **Counterfactual Attribute** (language prior): a dominant-colour object recoloured (a
  blue banana). SA "what colour is the banana ?"; YN "is the banana blue ?" (yes) on every
  other item, "is the banana red ?" (no: another unusual colour) on the rest; MC over four
  colours.
* **Alteration Tracing** (cross-image comparison): before/after pairs (move, add, remove,
  replace). SA "what changed between the two images ?" (graded by its keywords: the
  object(s) and the verb); YN "was the <object> <verb> ?" (about the change half the
  time, else about a wrong one); MC over four descriptions in a 2 x 2 design (the changed
  object or another, the change's kind or another), so no option stands out.
* **Dense Counting** (fine-grained perception): 2-9 small instances. SA exact count; MC
  over four intervals in shuffled order (the interval setting); YN "are there k ...?" (k
  right half the time).

Relational Erasure's YN and SA questions ask about the erased object, so their answer is
always the same ("no", zero) -- the paper's design (Sec. 3.1: "evaluated by questions about
the existence of the erased object"). Counterfactual Attribute's YN question asks about the
drawn colour on even-numbered items (yes) and about another colour that is not the usual
one on odd-numbered items (no). The paper says only "questions about the counterfactual
attribute", and its Table 4's CA YN accuracies (67%) say its answers vary. Both colours
asked are drawn uniformly from the unusual ones, so the question's words say nothing about
its answer; asking the usual colour on the "no" items would have (a text-only rule scored
86% against 50%: "the usual colour is never right"), and the usual-colour bait is the
commonsense dimension's. Alternating, rather than a coin, keeps the split exact at every
size. Until session 38 it always asked the usual colour (a constant "no" gained about 1
React-Score point), and the drawn colour cycled with the item's index (a constant "blue"
short answer scored 22% against 14% chance); it is now drawn from the item's own stream. The absurd-contrast choices' answers are fixed too ("neither"; the drawn colour): a
policy that never looks at the image and answers "no", "zero" and "a" scores 40.2 and 39.1
React-Score on ``--scale full`` seeds 0 and 1 (the paper's LLaVA-v1.6-7B: 34.5;
``tests/test_suites.py`` asserts it). Read a
model's score beside the unmitigated baseline and the yes-ratio, as the report does, not
against zero. What our construction leaked beyond that was fixed after an audit: the
right option's position or wording, a cue object that was always the right choice, a
short answer listing every change, counts and intervals that could never be right.

Every inducing dimension and hint of Table 4 is built (our templates: the paper prints
none, Appendix C.1 is not in the text we have):

* Relational Erasure -- *direct* (the three forms above); *commonsense* "a knife usually
  comes with a fork . is there a fork in the image ?" (YN, no); *premise* "is the fork left
  of the knife ?" (YN, no: there is no fork) and "how many fork are next to the knife ?"
  (SA, zero); *absurd* "which is in the image ?" over "a fork", "a knife reading a book" and
  "neither" in shuffled order (MC, neither).
* Counterfactual Attribute -- *direct*; *commonsense* "a banana is usually yellow . is the
  banana yellow ?" (YN, no); *premise* "what colour is the yellow banana ?" (SA, the drawn
  colour); *absurd* MC over the usual colour, the drawn colour and "every colour at once".
* Alteration Tracing -- hint *none* (the three forms above); *location* "look at the upper
  left of the images . what changed between the two images ?" (SA; the quadrant of the
  altered object, before the change or, when added, after it); *operation* "an object was removed . what changed between the two
  images ?" (SA).

The direct and no-hint questions use only the organism's vocabulary; the others use
English words it never saw (they reach it as ``<unk>``), so on the organism they measure
how it copes with unfamiliar phrasing as much as the inducing cue -- read them per
dimension (``results.json`` ``details.breakdown``), and on real models. Only the standard
mode is built by default; ``modes=("standard", "cot")`` adds chain-of-thought prompts
(the question followed by "think step by step , then give the final answer ."), for
models that can reason. That instruction is ours, in the suite's lowercase style: the
paper *prepends* a longer one to the question (App. B.4: "You are an expert visual
reasoning assistant ... Conclude your response by explicitly stating the final answer in a
standalone sentence."), so a chain-of-thought run of this suite is not the paper's prompt;
users' files carry their own question text. Records: ``task``, ``qtype``, ``mode`` and the
task's breakdown field.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...organism.tasks import NUMBERS, OPTION_LETTERS, existence_question
from ...query import Query
from ...world import BIASED, CATEGORIES, COLOURS, CONTEXT_CATEGORIES, World, change_pair, check_count, check_seed, check_subset, derive_seed, edits
from ...world.sets import CHANGE_KINDS

DIMENSIONS = ("direct", "commonsense", "premise", "absurd")
HINTS = ("none", "location", "operation")
MODES = ("standard", "cot")
COT_SUFFIX = "think step by step , then give the final answer ."

VERB = {"remove": "removed", "add": "added", "replace": "replaced", "move": "moved"}
DIRECTIONS = ("left", "right", "up", "down")
#: The words a change description is made of: a short answer that names one of them beyond
#: its truth is wrong, so a list of every category, verb and direction (an image-blind
#: policy's keyword dump, or a hedge "added, moved or removed") is not right on every item.
CHANGE_VOCABULARY = sorted({*CATEGORIES, *VERB.values(), *DIRECTIONS})

#: Dense Counting's counts and interval options (the paper gives none): the intervals tile
#: the counts drawn, each right for two counts ((0, 2) had never been right; until session
#: 34 counts started at 3, so "two to three" was right half as often as the others and a
#: policy avoiding it beat chance without the image), and the options come in a shuffled
#: order.
COUNTS = range(2, 10)
INTERVALS = ((2, 3), (4, 5), (6, 7), (8, 9))


def _mc(question: str, options: list[str]) -> str:
    return f"{question} " + " ".join(f"{OPTION_LETTERS[i]} ) {o}" for i, o in enumerate(options))


def _shuffle(rng, right: str, wrong: list[str]) -> tuple[list[str], str]:
    options = [right, *wrong[:3]]
    order = rng.permutation(len(options))
    options = [options[int(i)] for i in order]
    return options, OPTION_LETTERS[options.index(right)]


def _change_text(category: str, kind: str, detail: str) -> str:
    if kind == "replace":
        return f"the {category} was replaced by a {detail}"
    if kind == "move":
        return f"the {category} moved {detail}"
    return f"a {category} was added" if kind == "add" else f"the {category} was removed"


#: Each change kind's two possible wrong kinds in the multiple choice: the 4-cycle
#: move-remove-add-replace-move. "Remove" and "replace" are never offered together (a
#: replacement removes X too, so "X was removed" would not be wrong), and every kind has two
#: partners, drawn with equal odds: with remove's partners {add, move, replace} against
#: replace's {add, move}, the pair {remove, replace} always had "remove" right and
#: {move, replace} and {add, replace} had "replace" right 3:2, a lean an image-blind policy
#: could read (session 34's audit). Symmetric, equal-sized partner sets make each kind of a
#: pair equally likely right where the kinds are drawn equally often (at n_per_task a
#: multiple of 4; at the small scale's 5 items "move" comes twice).
OTHER_KINDS = {"move": ("remove", "replace"), "add": ("remove", "replace"),
               "remove": ("move", "add"), "replace": ("move", "add")}


def _like_x(rng, pair) -> str:
    """Another object Y drawn as the change drew X, so that neither object of the options is
    the likelier right one: for a move, removal or replacement, another single-instance object
    of the before image (X is one); for an addition, another category absent from it (X was).
    Until session 34 Y was drawn from every category, and picking the option whose object is
    commoner in the world's scenes was right 58% of the time between X and Y (chance 50).
    Where the before image has none, falls back to any other present category (moves,
    removals, replacements) and then to any other category (never needed in 400 pairs,
    seeds 0-3 x 100 items; a review's 2,400 neither)."""
    before, taken = pair.before, (pair.category, pair.detail)
    if pair.kind == "add":
        pools = ([c for c in CATEGORIES if not before.present(c) and c not in taken],)
    else:
        pools = ([o.category for o in before.objects if before.count(o.category) == 1 and o.category not in taken],
                 [c for c in CATEGORIES if before.present(c) and c not in taken])
    pool = next((p for p in pools if p), [c for c in CATEGORIES if c not in taken])
    return pool[int(rng.integers(len(pool)))]


def _change_distractors(rng, pair) -> list[tuple[str, str, str]]:
    """Three wrong descriptions of a change X-v (object X, kind v with its detail d) in a 2 x 2
    design, as ``(category, kind, detail)``: X with another kind w (detail e), another object
    Y with v and d, and Y with w and e. No option is the odd one out: each shares its object
    with one option and its kind and detail with another. With every distractor "the
    <other> was removed", the right answer was the only one with its verb in 30 of 40 items,
    and picking it scored 77.5% without the images (a review's finding). w is one of v's two
    partners in :data:`OTHER_KINDS`, Y is drawn like X (:func:`_like_x`)."""
    partners = OTHER_KINDS[pair.kind]
    other_kind = partners[int(rng.integers(len(partners)))]
    other = _like_x(rng, pair)
    if other_kind == "move":
        detail = DIRECTIONS[int(rng.integers(len(DIRECTIONS)))]
    elif other_kind == "replace":
        new = [c for c in CATEGORIES if c not in (pair.category, other)]
        detail = new[int(rng.integers(len(new)))]
    else:
        detail = ""
    return [(pair.category, other_kind, detail), (other, pair.kind, pair.detail), (other, other_kind, detail)]


def _region(pair) -> str:
    """Where the altered object is ("upper left", "lower right", ...): its place before the
    change (moved, removed, replaced) or after it (added), from the scenes' exact masks."""
    before, after = pair.before.masks(), pair.after.masks()
    changed = [u for u in sorted(set(before) | set(after))
               if u not in before or u not in after or not np.array_equal(before[u], after[u])]
    uid = changed[0]
    mask = before[uid] if uid in before else after[uid]
    ys, xs = np.nonzero(mask)
    cy, cx = ys.mean() / mask.shape[0], xs.mean() / mask.shape[1]
    return f"{'upper' if cy < 0.5 else 'lower'} {'left' if cx < 0.5 else 'right'}"


def build(n_per_task: int = 10, seed: int = 0, world: World | None = None, *,
          dimensions=DIMENSIONS, hints=HINTS, modes=("standard",)) -> list[Query]:
    seed = check_seed(seed)
    check_count(n_per_task, "n_per_task")
    dimensions = check_subset(dimensions, DIMENSIONS, "dimensions")
    hints = check_subset(hints, HINTS, "hints")
    modes = check_subset(modes, MODES, "modes")
    world = world or World(BIASED)
    queries: list[Query] = []

    def world_seed(task: int, k: int) -> int:  # one hashed stream per task: no overflow, no overlap
        return derive_seed(seed, 61, task, k)

    def item_rngs(task: int, k: int):
        """Item k's own option and count draws, so an item is the same at every n_per_task
        (and --scale): a stream shared by all items gave the later tasks other options once
        an earlier task had more items. The inducing variants draw from a second one, so the
        direct questions do not depend on which dimensions are built."""
        return (np.random.default_rng(derive_seed(seed, 62, task, k)),
                np.random.default_rng(derive_seed(seed, 63, task, k)))

    dominant = {c: colour for c, (colour, _) in world.config.dominant_colour.items()}

    def q(qid, task, qtype, images, prompt, kind, truth, extra, options=None, reference=None):
        for mode in modes:
            text, qid_m = (prompt, qid) if mode == "standard" else (f"{prompt} {COT_SUFFIX}", f"{qid}-cot")
            queries.append(Query(qid_m, "reactbench", images, text, kind, truth,
                                 {"task": task, "qtype": qtype, "mode": mode, **extra}, options=options,
                                 reference=reference))

    # Relational Erasure
    k, s = 0, 0
    while k < n_per_task:
        s += 1
        scene = world.scene(world_seed(0, s))
        pair = next(((c, t) for c, t, _ in world.config.cooccurrence if scene.present(c) and scene.present(t)), None)
        if pair is None:
            continue
        cue, target = pair
        erased = edits.remove_category(scene, target)
        present = sorted(erased.categories())
        # the right option is a present object other than the cue, which is in every item, so
        # naming it was right without the image (a review's audit): scenes without one are skipped
        shown = [c for c in present if c != cue]
        if not shown:
            continue
        rng, extra_rng = item_rngs(0, k)
        img, rid = [erased.render()], f"react-{seed}-re-{k}"
        right = shown[int(rng.integers(len(shown)))]
        # the two absent wrong options are of the right option's context (the erased
        # companion is of its own): until session 33 they were drawn from every category, and
        # "the option usual for the background, not fork or tree" was right 75% of the time
        # without the image (a review's blind audit; chance 33% once the companion is out)
        home = next(ctx for ctx, members in CONTEXT_CATEGORIES.items() if right in members)
        absent = [c for c in CONTEXT_CATEGORIES[home] if c not in present and c != target]
        if len(absent) < 2:
            continue
        options, letter = _shuffle(rng, right, [target] + [str(c) for c in rng.choice(absent, 2, replace=False)])
        for dim in dimensions:
            extra = {"dimension": dim, "target": target}
            if dim == "direct":
                q(f"{rid}-YN", "relational_erasure", "YN", img, existence_question(target), "yes_no", "no", extra)
                q(f"{rid}-SA", "relational_erasure", "SA", img, f"how many {target} are there ?", "number", 0, extra)
                q(f"{rid}-MC", "relational_erasure", "MC", img, _mc("which is in the image ?", options), "option",
                  letter, extra, options)
            elif dim == "commonsense":
                q(f"{rid}-{dim}-YN", "relational_erasure", "YN", img,
                  f"a {cue} usually comes with a {target} . {existence_question(target)}", "yes_no", "no", extra)
            elif dim == "premise":
                q(f"{rid}-{dim}-YN", "relational_erasure", "YN", img,
                  f"is the {target} left of the {cue} ? answer yes or no .", "yes_no", "no", extra)
                q(f"{rid}-{dim}-SA", "relational_erasure", "SA", img, f"how many {target} are next to the {cue} ?",
                  "number", 0, extra)
            else:  # absurd contrast: the erased object beside an absurd alternative, and "neither"
                absurd, absurd_letter = _shuffle(extra_rng, "neither", [f"a {target}", f"a {cue} reading a book"])
                q(f"{rid}-{dim}-MC", "relational_erasure", "MC", img, _mc("which is in the image ?", absurd),
                  "option", absurd_letter, extra, absurd)
        k += 1

    # Counterfactual Attribute
    k, s = 0, 0
    while k < n_per_task:
        s += 1
        scene = world.scene(world_seed(1, s))
        objs = [o for o in scene.objects if o.category in dominant and scene.count(o.category) == 1
                and o.size >= 0.12 * scene.resolution]
        if not objs:
            continue
        obj = objs[0]
        rng, extra_rng = item_rngs(1, k)
        usual = dominant[obj.category]
        unusual = [c for c in COLOURS if c != usual]
        other = unusual[int(rng.integers(len(unusual)))]
        decoy = [c for c in unusual if c != other][int(rng.integers(len(unusual) - 1))]
        asked, asked_truth = (other, "yes") if k % 2 == 0 else (decoy, "no")
        img = [edits.recolour(scene, obj.uid, other).render() if obj.colour != other else scene.render()]
        rid, cat = f"react-{seed}-ca-{k}", obj.category
        wrong = [usual] + [c for c in COLOURS if c not in (usual, other)]
        options, letter = _shuffle(rng, other, [wrong[0], *(str(c) for c in rng.choice(wrong[1:], 2, replace=False))])
        absurd, absurd_letter = _shuffle(extra_rng, other, [usual, "every colour at once"])
        for dim in dimensions:
            extra = {"dimension": dim, "object": cat}
            if dim == "direct":
                q(f"{rid}-SA", "counterfactual_attribute", "SA", img, f"what colour is the {cat} ?", "choice", other,
                  extra, list(COLOURS))
                q(f"{rid}-YN", "counterfactual_attribute", "YN", img, f"is the {cat} {asked} ? answer yes or no .",
                  "yes_no", asked_truth, extra)
                q(f"{rid}-MC", "counterfactual_attribute", "MC", img, _mc(f"what colour is the {cat} ?", options),
                  "option", letter, extra, options)
            elif dim == "commonsense":
                q(f"{rid}-{dim}-YN", "counterfactual_attribute", "YN", img,
                  f"a {cat} is usually {usual} . is the {cat} {usual} ? answer yes or no .", "yes_no", "no", extra)
            elif dim == "premise":
                q(f"{rid}-{dim}-SA", "counterfactual_attribute", "SA", img, f"what colour is the {usual} {cat} ?",
                  "choice", other, extra, list(COLOURS))
            else:
                q(f"{rid}-{dim}-MC", "counterfactual_attribute", "MC", img, _mc(f"what colour is the {cat} ?", absurd),
                  "option", absurd_letter, extra, absurd)
        k += 1

    # Alteration Tracing
    yn_tally: Counter = Counter()  # (verb asked, truth) over the items so far
    for k in range(n_per_task):
        kind = CHANGE_KINDS[k % len(CHANGE_KINDS)]
        pair = change_pair(world, world_seed(2, k), kind)
        rng, _ = item_rngs(2, k)
        said = _change_text(pair.category, kind, pair.detail)
        keys = [pair.category, VERB[kind], *([pair.detail] if kind in ("move", "replace") else [])]
        imgs, rid = [pair.before.render(), pair.after.render()], f"react-{seed}-at-{k}"
        wrong = _change_distractors(rng, pair)
        options, letter = _shuffle(rng, said, [_change_text(*w) for w in wrong])
        # The yes/no question asks about the change on every other item ((k + k // 4) % 2: 6
        # of 12 at full scale), else (no) about Y with X's verb or X with a partner verb, the
        # verb whose questions have been answered "yes" most often so far, so that no verb
        # tells the answer: always asking about the change made "yes" right every time; a coin
        # per item drew 9 "yes" of 12 on one full-scale seed and 2 on the other; and the
        # alternation alone left "was ... moved / removed ?" mostly "yes" and "added /
        # replaced" mostly "no" (a blind rule on the verb: 62.6% at full scale, 76.5% at
        # small; a review's finding). Depends on k only: an item is the same at every scale.
        about_change = (k + k // len(CHANGE_KINDS)) % 2 == 0
        if about_change:
            yn_about = (pair.category, kind)
        else:
            verb = max((kind, *OTHER_KINDS[kind]), key=lambda v: yn_tally[v, "yes"] - yn_tally[v, "no"])
            yn_about = (wrong[1][0], kind) if verb == kind else (pair.category, verb)
        yn_tally[yn_about[1], "yes" if about_change else "no"] += 1
        asked = "what changed between the two images ?"
        for hint in hints:
            extra = {"hint": hint}
            if hint == "none":
                q(f"{rid}-SA", "alteration_tracing", "SA", imgs, asked, "keywords", keys, extra, CHANGE_VOCABULARY,
                  said)
                q(f"{rid}-YN", "alteration_tracing", "YN", imgs,
                  f"was the {yn_about[0]} {VERB[yn_about[1]]} ? answer yes or no .", "yes_no",
                  "yes" if yn_about == (pair.category, kind) else "no", extra)
                q(f"{rid}-MC", "alteration_tracing", "MC", imgs, _mc(asked, options), "option", letter, extra, options)
            elif hint == "location":
                q(f"{rid}-{hint}-SA", "alteration_tracing", "SA", imgs,
                  f"look at the {_region(pair)} of the images . {asked}", "keywords", keys, extra, CHANGE_VOCABULARY,
                  said)
            else:
                q(f"{rid}-{hint}-SA", "alteration_tracing", "SA", imgs, f"an object was {VERB[kind]} . {asked}",
                  "keywords", keys, extra, CHANGE_VOCABULARY, said)

    # Dense Counting
    for k in range(n_per_task):
        rng, _ = item_rngs(3, k)
        category = list(CATEGORIES)[int(rng.integers(len(CATEGORIES)))]
        count = int(rng.integers(COUNTS.start, COUNTS.stop))
        scene = world.dense_scene(world_seed(3, k), category, count, small=True)
        img, rid = [scene.render()], f"react-{seed}-dc-{k}"
        q(f"{rid}-SA", "dense_counting", "SA", img, f"how many {category} are there ?", "number", count,
          {"count_setting": "exact"})
        # a wrong count asked is one the item could have had (1 or 10 never was: "no" without the image)
        asked = count if rng.random() < 0.5 else int(rng.choice([c for c in COUNTS if c != count]))
        bounds = next((a, b) for a, b in INTERVALS if a <= count <= b)
        texts = {(a, b): f"{NUMBERS[a]} to {NUMBERS[b]}" for a, b in INTERVALS}
        texts, letter = _shuffle(rng, texts[bounds], [t for i, t in texts.items() if i != bounds])
        q(f"{rid}-MC", "dense_counting", "MC", img, _mc(f"how many {category} are there ?", texts), "option",
          letter, {"count_setting": "interval", "interval": list(bounds)}, texts)
        q(f"{rid}-YN", "dense_counting", "YN", img,
          f"are there {NUMBERS[asked]} {category} ? answer yes or no .", "yes_no",
          "yes" if asked == count else "no", {"count_setting": "exact"})
    return queries
