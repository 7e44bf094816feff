"""The built-in suites are sized in one place for both CLIs."""

from __future__ import annotations

import pytest

from evaluators.benchmarks.suites import SCALES, build_queries, build_suite
from evaluators.organism.tasks import NUMBERS
from evaluators.world import BIASED


def test_scales_size_each_suite():
    for task, n in SCALES["small"].items():
        assert n < SCALES["full"][task] < SCALES["large"][task]
    assert len(build_suite("dobench", seed=0, scale="small")) == 10 * SCALES["small"]["dobench"]
    queries = build_queries(["dobench", "reactbench"], seed=0, scale="small")
    assert {q.benchmark for q in queries} == {"dobench", "reactbench"}


def test_chosen_tasks_default_to_none_when_the_users_data_is_given():
    """``--tasks`` as given, ``""`` for none; without it the command's default, or no built-in
    suite at all when ``--data`` names the user's files; an unknown suite is an error."""
    from evaluators.benchmarks.suites import chosen_tasks

    assert chosen_tasks(None, "", "dobench,mioh") == ["dobench", "mioh"]
    assert chosen_tasks(None, "dobench=my.jsonl", "dobench,mioh") == []
    assert chosen_tasks("mioh", "dobench=my.jsonl", "dobench") == ["mioh"]
    assert chosen_tasks("", "", "dobench") == [] and chosen_tasks(" , ", "", "dobench") == []
    with pytest.raises(ValueError, match="unknown task"):
        chosen_tasks("pope", "", "dobench")
    # one benchmark from both sources would be scored as one: refused
    with pytest.raises(ValueError, match=r"\['dobench', 'mioh'\] in both --tasks and --data"):
        chosen_tasks("dobench,mioh", "mioh=x.jsonl, dobench=y.jsonl", "dobench")
    # ... unless the command keeps them apart (blind_audit audits each source on its own)
    assert chosen_tasks("dobench", "dobench=y.jsonl", "", pooled=False) == ["dobench"]


def test_large_mioh_has_four_times_the_questions_of_full_and_unique_ids():
    full, large = build_suite("mioh", seed=0, scale="full"), build_suite("mioh", seed=0, scale="large")
    assert len(large) == 4 * len(full)
    assert len({q.id for q in large}) == len(large)
    count = lambda qs, c, t: sum(q.record["condition"] == c and q.record["qtype"] == t and "decomposed_of" not in q.record
                                 for q in qs)
    for qtype in ("selective", "comprehensive"):
        assert count(large, "LC-S", qtype) == count(large, "LC-I", qtype) == 48


@pytest.mark.parametrize("seed", [0, 1])
def test_mioh_hard_negatives_are_not_answered_by_none_of_the_above(seed):
    """HN holds a large target in the sets where easy does (3 of 4) and its cue in every
    image, so "none of the above" scores on HN what it scores on easy (until session 31 it
    was right for every hard negative); each HN target is held in some sets, not in others."""
    queries = [q for q in build_suite("mioh", seed=seed, scale="full") if q.record["qtype"] == "selective"]
    asked = {c: [q for q in queries if q.record["condition"] == c] for c in ("easy", "HN")}
    held = {c: [q.record["present"] for q in qs] for c, qs in asked.items()}
    assert held["HN"] == held["easy"] and sum(held["HN"]) == 3 * len(held["HN"]) // 4
    for q in asked["HN"]:
        assert (q.options[ord(q.truth) - ord("a")] == "none of the above") == (not q.record["present"])
    for target in {q.record["target"] for q in asked["HN"]}:
        assert {q.record["present"] for q in asked["HN"] if q.record["target"] == target} == {True, False}, target


