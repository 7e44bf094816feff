"""Paired bootstrap, exact McNemar and verdicts: hand-checked cases."""

import math

import numpy as np
import pytest

from evaluators.report import MIN_SUPPORT, mcnemar_exact, paired_bootstrap, support, verdict


def _acc(records):
    return 100.0 * sum(r["correct"] for r in records) / len(records) if records else math.nan


def test_bootstrap_of_an_identical_run_is_zero():
    rows = [{"id": i, "correct": i % 3 == 0} for i in range(60)]
    out = paired_bootstrap(rows, rows, _acc, n_resamples=200)
    assert out["delta"] == 0.0 and out["low"] == 0.0 and out["high"] == 0.0


def test_bootstrap_detects_a_clear_improvement_and_pairs_units():
    base = [{"id": i, "correct": i < 20} for i in range(100)]
    better = [{"id": i, "correct": i < 60} for i in range(100)]
    out = paired_bootstrap(base, better, _acc, n_resamples=500, seed=1)
    assert out["delta"] == pytest.approx(40.0)
    assert 25 < out["low"] < 40 < out["high"] < 55
    assert verdict(out["low"], out["high"], True) == "fixes"
    assert verdict(out["low"], out["high"], False) == "breaks"
    grouped = paired_bootstrap(base, better, _acc, unit=lambda r: r["id"] // 10, n_resamples=200)
    assert grouped["n_units"] == 10


def test_bootstrap_refuses_unpaired_runs():
    with pytest.raises(ValueError, match="identical samples"):
        paired_bootstrap([{"id": 1, "correct": 1}], [{"id": 2, "correct": 1}], _acc)


def test_mcnemar_exact():
    # 10 discordant pairs, all in favour of the mitigation: p = 2 * 0.5**10
    out = mcnemar_exact([False] * 10 + [True] * 5, [True] * 10 + [True] * 5)
    assert (out["only_baseline_right"], out["only_mitigated_right"]) == (0, 10)
    assert out["p_value"] == pytest.approx(2 * 0.5**10)
    assert mcnemar_exact([True, False], [True, False])["p_value"] == 1.0


def test_verdict_needs_the_interval_to_exclude_zero():
    assert verdict(-1.0, 5.0, True) == "no detectable effect"
    assert verdict(0.5, 5.0, None) == "no detectable effect"
    with pytest.raises(ValueError, match="low end 5.0 is above its high end -1.0"):  # was "fixes"
        verdict(5.0, -1.0, True)


def test_no_interval_is_not_measured_and_a_floating_point_residue_is_zero():
    """A NaN interval (no resample defined the metric: DO-Bench without Cluster / Crop views)
    read "-", no detectable effect at this size, though nothing was measured; an end that is
    0 up to the last bits ([+6.9e-15, +100], a statistics review's repro) read BREAKS."""
    from evaluators.report.attribution import cell_verdicts

    assert verdict(math.nan, 1.0, True) == verdict(math.nan, math.nan, None) == "not measured"
    assert verdict(6.9e-15, 100.0, False) == verdict(-1e-13, 100.0, True) == "no detectable effect"
    assert verdict(1e-6, 100.0, True) == "fixes"
    rows = [{"mechanism": "perception", "verdict": "not measured"},
            {"mechanism": "language_prior", "verdict": "not measured"},
            {"mechanism": "language_prior", "verdict": "no detectable effect"}]
    cells = cell_verdicts(rows)
    assert cells["perception"] == "not measured" and cells["language_prior"] == "no detectable effect"


def test_a_unit_whose_swap_moves_the_metric_only_in_its_last_bits_has_not_changed():
    """changed() compared metric values with ==: a mean over the same scores in another order
    differs by 1e-14, and such units counted towards MIN_SUPPORT."""
    from evaluators.report.stats import changed

    def mean(records):  # a per-unit-mean metric whose float sum depends on the order
        return sum(r["score"] for r in records) / len(records)

    base = [[{"id": "a", "score": 0.1}], [{"id": "b", "score": 0.2}], [{"id": "c", "score": 0.3}]]
    # the same scores, moved between units: each swap reorders the sum
    moved = [[{"id": "a", "score": 0.1}], [{"id": "b", "score": 0.2}], [{"id": "c", "score": 0.3}]]
    assert changed(base, moved, mean) == 0
    shifted = [[{"id": "a", "score": 0.1 + 1e-15}], [{"id": "b", "score": 0.2}], [{"id": "c", "score": 0.3}]]
    assert changed(base, shifted, mean) == 0
    real = [[{"id": "a", "score": 0.5}], [{"id": "b", "score": 0.2}], [{"id": "c", "score": 0.3}]]
    assert changed(base, real, mean) == 1
    rows = [{"id": i, "correct": i % 2 == 0} for i in range(10)]
    for bad in (0, -5, 2.5, True):  # 0 or fewer gave NaN intervals without a word
        with pytest.raises(ValueError, match="n_resamples must be a positive int"):
            paired_bootstrap(rows, rows, _acc, n_resamples=bad)


def _do_rows(n_scenes, flip=()):
    """Ten A/B questions per scene; the scenes in ``flip`` answered all right."""
    return [{"id": f"do-{s}-{q}", "scene_id": f"s{s}", "series": "AB"[q % 2] if q < 8 else "A",
             "level": q // 2 if q < 8 else 0,
             "view": "Full" if q < 8 else ("Cluster" if q == 8 else "Crop"), "pred_yes": (q < 8 and q % 2 == 1) != (s in flip),
             "correct": s in flip, "invalid": False} for s in range(n_scenes) for q in range(10)]


def test_records_without_their_sample_field_are_refused_not_resampled_one_by_one():
    """Without scene_id each DO-Bench question was its own bootstrap unit: 3 scenes of 12
    changed read as "fixes" [16, 34] where by scenes it was no detectable effect [0, 50]
    (a user review)."""
    from evaluators.report.attribution import MissingUnits, compare

    base, arm = _do_rows(12), _do_rows(12, flip={0, 1, 2})
    assert compare({"dobench": base}, {"dobench": arm}, n_resamples=200)
    bare = [{k: v for k, v in r.items() if k != "scene_id"} for r in base]
    with pytest.raises(MissingUnits, match="dobench: 120 records lack 'scene_id'"):
        compare({"dobench": bare}, {"dobench": arm}, n_resamples=200)


def test_a_malformed_record_is_an_error_not_a_mechanism_not_measured():
    """compare() skipped a metric on any ValueError, so one pred_yes "no" among 120 records
    left language prior and perception "not measured" without a word."""
    from evaluators.report.attribution import compare

    base, arm = _do_rows(12), _do_rows(12, flip={0})
    arm[5]["pred_yes"] = "no"
    with pytest.raises(ValueError, match=r"^dobench\.\w+: record field 'pred_yes' must be true or false"):
        compare({"dobench": base}, {"dobench": arm}, n_resamples=200)
    arm[5]["pred_yes"], arm[6]["correct"] = False, math.nan  # so is a NaN outcome (bool(nan) is True)
    with pytest.raises(ValueError, match="record field 'correct' must be true or false, got nan"):
        compare({"dobench": base}, {"dobench": arm}, n_resamples=200)


def test_named_arms_bring_their_baselines_and_controls():
    """``vlm-report --arms X`` also runs what X is compared with: its baseline, its control
    (VCD under sampling is judged against the plausibility constraint alone), and an
    optional arm's baseline that is itself optional, with its own baseline."""
    from evaluators.report.attribution import default_arms, optional_arms
    from evaluators.report.main import with_references

    known = default_arms() + optional_arms()
    by_name = {a.name: a for a in known}
    names = lambda arms: [a.name for a in arms]  # noqa: E731
    assert names(with_references([by_name["VCD (sampling)"]], known)) == [
        "VCD (sampling)", "baseline (sampling)", "plausibility only (sampling)"]
    assert names(with_references([by_name["prior suppression: context, decomposed, priors kept"]], known)) == [
        "prior suppression: context, decomposed, priors kept", "crop-and-verify, decomposed, priors kept",
        "baseline (greedy)"]
    assert names(with_references([by_name["baseline (greedy)"]], known)) == ["baseline (greedy)"]
    assert names(with_references([by_name["crop-and-verify, decomposed, zoomed search"]], known)) == [
        "crop-and-verify, decomposed, zoomed search", "baseline (greedy)"]


def _subset_acc(records):
    """Accuracy over the records of condition "x" only (as MIOH's per-condition metrics)."""
    return _acc([r for r in records if r["condition"] == "x"])


def test_a_metric_on_a_few_units_decides_nothing_whatever_its_interval():
    """4 of 40 queries in the metric's subset, all four fixed: every resample gives +100, the
    percentile interval collapses to [+100, +100], yet no paired test can decide on 4 units."""
    base = [{"id": i, "condition": "x" if i < 4 else "y", "correct": False} for i in range(40)]
    fixed = [{**r, "correct": r["condition"] == "x"} for r in base]
    out = paired_bootstrap(base, fixed, _subset_acc, n_resamples=300)
    assert (out["low"], out["high"], out["support"], out["n_units"]) == (100.0, 100.0, 4, 40)
    assert verdict(out["low"], out["high"], True) == "fixes"  # the interval alone would say so
    assert verdict(out["low"], out["high"], True, out["support"]) == "no detectable effect"
    # six such queries are enough (sign test: 2 * 0.5**6 = 0.031)
    base6 = [{**r, "condition": "x" if r["id"] < MIN_SUPPORT else "y"} for r in base]
    fixed6 = [{**r, "correct": r["condition"] == "x"} for r in base6]
    out6 = paired_bootstrap(base6, fixed6, _subset_acc, n_resamples=300)
    assert out6["support"] == MIN_SUPPORT and verdict(out6["low"], out6["high"], True, out6["support"]) == "fixes"


def test_support_of_a_two_part_metric_counts_the_units_either_part_reads():
    """A difference of two subset accuracies is defined on no single unit; leaving a unit out
    of either part changes it (MIOH's decomposition gap)."""
    def gap(records):
        return _acc([r for r in records if r["condition"] == "a"]) - _acc([r for r in records if r["condition"] == "b"])

    rows = [{"id": i, "condition": "ab"[i % 2] if i < 10 else "c", "correct": i % 4 < 2} for i in range(30)]
    assert support([[r] for r in rows], gap, enough=100) == 10
    assert support([[r] for r in rows], gap) == MIN_SUPPORT  # counted up to what a verdict needs
    assert support([[r] for r in rows], _acc) == 30
    # the answers do not matter: every part uniform (all wrong / all right) still reads 10 units
    uniform = [{**r, "correct": r["condition"] == "a"} for r in rows]
    assert support([[r] for r in uniform], gap, enough=100) == 10
    # a subset of 4 stays 4: the other units complete nothing
    assert support([[{**r, "condition": "x" if r["id"] < 4 else "y"}] for r in rows], _subset_acc, enough=100) == 4


def test_support_of_a_metric_that_needs_several_units_comes_from_leaving_one_out():
    """A metric defined only on 3 or more records (no single unit, no pair) reads every unit
    whose removal changes it -- in either arm."""
    def needs_three(records):
        return _acc(records) if len(records) >= 3 else math.nan

    base = [[{"id": i, "correct": i % 2 == 0}] for i in range(10)]
    assert support(base, needs_three, enough=100) == 10
    uniform = [[{"id": i, "correct": False}] for i in range(10)]  # removal changes nothing here ...
    assert support(uniform, needs_three, enough=100) == 0
    assert support(uniform, needs_three, enough=100, other=base) == 10  # ... but does in the other arm


def test_mioh_records_of_one_image_set_are_resampled_together():
    """MIOH asks each image set two questions and decomposes NI sets twice: the bootstrap
    unit is the set, so correlated questions never count as independent evidence."""
    from evaluators.report.attribution import UNITS

    unit = UNITS["mioh"]
    ids = ["mioh-0-NI-4-3", "mioh-0-NI-4-3-comprehensive", "mioh-0-NI-4-3-decomposed",
           "mioh-0-NI-4-3-comprehensive-decomposed"]
    assert {unit({"id": i}) for i in ids} == {"mioh-0-NI-4-3"}
    assert unit({"id": "mioh-0-NI-4-13"}) != unit({"id": "mioh-0-NI-4-1"})


def test_hallusegbench_splits_of_one_image_pair_are_resampled_together():
    """The built-in suite asks the referring and the reasoning queries of one image pair;
    the bootstrap resamples the pair, ids built by the suite itself."""
    from evaluators.benchmarks.hallusegbench.suite import build
    from evaluators.report.attribution import UNITS

    ids = sorted({q.record["sample_id"] for q in build(n_pairs=2, seed=3)})
    assert len(ids) == 4 and len({UNITS["hallusegbench"]({"id": i}) for i in ids}) == 2


def test_reactbench_questions_of_one_item_are_resampled_together():
    from evaluators.benchmarks.reactbench.suite import build
    from evaluators.report.attribution import UNITS

    queries = build(n_per_task=2, seed=0, modes=("standard", "cot"))
    items = {UNITS["reactbench"]({"id": q.id}) for q in queries}
    assert len(items) == 8  # four tasks x two items, each asked several questions in both modes
    assert UNITS["reactbench"]({"id": "react-my-own-7"}) == "react-my-own-7"  # user data: its own unit


@pytest.mark.parametrize("fixed, expected", [(4, "no detectable effect"), (8, "fixes")])
def test_a_verdict_needs_six_units_that_changed_not_only_six_read(fixed, expected):
    """4 answers fixed among 100 unchanged ones: the interval stays above 0, yet no paired
    test at 5% decides on 4 discordant pairs (McNemar p = 0.125); 8 are enough."""
    import math

    from evaluators.report.stats import paired_bootstrap, verdict

    acc = lambda rs: 100.0 * sum(r["correct"] for r in rs) / len(rs) if rs else math.nan  # noqa: E731
    base = [{"id": i, "correct": i >= 50} for i in range(100)]
    mitigated = [{"id": i, "correct": i >= 50 or i < fixed} for i in range(100)]
    stats = paired_bootstrap(base, mitigated, acc, n_resamples=1000, seed=0)
    assert stats["low"] > 0 and stats["support"] == 100 and stats["changed"] == fixed  # counted up to 20
    assert verdict(stats["low"], stats["high"], True, min(stats["support"], stats["changed"])) == expected


def test_a_p_value_is_never_below_what_the_units_that_changed_allow():
    """Every resample on one side gives a bootstrap p of 0, which Holm keeps at any threshold;
    on k changed units no paired test can give less than the sign test's 2 * 0.5**k. 7 fixed
    answers: p = 2/128, kept alone at 5% but not first in a family of 4 (0.0125), so Holm
    drops its verdict there; 25 fixed: the floor is out of the way."""
    from evaluators.report.attribution import adjusted
    from evaluators.report.stats import FLOOR_UNITS, p_floor

    acc = lambda rs: 100.0 * sum(r["correct"] for r in rs) / len(rs)  # noqa: E731
    base = [{"id": i, "correct": i >= 50} for i in range(100)]
    for fixed, floor in ((7, 2 / 128), (25, p_floor(FLOOR_UNITS))):
        mitigated = [{"id": i, "correct": i >= 50 or i < fixed} for i in range(100)]
        for interval in ("percentile", "expanded"):
            stats = paired_bootstrap(base, mitigated, acc, n_resamples=1000, seed=0, interval=interval)
            assert stats["low"] > 0 and stats["p_value"] == pytest.approx(floor)
    assert p_floor(0) == 1.0 and p_floor(6) == pytest.approx(0.03125)
    row = {"mechanism": "cooccurrence", "higher_is_better": True, "verdict": "fixes", "support": 100, "changed": 7,
           "p_value": 2 / 128}
    alone = adjusted([dict(row, metric="a")])
    four = adjusted([dict(row, metric=m) for m in "abcd"])
    assert alone[0]["verdict"] == "fixes" and {r["verdict"] for r in four} == {"no detectable effect"}


# -- a unit drawn several times is that many units ------------------------------------------

def _cpr_pair(pid: str, right: dict) -> list[dict]:
    """A Causal-HalBench pair's records: one original and one counterfactual answer per
    question (contextual, two absent); ``right[(image_type, question)]`` says which are right."""
    rows = []
    for image in ("original", "counterfactual"):
        for qtype, question in (("contextual", "cup?"), ("absent", "fork?"), ("absent", "bird?")):
            rows.append({"id": f"{pid}-{image}-{question}", "pair_id": pid, "image_type": image,
                         "question_type": qtype, "question": question,
                         "correct": right.get((image, question), True)})
    return rows


def test_a_unit_drawn_three_times_weighs_three_units():
    """CPR pairs every original answer with every counterfactual one of a pair_id: a pair
    drawn 3 times, its records concatenated unchanged, gave 9 times its answer pairs. A
    resample must score exactly like the data with that pair repeated under new ids."""
    from evaluators.benchmarks.causal_halbench.metrics import cpr
    from evaluators.report.stats import resampled

    groups = [_cpr_pair("p0", {("counterfactual", "cup?"): False}),
              _cpr_pair("p1", {}),
              _cpr_pair("p2", {("original", "fork?"): False, ("counterfactual", "bird?"): False})]
    drawn = resampled(groups, [0, 0, 0, 1, 2])
    by_hand = groups[0] + [{**r, "pair_id": f"{r['pair_id']}-{c}", "id": f"{r['id']}-{c}"}
                           for c in ("b", "c") for r in groups[0]] + groups[1] + groups[2]
    assert cpr(drawn) == cpr(by_hand)
    assert cpr(drawn)["cpr_pairs"] == 5 * 3  # 5 pairs drawn, 3 answer pairs each (not 3 * 3 * 3 + 3 + 3)
    assert cpr(drawn)["cpr"] == pytest.approx(100 * (3 * 2 + 3 + 1) / 15)
    assert resampled(groups, [2, 1, 0]) == groups[2] + groups[1] + groups[0]  # drawn once: records as they are


def test_cpr_interval_is_the_by_hand_bootstrap_of_pairs():
    """The paired interval of CPR on 8 pairs equals the one computed by hand from each
    pair's answer-pair counts, each draw of a pair counted once (k draws: k times its
    counts); the old k-squared weighting gives another interval on the same draws."""
    import numpy as np

    from evaluators.benchmarks.causal_halbench.metrics import cpr_pooled
    from evaluators.report.attribution import UNITS

    wrong = [{}, {("counterfactual", "cup?"): False}, {("original", "fork?"): False}, {},
             {("counterfactual", "bird?"): False, ("original", "cup?"): False}, {}, {("original", "bird?"): False}, {}]
    fixed = [{}, {}, {}, {}, {("original", "cup?"): False}, {}, {}, {("counterfactual", "cup?"): False}]
    base = [r for i, w in enumerate(wrong) for r in _cpr_pair(f"p{i}", w)]
    mitigated = [r for i, w in enumerate(fixed) for r in _cpr_pair(f"p{i}", w)]
    stats = paired_bootstrap(base, mitigated, cpr_pooled, unit=UNITS["causal_halbench"], n_resamples=400, seed=3)
    assert stats["baseline"] == cpr_pooled(base) and stats["mitigated"] == cpr_pooled(mitigated)

    def both_right(rows, pid):  # of the pair's 3 answer pairs
        ok = {(r["image_type"], r["question"]): r["correct"] for r in rows if r["pair_id"] == pid}
        return sum(ok["original", q] and ok["counterfactual", q] for q in ("cup?", "fork?", "bird?"))

    units = [f"p{i}" for i in range(8)]  # sorted as the bootstrap sorts them
    hits_a = np.array([both_right(base, u) for u in units])
    hits_b = np.array([both_right(mitigated, u) for u in units])
    rng = np.random.default_rng(3)
    deltas, squared = [], []
    for _ in range(400):
        k = np.bincount(rng.integers(0, 8, size=8), minlength=8)  # draws of each pair
        deltas.append(100 * (k @ hits_b - k @ hits_a) / (3 * k.sum()))
        squared.append(100 * ((k * k) @ hits_b - (k * k) @ hits_a) / (3 * (k * k).sum()))
    low, high = np.percentile(deltas, [2.5, 97.5])
    assert (stats["low"], stats["high"]) == (pytest.approx(low), pytest.approx(high))
    assert (stats["low"], stats["high"]) != tuple(pytest.approx(v) for v in np.percentile(squared, [2.5, 97.5]))


def test_too_few_resamples_give_no_comparison():
    """One resample made a "95% interval" of one delta, and a verdict of it."""
    from evaluators.report.attribution import compare
    from evaluators.report.stats import MIN_RESAMPLES

    rows = {"dobench": [{"id": i, "scene_id": i, "series": "A", "level": 0, "correct": True} for i in range(8)]}
    with pytest.raises(ValueError, match=f"at least {MIN_RESAMPLES}"):
        compare(rows, rows, n_resamples=MIN_RESAMPLES - 1)
    assert compare(rows, rows, n_resamples=MIN_RESAMPLES)


@pytest.mark.parametrize("bench", ["dobench", "mioh", "causal_halbench", "hallusegbench", "reactbench"])
def test_the_report_resamples_the_samples_limit_keeps_whole(bench):
    """--limit's sample (evaluators.query.unit_of) is the report's bootstrap unit: every
    metric record made of one sample's answers falls in that sample's unit. ReactBench's
    records carried no unit field, so --limit 30 kept 2 of an item's 7 questions."""
    from evaluators.benchmarks.suites import build_queries, build_suite
    from evaluators.query import first_units, to_record, unit_of
    from evaluators.report.attribution import UNITS
    from evaluators.runner import metric_records

    queries = build_queries([bench], 0, "small")
    samples: dict[str, list] = {}
    for q in queries:
        samples.setdefault(unit_of(q), []).append(q)
        assert UNITS[bench]({**q.record, "id": q.id}) == unit_of(q)
    for sample, members in samples.items():
        records = metric_records(bench, [to_record(q, "yes") for q in members])
        assert records and {UNITS[bench](r) for r in records} == {sample}
    if bench == "reactbench":
        kept = first_units(build_suite(bench, 0, "full"), 30)
        items = {UNITS[bench]({"id": q.id}) for q in kept}
        assert [q for q in build_suite(bench, 0, "full") if UNITS[bench]({"id": q.id}) in items] == kept


def test_register_arm_refuses_a_built_in_name_and_what_is_no_arm():
    from evaluators.report.attribution import USER_ARMS, Arm, optional_arms, register_arm

    with pytest.raises(ValueError, match="is a built-in arm"):
        register_arm(Arm("VCD (greedy)", lambda p: [], {}, "baseline (greedy)"))
    with pytest.raises(ValueError, match="named like one: 'vcd-greedy'"):  # one slug: one --arms pick, one folder
        register_arm(Arm("VCD greedy", lambda p: [], {}, "baseline (greedy)"))
    with pytest.raises(TypeError, match="takes an Arm"):
        register_arm({"name": "x"})
    with pytest.raises(ValueError, match="build must be callable"):
        register_arm(Arm("mine", None))
    try:
        first = register_arm(Arm("mine", lambda p: [], {}, "baseline (greedy)"))
        again = register_arm(Arm("mine", lambda p: [], {}, "baseline (greedy)"))  # a notebook cell run twice
        assert [a for a in optional_arms() if a.name == "mine"] == [again] and again is not first
        with pytest.raises(ValueError, match="named like the registered arm 'mine'"):
            register_arm(Arm("Mine", lambda p: [], {}, "baseline (greedy)"))
    finally:
        USER_ARMS.pop("mine", None)


def test_the_null_check_reads_its_simulated_answers_as_meant_and_counts_false_cells():
    """evaluators.report.null_check: on the real small suite every simulated right / wrong
    answer is scored so by the reader, and a null comparison's decided cells are counted."""
    from evaluators.report import null_check

    world = null_check.NullWorld("small", 0)
    assert world.misread == [] and world.n_units > 20
    base, same = world.draw(np.random.default_rng(0), keep=1.0)
    assert (base == same).all()  # keep=1: the arms are identical
    result = null_check.run(2, keep=1.0, n_resamples=100, log=None)
    assert result["columns_with_a_decided_cell"] == 0  # identical arms decide nothing
    assert result["decided_by_metric"] == {}
    gain = null_check.run(2, keep=0.0, effect=6.0, n_resamples=100, log=None)  # a large real gain everywhere
    assert gain["effect"] == 6.0 and gain["columns_with_a_decided_cell"] == 2
    assert sum(gain["decided_by_metric"].values()) >= 2 and gain["cells"]["language_prior"].get("fixes", 0) >= 1
    assert set(result["cell_rates"]) == {"language_prior", "cooccurrence", "perception", "vision_grounding",
                                         "label_grounding", "multi_image"}


def test_holm_steps_down_and_stops_at_the_first_it_keeps():
    from evaluators.report.stats import holm

    # m = 4: 0.01 <= 0.05/4 rejected; 0.03 > 0.05/3 stops, so 0.04 is kept though < 0.05
    assert holm([0.01, 0.04, 0.03, 0.2]) == [True, False, False, False]
    assert holm([0.01, 0.02]) == [True, True]  # 0.01 <= 0.025, 0.02 <= 0.05
    assert holm([0.03, 0.04]) == [False, False]
    assert holm([math.nan, 0.001]) == [False, True]
    assert holm([]) == []


def test_the_bootstrap_p_value_goes_with_the_percentile_interval():
    from evaluators.report.stats import bootstrap_p

    rng = np.random.default_rng(0)
    for shift in (0.0, 1.0, 2.0, 3.0, 4.0):
        deltas = rng.normal(shift, 1.0, 1000)
        low, high = np.percentile(deltas, [2.5, 97.5])
        assert (low > 0 or high < 0) == (bootstrap_p(deltas) < 0.05) or abs(bootstrap_p(deltas) - 0.05) < 0.01
    assert bootstrap_p([0.0] * 100) == 1.0  # nothing moved: ties count against an effect
    assert math.isnan(bootstrap_p([]))


def test_a_mechanisms_metrics_are_corrected_together():
    """A cell is decided by any of its metrics: each metric's 95% interval alone decided cells
    of several metrics by chance more often than 5%. Holm within the mechanism keeps a
    verdict only where the family rejects; the interval's own verdict stays beside it."""
    from evaluators.report.attribution import adjusted, cell_verdicts

    def row(metric, mechanism, p, verdict, support=10, changed=10, higher=True):
        return {"metric": metric, "mechanism": mechanism, "p_value": p, "verdict": verdict, "support": support,
                "changed": changed, "higher_is_better": higher}

    rows = adjusted([row("a", "cooccurrence", 0.03, "fixes"), row("b", "cooccurrence", 0.04, "fixes"),
                     row("c", "language_prior", 0.001, "fixes"), row("d", "language_prior", 0.04, "breaks"),
                     row("e", "language_prior", 0.001, "no detectable effect", changed=3),  # not in the family
                     {"metric": "x.mcnemar(correct)", "mechanism": None, "p_value": 0.001}], family="mechanism")
    assert [r.get("verdict") for r in rows] == ["no detectable effect", "no detectable effect", "fixes", "breaks",
                                                "no detectable effect", None]
    assert [r.get("verdict_unadjusted") for r in rows[:2]] == ["fixes", "fixes"]
    cells = cell_verdicts(rows)
    assert cells["cooccurrence"] == "no detectable effect" and cells["language_prior"] == "mixed"


def test_family_arm_corrects_every_mechanism_of_a_comparison_together():
    """``family="arm"``: Holm over all the comparison's mechanism-tagged metrics, so a column
    of 6 cells is not decided by chance more often than 5%. The same rows that keep two
    cells under the per-mechanism family keep one here; an unknown family is refused."""
    from evaluators.report.attribution import adjusted, cell_verdicts, compare

    def rows():
        def row(metric, mechanism, p):
            return {"metric": metric, "mechanism": mechanism, "p_value": p, "verdict": "fixes", "support": 10,
                    "changed": 10, "higher_is_better": True}
        return [row("a", "cooccurrence", 0.04), row("b", "language_prior", 0.001), row("c", "perception", 0.03)]

    per_cell = cell_verdicts(adjusted(rows(), family="mechanism"))
    assert [per_cell[m] for m in ("cooccurrence", "language_prior", "perception")] == ["fixes"] * 3
    whole = adjusted(rows())  # the default; 0.001 <= 0.05/3; 0.03 > 0.05/2 stops it
    assert [r["verdict"] for r in whole] == ["no detectable effect", "fixes", "no detectable effect"]
    assert {r["family"] for r in whole} == {"arm"} and [r["verdict_unadjusted"] for r in whole] == ["fixes"] * 3
    with pytest.raises(ValueError, match="family"):
        adjusted(rows(), family="table")
    with pytest.raises(ValueError, match="family"):
        compare({}, {}, family="cell")


def test_the_expanded_percentile_interval_widens_on_few_units_and_its_p_value_goes_with_it():
    """Hesterberg's expanded percentile interval (the report's default, ``--interval``): the tails
    it leaves out at level 0.95, by hand from Phi(-sqrt(n/(n-1)) t_{n-1,0.975}); and a
    verdict from it agrees with its p-value, as the percentile one's does."""
    from evaluators.report.stats import _expanded_p, expanded_tail

    assert expanded_tail(0.95, 12) == pytest.approx(0.01075, abs=2e-5)
    assert expanded_tail(0.95, 40) == pytest.approx(0.0202, abs=1e-4)
    assert expanded_tail(0.95, 100_000) == pytest.approx(0.025, abs=1e-4)
    assert expanded_tail(0.95, 1) == pytest.approx(0.025)
    tail = expanded_tail(0.95, 12)
    assert _expanded_p(tail, 12) == pytest.approx(0.05, abs=1e-6)  # at the interval's own tail: p = alpha
    assert _expanded_p(0.0, 12) == 0.0 and _expanded_p(0.5, 12) == pytest.approx(1.0)
    rng = np.random.default_rng(1)
    baseline = [{"id": f"q{i}", "correct": bool(rng.random() < 0.5)} for i in range(12)]
    mitigated = [{"id": r["id"], "correct": r["correct"] or bool(rng.random() < 0.5)} for r in baseline]

    def accuracy(records):
        return 100 * sum(r["correct"] for r in records) / len(records)

    plain = paired_bootstrap(baseline, mitigated, accuracy, seed=3)
    wide = paired_bootstrap(baseline, mitigated, accuracy, seed=3, interval="expanded")
    assert wide["low"] <= plain["low"] and wide["high"] >= plain["high"] and wide["delta"] == plain["delta"]
    assert wide["p_value"] >= plain["p_value"] and wide["interval"] == "expanded"
    with pytest.raises(ValueError, match="interval must be one of"):
        paired_bootstrap(baseline, mitigated, accuracy, interval="bca")