def test_mioh_sets_change_only_where_a_session_meant_them_to():
    """Digests of the MIOH queries (ids, prompts, truths, options, pixels) at the small
    scale. Session 32 changed the HN sets only; session 33 the easy sets (and the NI and LC
    sets built as easy ones: every image of the target's unusual context, the holder
    included), and left HP and HN as they were; session 34 every set that holds the target
    (swapped in for one of the holder's objects, not added). A change of the suite that
    moves a set must change its digest here on purpose."""
    import hashlib

    from evaluators.query import fingerprint

    queries = build_suite("mioh", seed=0, scale="small")

    def digest(conditions):
        kept = [q for q in queries if q.record["condition"] in conditions]
        return len(kept), hashlib.sha256("".join(q.id + fingerprint(q) for q in kept).encode()).hexdigest()[:16]

    assert digest({"HP"}) == (8, "b5d7a2e7b39e2567")      # session 34's (32: 8f8bdd69a21fb60f)
    assert digest({"HN"}) == (8, "c5337332483d2145")      # session 34's (32: 13845d8b2f318a48)
    assert digest({"easy", "HP", "NI", "LC-S", "LC-I"}) == (160, "e791d29d96b8d6ca")  # 34's (33: 0679b8625b1e2c6b)


@pytest.mark.parametrize("condition", ["easy", "hard_positive", "hard_negative"])
def test_mioh_holder_holds_as_many_objects_as_the_other_images(condition):
    """The target is swapped in for one of the holder's own objects: added, it gave the holder
    one object more on average, and "the image with the most objects" picked it in 65 / 51 /
    63% of easy / HP / HN sets of 2-4 images against 36% by chance (session 34's audit). The
    default (added) is what the organism was trained on, and stays."""
    import numpy as np

    from evaluators.world import BIASED, World, derive_seed, image_set

    world = World(BIASED)

    def holder_excess(swap_in):
        """The holder's object count and total object area (size^2, px) minus the others' mean."""
        excess = []
        for k in range(60):
            target = ("fork", "tree", "dog", "cup")[k % 4]
            s = image_set(world, derive_seed(5, 77, k), 2 + k % 3, target, condition, present=True,
                          holder_unusual=condition == "easy", swap_in=swap_in)
            stats = np.array([(len(sc.objects), sum(o.size ** 2 for o in sc.objects)) for sc in s.scenes])
            excess.append(stats[s.holders[0]] - np.delete(stats, s.holders[0], axis=0).mean(axis=0))
        return np.mean(excess, axis=0)

    count, area = holder_excess(True)
    assert abs(count) < 0.35, count
    # swapping an object of any size for a small target took area away (the least area told
    # the holder in 37-40% of hard-positive sets of 4, against 25): one large object is ~720
    assert abs(area) < 200, area
    assert holder_excess(False)[0] > 0.6  # the leak this guards against, still in the training default
    with pytest.raises(ValueError, match="swap_in"):
        image_set(world, 1, 4, "fork", "easy", swap_in="yes")


@pytest.mark.parametrize("seed", [0, 1])
def test_mioh_easy_sets_give_no_background_or_cue_hint(seed):
    """Every image of an easy, NI or LC set is of the target's unusual context and lacks its
    cue, the holder too: picking the one image of the usual context (or with the cue) was
    right 61-69% of the time on easy sets before session 33 (a review's blind audit)."""
    from evaluators.world import BIASED, CONTEXT_CATEGORIES, World, derive_seed, image_set

    world = World(BIASED)
    cue = {target: c for c, target, _ in BIASED.cooccurrence}
    for k, target in enumerate(("fork", "tree", "dog", "cup") * 3):
        usual = next(c for c, members in CONTEXT_CATEGORIES.items() if target in members)
        s = image_set(world, derive_seed(seed, 77, k), 4, target, "easy", present=True, holder_unusual=True)
        assert len(s.holders) == 1 and all(scene.context != usual for scene in s.scenes)
        assert not any(target in cue and scene.present(cue[target]) for scene in s.scenes)
    with pytest.raises(ValueError, match="holder_unusual"):
        image_set(world, 1, 4, "fork", "hard_negative", holder_unusual=True)


def test_bad_task_or_scale_is_named():
    with pytest.raises(ValueError, match="dobnch"):
        build_queries(["dobnch"])
    with pytest.raises(ValueError, match="scale 'huge'"):
        build_suite("dobench", scale="huge")


@pytest.mark.parametrize("bench", ["dobench", "mioh", "causal_halbench", "hallusegbench", "reactbench"])
def test_limit_takes_whole_samples(bench):
    """--limit N: at least N queries, and every sample they touch whole (a HalluSegBench pair
    cut after its factual query was scored as nothing, silently)."""
    from evaluators.benchmarks.suites import build_queries
    from evaluators.query import first_units, unit_of

    queries = build_queries([bench], 0, "small")
    for n in (1, 4, 7):
        kept = first_units(queries, n)
        assert len(kept) >= n and kept == [q for q in queries if q in kept]
        units = {unit_of(q) for q in kept}
        assert [q for q in queries if unit_of(q) in units] == kept
        order = list(dict.fromkeys(unit_of(q) for q in kept))  # units in the order first met
        assert sum(unit_of(q) != order[-1] for q in kept) < n  # no more whole samples than needed
    with pytest.raises(ValueError, match="positive"):
        first_units(queries, 0)


def test_limit_keeps_a_mioh_set_with_its_comprehensive_question():
    from evaluators.benchmarks.suites import build_queries
    from evaluators.query import first_units

    kept = [q.id for q in first_units(build_queries(["mioh"], 0, "small"), 1)]
    assert kept[0] + "-comprehensive" in kept


@pytest.mark.parametrize("bench", ["dobench", "mioh", "causal_halbench", "hallusegbench", "reactbench"])
def test_a_query_is_the_same_at_every_scale(bench):
    """An id names one question whatever the suite's size, so answers at --scale small are
    the first answers of --scale full (ReactBench's items had drawn options from one stream
    shared by its four tasks: 29 of its 105 small-scale queries differed at full scale)."""
    from evaluators.query import fingerprint

    small = {q.id: fingerprint(q) for q in build_suite(bench, seed=3, scale="small")}
    full = {q.id: fingerprint(q) for q in build_suite(bench, seed=3, scale="full")}
    assert small.keys() <= full.keys()
    assert [i for i in small if small[i] != full[i]] == []


def test_reactbench_direct_questions_do_not_depend_on_the_dimensions_built():
    from evaluators.benchmarks.reactbench.suite import build
    from evaluators.query import fingerprint

    every = {q.id: fingerprint(q) for q in build(4, seed=1)}
    direct = build(4, seed=1, dimensions=("direct",), hints=("none",))
    assert direct and all(fingerprint(q) == every[q.id] for q in direct)


def test_reactbench_attribute_yes_no_is_half_yes_and_its_words_say_nothing():
    """Counterfactual Attribute's direct YN asks the drawn colour on half the items (yes)
    and another unusual colour on the rest (no): until session 38 it always asked the usual
    colour, so "no" was always right, and asking the usual one on the "no" items would let
    the words answer. The drawn colour comes from the item's stream, not its index (a
    constant "blue" short answer scored 22% against 14%)."""
    from collections import Counter

    from evaluators.world import World

    dominant = {c: colour for c, (colour, _) in World(BIASED).config.dominant_colour.items()}
    drawn = {}
    for seed in (0, 1, 2, 3):
        queries = [q for q in build_suite("reactbench", seed, "full")
                   if q.record["task"] == "counterfactual_attribute" and q.record["dimension"] == "direct"]
        yes_no = [q for q in queries if q.record["qtype"] == "YN"]
        assert Counter(q.truth for q in yes_no) == {"yes": len(yes_no) // 2, "no": len(yes_no) // 2}
        for q in yes_no:
            asked = q.prompt.split(" ")[3]
            assert asked != dominant[q.record["object"]]
        for q in queries:
            if q.record["qtype"] == "SA":
                k = int(q.id.split("-")[3])
                assert q.truth != dominant[q.record["object"]]
                drawn.setdefault((k, q.record["object"]), set()).add(q.truth)
    assert any(len(colours) > 1 for colours in drawn.values())


def test_reactbench_options_give_nothing_away_without_the_image():
    """No letter, option or yes/no answer can be told without the images (a review's image-blind
    policy scored 77.5% on alteration tracing's MC by picking the only option whose verb
    differed, and always-"c" 47% on dense counting's intervals; "yes" was right on every
    alteration-tracing yes/no question)."""
    from collections import Counter

    from evaluators.benchmarks.reactbench.suite import build

    queries = build(60, seed=2, dimensions=("direct",), hints=("none",))
    for task in ("relational_erasure", "counterfactual_attribute", "alteration_tracing", "dense_counting"):
        letters = Counter(q.truth for q in queries if q.record["task"] == task and q.record["qtype"] == "MC")
        assert set(letters) == set("abcd") and max(letters.values()) <= 25, (task, letters)  # 15 expected each
    tracing = [q for q in queries if q.record["task"] == "alteration_tracing"]
    for q in (q for q in tracing if q.record["qtype"] == "MC"):
        said = [o.split() for o in q.options]
        right = said["abcd".index(q.truth)]
        objects = Counter(o[1] for o in said)  # "the <object> ..." / "a <object> ..."
        verbs = Counter(" ".join(o[2:]).split(" by ")[0] for o in said)  # kind and detail
        assert sorted(objects.values()) == [2, 2] and sorted(verbs.values()) == [2, 2], q.options
        assert objects[right[1]] == 2
    yes_no = Counter(q.truth for q in tracing if q.record["qtype"] == "YN")
    assert min(yes_no["yes"], yes_no["no"]) >= 20, yes_no
    counts = [q for q in queries if q.record["task"] == "dense_counting" and q.record["qtype"] == "MC"]
    for q in counts:  # the options say their intervals' bounds, and the right one holds the count
        low, high = q.record["interval"]
        assert q.options["abcd".index(q.truth)].split(" to ") == [NUMBERS[low], NUMBERS[high]]
    assert len({tuple(q.record["interval"]) for q in counts}) == 4  # every interval is right for some item
    asked = [q for q in queries if q.record["task"] == "dense_counting" and q.record["qtype"] == "YN"]
    assert {int(NUMBERS.index(q.prompt.split()[2])) for q in asked} <= set(range(2, 10))  # never a count no item has
    erasure = [q for q in queries if q.record["task"] == "relational_erasure" and q.record["qtype"] == "MC"]
    cue = {target: c for c, target, _ in BIASED.cooccurrence}
    assert not any(q.options["abcd".index(q.truth)] == cue[q.record["target"]] for q in erasure)  # it named the answer


def test_reactbench_alteration_tracing_options_lean_no_way_without_the_images():
    """Session 34's blind audit: remove's wrong kinds were {add, move, replace} against
    replace's {add, move}, so of the pair {remove, replace} "remove" was always right; the
    other object Y came from every category while X is one of the scene's own, so the commoner
    object was right 58% of the time; and a coin per item drew 9 "yes" of 12 on one full-scale
    seed, 2 on the other (alternating them per item then made the verb tell it: 62.6% at full
    scale, a review's finding). Now the partners are symmetric and equal in number, Y is
    drawn as X was, and each verb is asked as often with "yes" as with "no"."""
    from collections import Counter

    from evaluators.benchmarks.reactbench.suite import OTHER_KINDS, VERB, build
    from evaluators.world import BIASED, CHANGE_KINDS, World, change_pair, derive_seed

    assert set(OTHER_KINDS) == set(CHANGE_KINDS) and len({len(p) for p in OTHER_KINDS.values()}) == 1
    assert all(v in OTHER_KINDS[w] for v, partners in OTHER_KINDS.items() for w in partners)  # symmetric
    assert "replace" not in OTHER_KINDS["remove"]
    world, n = World(BIASED), 24
    tracing = [q for q in build(n, seed=4, dimensions=("direct",), hints=("none",))
               if q.record["task"] == "alteration_tracing"]
    verb_kind = {v: k for k, v in VERB.items()}
    for k, q in enumerate(q for q in tracing if q.record["qtype"] == "MC"):
        pair = change_pair(world, derive_seed(4, 61, 2, k), CHANGE_KINDS[k % len(CHANGE_KINDS)])
        objects = {o.split()[1] for o in q.options} - {pair.category}
        kinds = {verb_kind[next(w for w in o.split() if w in verb_kind)] for o in q.options}
        assert kinds == {pair.kind, *(kinds & set(OTHER_KINDS[pair.kind]))} and len(kinds) == 2, q.options
        (other,) = objects
        if pair.kind == "add":  # Y is, as X was, absent from the before image
            assert not pair.before.present(other)
        else:  # Y is, as X was, one of the before image's single objects
            assert pair.before.count(other) == 1
    for seed in (0, 1):
        yes_no = Counter(q.truth for q in build_suite("reactbench", seed, "full")
                         if q.record["task"] == "alteration_tracing" and q.record["qtype"] == "YN")
        assert yes_no == {"yes": 6, "no": 6}, (seed, yes_no)
    # and no verb tells the answer: "was the X moved ?" as often "yes" as "no", per verb
    by_verb = Counter((q.prompt.split()[3], q.truth) for q in tracing if q.record["qtype"] == "YN")
    assert all(by_verb[verb, "yes"] == by_verb[verb, "no"] == n // 8 for verb in VERB.values()), by_verb


def test_reactbench_short_answers_that_name_every_change_are_wrong():
    """An image-blind policy answering every category, verb and direction was right on all 36
    alteration-tracing short answers (a review's audit); so was a hedge over the verbs."""
    from evaluators.benchmarks.reactbench.suite import CHANGE_VOCABULARY, build
    from evaluators.query import to_record

    short = [q for q in build(12, seed=0) if q.record["task"] == "alteration_tracing" and q.record["qtype"] == "SA"]
    assert short and not any(to_record(q, " ".join(CHANGE_VOCABULARY))["correct"] for q in short)
    assert all(to_record(q, "the " + " ".join(q.truth))["correct"] for q in short)
    removed = next(q for q in short if "removed" in q.truth)
    thing = removed.truth[0]
    assert not to_record(removed, f"the {thing} was added , moved or removed")["correct"]
    assert to_record(removed, f"the {thing} was removed , nothing was added")["correct"]  # a denied word is not said


def _blind_dobench(query):
    """Against the stated belief, "yes" where there is none: never looks at the image."""
    belief = query.prompt.lower().split(" is there ")[0]
    if query.record.get("level", 0) == 0:
        return "yes"
    return "yes" if (" no " in f" {belief} " or "not" in belief or "n't" in belief) else "no"


def _blind_reactbench(query):
    return {"yes_no": "no", "option": "a", "number": "zero"}.get(query.kind, "?")


@pytest.mark.parametrize("seed, prior_robust, react_score", [(0, 91.7, 40.2), (1, 91.7, 39.1)])
def test_image_blind_policies_score_as_the_readme_says(seed, prior_robust, react_score):
    """docs/suites.md's "What a model that never looks at the image scores" figures, at --scale
    full: they follow from the papers' protocols (every DO-Bench belief contradicts the
    truth; ReactBench's erasure and attribute questions have one answer each)."""
    from evaluators.benchmarks.reactbench.metrics import react_score_value
    from evaluators.query import to_record
    from evaluators.runner import score

    dobench = [to_record(q, _blind_dobench(q)) for q in build_suite("dobench", seed, "full")]
    results = score(dobench)["results"]["dobench"]
    assert round(results["prior_robust"], 1) == prior_robust and results["perception_ability"] == 100.0
    react = [to_record(q, _blind_reactbench(q)) for q in build_suite("reactbench", seed, "full")]
    assert round(react_score_value(react), 1) == react_score


def _background_context(image) -> str:
    """The scene's context from its background colour alone (the image's commonest colour)."""
    import numpy as np

    from evaluators.world import CONTEXTS

    pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    commonest = tuple(int(v) for v in colours[counts.argmax()])
    return min(CONTEXTS, key=lambda c: sum((a - b) ** 2 for a, b in zip(CONTEXTS[c], commonest)))


def test_dobench_a_series_asks_the_base_scene_and_b_series_its_edit():
    """DO-Bench Sec. 3.2: the A-series is the base scene, B still in it; the B-series the
    same scene with B removed, so the group's two images differ only where B was. Until
    session 38 both series were cut from the edited scene. The A-object sits in a cluster:
    its Cluster view keeps at least one neighbour (9% of them had none before), and off the
    centre (9% had their centre in the middle sixteenth before session 39)."""
    import numpy as np

    from evaluators.benchmarks.dobench.suite import build, scene_groups
    from evaluators.world import World, do_views
    from evaluators.world.views import neighbours

    world = World(BIASED)
    groups = [g for _, (_, g) in zip(range(12), scene_groups(0, world))]
    queries = build(12, 0, world=world)
    for k, g in enumerate(groups):
        assert g.base.present(g.a_category) and g.base.present(g.b_category)
        assert g.absent.present(g.a_category) and not g.absent.present(g.b_category)
        base, absent = np.asarray(g.base.render()), np.asarray(g.absent.render())
        changed = (base != absent).any(-1)
        where_b = g.base.mask_of(g.b_category)
        assert changed.any() and not changed[~where_b].any()
        boxes = g.base.boxes()
        assert neighbours(boxes[g.a_uid], [b for u, b in boxes.items() if u != g.a_uid])
        a = next(o for o in g.base.objects if o.uid == g.a_uid)  # "off-center" (Sec. 3.2)
        assert max(abs(a.cx - g.base.resolution / 2), abs(a.cy - g.base.resolution / 2)) >= g.base.resolution / 4
        views = do_views(g.base, g.a_uid, 0.1)
        mine = {q.id.rsplit("-", 2)[-2] + "-" + q.id.rsplit("-", 1)[-1]: q for q in queries
                if q.record["scene_id"] == f"dobench-0-{k}"}
        for level in range(4):
            assert np.array_equal(np.asarray(mine[f"A{level}-Full"].images[0]), base)
            assert np.array_equal(np.asarray(mine[f"B{level}-Full"].images[0]), absent)
        assert np.array_equal(np.asarray(mine["A0-Cluster"].images[0]), np.asarray(views.cluster))
        assert np.array_equal(np.asarray(mine["A0-Crop"].images[0]), np.asarray(views.crop))


@pytest.mark.parametrize("seed", [0, 1])
def test_dobench_is_answered_by_the_object_name_and_background_alone(seed):
    """DO-Bench's own design (Sec. 3.1): the A-object is present and contextually
    unconventional, the B-object typical and absent, so "yes exactly when the object is
    unusual for the background" is right on every Full-view instance without seeing the
    object: PriorRobust 100 (on the Cluster / Crop views the object can outweigh the
    background; "yes" scores PerceptionAbility 100 there anyway). docs/suites.md says so: a
    mitigation that merely inverts the context prior scores well here."""
    from evaluators.query import to_record
    from evaluators.runner import score
    from evaluators.world import CONTEXT_CATEGORIES

    queries = [q for q in build_suite("dobench", seed, "full") if q.record["view"] == "Full"]
    rule = lambda q: "no" if q.record["object"] in CONTEXT_CATEGORIES[_background_context(q.images[0])] else "yes"
    results = score([to_record(q, rule(q)) for q in queries])["results"]["dobench"]
    assert results["accuracy"] == 100.0 and results["prior_robust"] == 100.0


@pytest.mark.parametrize("seed", [0, 1])
def test_reactbench_erasure_options_and_hallusegbench_replacements_keep_to_a_context(seed):
    """A review's blind audit: Relational Erasure's absent wrong options were drawn from every
    category, so the one option usual for the background (not the erased companion) was right
    75% of the time; HalluSegBench's c' was drawn from every absent category, so "the label
    is usual for the background" told the factual query from the textual one 80% of the
    time. Now both keep to a context (HalluSegBench Sec. 3: a "contextually plausible"
    replacement)."""
    from evaluators.world import CONTEXT_CATEGORIES, World, derive_seed, segmentation_pair

    home = {c: ctx for ctx, members in CONTEXT_CATEGORIES.items() for c in members}
    erasure = [q for q in build_suite("reactbench", seed, "full")
               if q.record["task"] == "relational_erasure" and q.record["qtype"] == "MC"
               and q.record["dimension"] == "direct"]
    for q in erasure:
        right = q.options["abcd".index(q.truth)]
        wrong = [o for o in q.options if o not in (right, q.record["target"])]
        assert len(wrong) == 2 and {home[o] for o in wrong} == {home[right]}, q.options
    world, usual = World(), 0
    for k in range(60):
        pair = segmentation_pair(world, derive_seed(seed, 21, k))
        usual += pair.counterfactual_label in CONTEXT_CATEGORIES[pair.factual.context]
    assert usual >= 50, usual  # was 27% of pairs
