"""The five benchmarks' metrics against hand-computed examples (arithmetic in the comments),
plus the registry. Pure numpy; no torch."""

import math

import numpy as np
import pytest

from evaluators.metrics import (
    MECHANISMS, UnknownMetricError, causal_halbench as chb, dobench as do, get_metric, hallusegbench as hsb,
    metric, metrics_by_mechanism, metrics_for, mioh, reactbench as rb,
)
from evaluators.metrics import registry

def isnan(x):
    return isinstance(x, float) and math.isnan(x)


# -- registry ---------------------------------------------------------------------------------
def test_mechanisms_are_exactly_the_six():
    assert MECHANISMS == ("language_prior", "cooccurrence", "perception", "vision_grounding",
                          "label_grounding", "multi_image")


@pytest.mark.parametrize("name, mechanism", [
    ("dobench.prior_robust", "language_prior"), ("dobench.perception_ability", "perception"),
    ("hallusegbench.delta_iou_visual", "vision_grounding"), ("hallusegbench.cms_counterfact", "vision_grounding"),
    ("hallusegbench.delta_iou_textual", "label_grounding"), ("hallusegbench.cms_fact", "label_grounding"),
    ("causal_halbench.cac", "cooccurrence"), ("causal_halbench.aac", "cooccurrence"),
    ("causal_halbench.chr", "cooccurrence"),
    ("reactbench.relational_erasure", "cooccurrence"), ("reactbench.counterfactual_attribute", "language_prior"),
    ("reactbench.alteration_tracing", "multi_image"), ("reactbench.dense_counting", "perception"),
    ("mioh.hn", "cooccurrence"), ("mioh.hp", "perception"), ("mioh.ni", "multi_image"),
    ("mioh.lc_s", "language_prior"), ("mioh.lc_i", "language_prior"),
    ("causal_halbench.accuracy", None), ("dobench.accuracy", None), ("mioh.overall", None),
    ("reactbench.react_score", None),
])
def test_mechanism_tags(name, mechanism):
    assert get_metric(name).mechanism == mechanism


def test_directions():
    assert get_metric("dobench.prior_robust").higher_is_better is True
    assert get_metric("causal_halbench.chr").higher_is_better is False
    assert get_metric("hallusegbench.cms_fact").higher_is_better is False
    assert get_metric("dobench.yes_rate").higher_is_better is None  # no preferred direction


def test_lookup_forms_and_did_you_mean():
    spec = get_metric("dobench.prior_robust")
    assert get_metric("PriorRobust") is spec and get_metric("DOBench.Prior-Robust") is spec
    assert spec.doc.startswith("Eq. 3") and spec.aggregation == "trapezoid_auc"
    with pytest.raises(UnknownMetricError, match="Did you mean 'dobench.prior_robust'") as err:
        get_metric("prior_robst")
    assert isinstance(err.value, KeyError) and "hallusegbench.cms_fact" in str(err.value)  # lists known names
    with pytest.raises(KeyError, match="ambiguous"):
        get_metric("accuracy")  # causal_halbench.accuracy and dobench.accuracy


def test_metrics_for_and_by_mechanism():
    assert [m.name for m in metrics_for("reactbench")] == [
        "reactbench.alteration_tracing", "reactbench.counterfactual_attribute", "reactbench.dense_counting",
        "reactbench.react_score", "reactbench.relational_erasure"]
    assert {m.name for m in metrics_by_mechanism("multi_image")} == {
        "mioh.ni", "mioh.ni_all", "mioh.ni_decomposed", "mioh.decomposition_gap", "reactbench.alteration_tracing"}
    with pytest.raises(ValueError, match="Did you mean 'dobench'"):
        metrics_for("dobnech")


def test_decorator_validates_and_refuses_clashes():
    with pytest.raises(ValueError, match="Did you mean 'perception'"):
        metric("mioh.x", "mioh", "perceptoin", True, "pooled")
    with pytest.raises(ValueError, match="aggregation"):
        metric("mioh.x", "mioh", None, True, "median")
    with pytest.raises(ValueError, match="must start with"):
        metric("x", "mioh", None, True, "pooled")
    with pytest.raises(ValueError, match="already registered"):
        @metric("dobench.prior_robust", "dobench", "language_prior", True, "trapezoid_auc")
        def impostor(records):
            return 0.0
    try:
        @metric("mioh.test_only", "mioh", None, True, "pooled")
        def test_only(records):
            """Doc line."""
            return float(len(records))
        spec = get_metric("mioh.test_only")
        assert spec.doc == "Doc line." and spec([1, 2]) == 2.0
    finally:
        registry._REGISTRY.pop("mioh.test_only", None)


# -- HalluSegBench ----------------------------------------------------------------------------
def box(r0, r1, c0, c1, shape=(4, 4)):
    m = np.zeros(shape, dtype=np.uint8)
    m[r0:r1, c0:c1] = 1
    return m


def test_resize_nearest_index_rule():
    a = np.array([[1, 2], [3, 4]])
    assert (hsb.resize_nearest(a, (4, 4)) == np.array([[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]])).all()
    # 2 -> 3: source index floor(i * 2 / 3) = 0, 0, 1 (OpenCV INTER_NEAREST; PIL would give 0, 1, 1)
    assert hsb.resize_nearest(np.array([[5, 7]]), (1, 3)).tolist() == [[5, 5, 7]]
    # 4 -> 2: floor(i * 4 / 2) = 0, 2
    assert hsb.resize_nearest(np.arange(4)[None, :], (1, 2)).tolist() == [[0, 2]]
    with pytest.raises(ValueError):
        hsb.resize_nearest(np.zeros(3), (2, 2))


def test_iou_and_cms_one_sample():
    gt_fact = box(0, 2, 0, 2)            # M_c: 4 px
    gt_cf = box(0, 2, 0, 3)              # M'_{c'}: 6 px
    pred_fact = box(0, 2, 0, 3)          # 6 px, 4 on M_c
    pred_textual = np.zeros((4, 4)); pred_textual[0, 0] = pred_textual[0, 1] = pred_textual[3, 3] = 1
    pred_visual = box(0, 2, 0, 3) + box(3, 4, 0, 2)   # all of M'_{c'} + 2 px elsewhere
    s = hsb.sample_scores(gt_fact, gt_cf, pred_fact, pred_textual, pred_visual)
    assert s["iou_fact"] == pytest.approx(4 / 6)           # |∩| 4, |∪| 6
    assert s["iou_textual"] == pytest.approx(2 / 5)        # |∩| 2, |∪| 4 + 1
    assert s["iou_visual"] == pytest.approx(6 / 8)         # |∩| 6, |∪| 6 + 2
    assert s["delta_iou_textual"] == pytest.approx(4 / 6 - 2 / 5)
    assert s["delta_iou_visual"] == pytest.approx(4 / 6 - 6 / 8)  # negative: worse than factual
    assert s["cms_fact"] == pytest.approx((3 * 2 + 1) / (3 * 4))    # C = 2, N = 1, |M_c| = 4 -> 7/12
    assert s["cms_counterfact"] == pytest.approx((3 * 6 + 2) / (3 * 6))  # C = 6, N = 2 -> 20/18


def test_prediction_resized_to_ground_truth():
    # a 2x2 prediction with its top-left pixel set covers the top-left 2x2 block at 4x4
    assert hsb.iou(np.array([[1, 0], [0, 0]]), box(0, 2, 0, 2)) == 1.0
    assert hsb.cms(np.array([[0, 0], [0, 1]]), box(0, 2, 0, 2)) == pytest.approx(4 / 12)  # N = 4, C = 0


def test_iou_visual_is_scored_on_the_counterfactual_images_grid():
    """A pinned choice (module notes, "Grid of IoU_visual"): M'_{c'} and M^'_c stay on I''s
    grid. The authors' get_consistency.py resizes both to the factual mask's shape first: on a
    2x2 I that gives 1/2 here."""
    gt_cf = np.zeros((3, 3)); gt_cf[0, 0] = gt_cf[1, 1] = 1
    pred_visual = np.zeros((3, 3)); pred_visual[1, 1] = pred_visual[2, 2] = 1
    s = hsb.sample_scores(box(0, 1, 0, 1, shape=(2, 2)), gt_cf, None, None, pred_visual)
    assert s["iou_visual"] == pytest.approx(1 / 3)


def test_empty_masks():
    empty = np.zeros((4, 4))
    assert hsb.iou(empty, empty) == 0.0                  # both empty: 0.0, as the authors' script
    assert hsb.iou(None, box(0, 2, 0, 2)) == 0.0         # abstention against an object
    assert hsb.cms(None, box(0, 2, 0, 2)) == 0.0         # correct abstention: no hallucination
    assert isnan(hsb.cms(box(0, 1, 0, 1), empty))        # Eq. 3 undefined for |M| = 0
    assert hsb.is_abstention(None) and hsb.is_abstention(empty) and not hsb.is_abstention(box(0, 1, 0, 1))


def records_hsb():
    gt_fact, gt_cf = box(0, 2, 0, 2), box(0, 2, 0, 3)
    pred_textual = np.zeros((4, 4)); pred_textual[0, 0] = pred_textual[0, 1] = pred_textual[3, 3] = 1
    first = dict(split="referring", gt_fact=gt_fact, gt_counterfact=gt_cf, pred_fact=box(0, 2, 0, 3),
                 pred_textual=pred_textual, pred_visual=box(0, 2, 0, 3) + box(3, 4, 0, 2))
    # the ideal model: exact factual mask, abstains on both counterfactual queries
    second = dict(split="referral", gt_fact=gt_fact, gt_counterfact=gt_cf, pred_fact=gt_fact,
                  pred_textual=None, pred_visual=np.zeros((4, 4)))
    return [first, second]


def test_per_sample_means():
    out = hsb.scores(records_hsb())
    assert out["n"] == 2
    assert out["iou_fact"] == pytest.approx((4 / 6 + 1) / 2)                     # 5/6
    assert out["delta_iou_textual"] == pytest.approx(((4 / 6 - 2 / 5) + 1) / 2)  # 19/30
    assert out["delta_iou_visual"] == pytest.approx(((4 / 6 - 6 / 8) + 1) / 2)   # 11/24
    assert out["cms_fact"] == pytest.approx((7 / 12 + 0) / 2)
    assert out["cms_counterfact"] == pytest.approx((20 / 18 + 0) / 2)
    assert out["abstain_textual"] == 0.5 and out["abstain_visual"] == 0.5
    assert out["ci95"]["iou_fact"] == pytest.approx(1.96 * np.std([4 / 6, 1], ddof=1) / math.sqrt(2))
    assert get_metric("hallusegbench.delta_iou_visual").fn(records_hsb()) == pytest.approx(11 / 24)


def test_splits_reported_apart_and_empty_split():
    rs = records_hsb()
    rs[1] = {**rs[1], "split": "reasoning"}
    out = hsb.scores_by_split(rs)
    assert out["referring"]["iou_fact"] == pytest.approx(4 / 6)
    assert out["reasoning"]["delta_iou_textual"] == 1.0 and out["reasoning"]["cms_counterfact"] == 0.0
    only_ref = hsb.scores_by_split(records_hsb()[:1])   # no reasoning sample: NaN, n = 0, no crash
    assert only_ref["reasoning"]["n"] == 0 and isnan(only_ref["reasoning"]["iou_fact"])
    assert set(hsb.scores_by_split(records_hsb())) == {"referring", "reasoning"}  # "referral" is an alias


def test_all_abstain_and_undefined_cms():
    gt = box(0, 2, 0, 2)
    out = hsb.scores([dict(gt_fact=gt, gt_counterfact=gt, pred_fact=None, pred_textual=None, pred_visual=None)])
    assert out["iou_fact"] == 0.0 and out["delta_iou_textual"] == 0.0 and out["delta_iou_visual"] == 0.0
    assert out["cms_fact"] == 0.0 and out["abstain_textual"] == 1.0
    empty = np.zeros((4, 4))
    out = hsb.scores([dict(gt_fact=gt, gt_counterfact=empty, pred_fact=gt, pred_textual=None, pred_visual=gt),
                      dict(gt_fact=gt, gt_counterfact=gt, pred_fact=gt, pred_textual=None, pred_visual=gt)])
    assert out["n_cms_undefined"] == 1
    assert out["cms_counterfact"] == pytest.approx(1.0)   # only the defined sample: (3*4 + 0) / (3*4)
    assert isnan(hsb.scores([])["iou_fact"])


def test_a_mask_edited_in_place_is_scored_as_it_is_now(monkeypatch):
    """Scores were memoised in the record and trusted while it held the same mask objects,
    so a mask edited in place kept its old IoU; inside the bootstrap's block (records
    unchanged) each record is computed once, and a copy of it is another record."""
    from evaluators.metrics import memo

    gt = box(0, 2, 0, 2)
    pred = gt.copy()
    record = dict(gt_fact=gt, gt_counterfact=gt, pred_fact=gt, pred_textual=pred, pred_visual=None)
    assert hsb.scores([record])["iou_textual"] == 1.0
    pred[:] = False
    assert hsb.scores([record])["iou_textual"] == 0.0
    assert set(record) == {"gt_fact", "gt_counterfact", "pred_fact", "pred_textual", "pred_visual"}  # nothing added
    calls = []
    real = hsb._compute_record_scores
    monkeypatch.setattr(hsb, "_compute_record_scores", lambda r, a: calls.append(id(r)) or real(r, a))
    with memo.records_unchanged():
        copy = {**record, "pred_textual": gt}
        for _ in range(3):
            assert hsb.scores([record, copy])["iou_textual"] == 0.5
    assert len(calls) == 2  # once per record object, not per call
    hsb.scores([record])
    assert len(calls) == 3  # the block's end drops what it kept


def test_unreadable_roles_take_the_worst_iou_and_leave_cms_to_readable_answers():
    """An unreadable textual / visual answer: IoU 1 (full leakage) and a count in its
    unreadable share; CMS averages the readable answers only (unbounded above, no value
    stands for "wrong in an unknown way": the whole image's CMS is 1 + 12 / 12 = 2 here,
    over 100 for small objects). An unreadable factual answer: IoU 0 whatever mask came."""
    gt = box(0, 2, 0, 2)
    spill = box(0, 2, 0, 4)                                  # M_c and 4 px beside it
    first = dict(gt_fact=gt, gt_counterfact=gt, pred_fact=gt, pred_textual=spill, pred_visual=None)
    real = hsb.scores([first])
    assert real["cms_fact"] == pytest.approx(16 / 12) and real["abstain_visual"] == 1.0
    assert real["unreadable_textual"] == real["unreadable_visual"] == 0.0
    # copies of one record with other unreadable roles: each is scored as it is
    base = lambda **more: {**first, **more}
    worst = hsb.scores([base(unreadable=["textual", "visual"]), base()])
    one = hsb.scores([base(unreadable=["textual", "visual"])])
    assert one["iou_textual"] == one["iou_visual"] == 1.0 and one["delta_iou_visual"] == 0.0
    assert isnan(one["cms_fact"]) and isnan(one["cms_counterfact"]) and one["n_cms_unreadable"] == 1
    assert one["n_cms_undefined"] == 0
    assert worst["cms_fact"] == real["cms_fact"] and worst["cms_counterfact"] == 0.0  # the readable one's
    assert worst["unreadable_textual"] == worst["unreadable_visual"] == 0.5
    # each CMS mean says how many pairs it is over: one lost role leaves the other's mean whole
    textual_lost = hsb.scores([base(unreadable=["textual"]), base()])
    assert (textual_lost["n_cms_fact"], textual_lost["n_cms_counterfact"], textual_lost["n_cms_unreadable"]) == (1, 2, 1)
    assert one["abstain_textual"] == one["abstain_visual"] == 0.0
    fact = hsb.scores([base(unreadable=["fact"])])
    assert fact["iou_fact"] == 0.0 and fact["cms_fact"] == real["cms_fact"]
    empty = np.zeros((4, 4))   # a degenerate empty truth: no answer reaches IoU 1 there
    assert hsb.scores([dict(gt_fact=gt, gt_counterfact=empty, pred_fact=gt, pred_textual=None, pred_visual=None,
                            unreadable=["visual"])])["iou_visual"] == 0.0
    with pytest.raises(ValueError, match="unreadable"):
        hsb.scores([base(unreadable=["caption"])])
    assert hsb.scores([base(pred_textual=None)])["cms_fact"] == 0.0   # another mask: scored anew
    assert hsb.scores([first])["cms_fact"] == real["cms_fact"]
    assert get_metric("hallusegbench.unreadable_textual").mechanism == "label_grounding"
    assert get_metric("hallusegbench.unreadable_visual").mechanism == "vision_grounding"
    assert get_metric("hallusegbench.unreadable_visual").higher_is_better is False


# -- Causal-HalBench --------------------------------------------------------------------------
def qa(image, question, correct, pair=None, invalid=False):
    r = {"image_type": image, "question_type": question, "correct": correct, "invalid": invalid}
    if pair is not None:
        r["pair_id"] = pair
    return r


def records_chb():
    rs = [qa("original", "contextual", c, f"c{i}") for i, c in enumerate([True, True, True, False])]   # 75
    rs += [qa("original", "absent", c, f"a{i}") for i, c in enumerate([True, True, False, False])]      # 50
    rs += [qa("counterfactual", "contextual", c, f"c{i}") for i, c in enumerate([True, False, True, False])]  # 50
    rs += [qa("inpainted", "absent", c, f"a{i}") for i, c in enumerate([True, False, True, True])]      # 75
    rs += [qa("cf", "counterfactual", True) for _ in range(4)]
    rs += [qa("cf", "counterfactual", True, invalid=True)]     # unreadable: wrong -> 4/5 = 80
    return rs


@pytest.mark.parametrize("answer, unreadable", [
    ("<c7> <c0>", True), ("I cannot tell", True), ("", True), ('{"size": [2, 2], "counts": [1]}', True),
    ("<c1> <c1> <c5> <c5>", False), ("[1, 1, 9, 9]", False), ("none", False), ("[[0, 0], [9, 0], [9, 9]]", False),
    ('{"size": [2, 2], "counts": [1, 3]}', False),
    # regions that cover no pixel of the 128 px image: not abstentions (session 38)
    ("[200, 200, 220, 220]", True), ("<c9> <c5> <c3> <c12>", True), ("[[130, 130], [150, 130], [150, 150]]", True),
])
def test_hallusegbench_answer_invalid_is_the_reading_the_pairs_are_scored_by(answer, unreadable):
    """The per-query flag the runner writes (``answer_invalid``) says exactly which roles a
    pair's metric record lists as unreadable."""
    from evaluators.benchmarks.hallusegbench.metrics import answer_invalid
    from evaluators.benchmarks.hallusegbench.suite import assemble, build

    rows = [{**q.record, "id": q.id, "benchmark": q.benchmark, "answer": answer if q.record["role"] == "visual" else "none"}
            for q in build(n_pairs=1, seed=2, splits=("referring",))]
    [pair] = assemble(rows)
    assert [answer_invalid(r) for r in rows] == [False, False, unreadable]
    assert pair["unreadable"] == (["visual"] if unreadable else [])
    assert answer_invalid({"benchmark": "hallusegbench", "answer": None, "invalid_input": "missing image x.png"})


def test_causal_halbench_pair_with_an_unusable_image_is_left_out_whole():
    """CAC compares the two images of each pair (Eq. 4): with one counterfactual image
    missing, keeping its original's answers had compared 12 original answers with 11 (an
    audit: a model answering both images alike scored CAC -6.8 instead of 0)."""
    from evaluators.runner import metric_records

    rows = []
    for i, right in enumerate([True, True, False, True]):  # each pair answered alike on both images
        for image in ("original", "counterfactual"):
            rows.append({**qa(image, "contextual", right, f"p{i}"), "benchmark": "causal_halbench"})
    rows[-1] = {**rows[-1], "invalid_input": "missing image x.jpg", "correct": False, "invalid": True}
    kept = metric_records("causal_halbench", rows)
    assert sorted({r["pair_id"] for r in kept}) == ["p0", "p1", "p2"] and len(kept) == 6
    assert get_metric("causal_halbench.cac").fn(kept) == 0.0


@pytest.mark.parametrize("field, value", [("correct", "False"), ("correct", 1), ("invalid", "no")])
def test_causal_halbench_flags_must_be_true_or_false(field, value):
    """Read by truthiness, ``"correct": "False"`` had scored a wrong answer as right."""
    records = records_chb()
    records[0] = {**records[0], field: value}
    with pytest.raises(ValueError, match=f"'{field}' must be true or false"):
        chb.causal_scores(records)


@pytest.mark.parametrize("records, score, field, value", [
    ("do", "prior_robust", "pred_yes", "no"), ("do", "prior_robust", "pred_yes", float("nan")),
    ("do", "prior_robust", "correct", "False"), ("do", "prior_robust", "invalid", 0),
    ("rb", "react_score", "correct", "False"), ("rb", "react_score", "invalid", "yes"),
    ("mioh", "overall", "correct", "False"), ("mioh", "overall", "invalid", "no"),
])
def test_flags_must_be_true_or_false_in_every_benchmark(records, score, field, value):
    """The same rule as Causal-HalBench's (evaluators.metrics.fields): DO-Bench read
    ``pred_yes: "no"`` as yes (PriorRobust 100 -> 50 for a model right everywhere) and
    ReactBench / MIOH ``correct: "False"`` as right (an audit, session 39)."""
    rows = {"do": records_do, "rb": records_rb, "mioh": records_mioh}[records]()
    rows[0] = {**rows[0], field: value}
    with pytest.raises(ValueError, match=f"'{field}' must be true or false"):
        get_metric(f"{ {'do': 'dobench', 'rb': 'reactbench', 'mioh': 'mioh'}[records]}.{score}").fn(rows)


def test_reactbench_record_without_qtype_is_refused():
    """It was pooled in ``n`` and the task's accuracy, and in no S_t^m (an audit, session 39)."""
    rows = records_rb()
    rows[0] = {k: v for k, v in rows[0].items() if k != "qtype"}
    with pytest.raises(ValueError, match="needs 'task' and 'qtype'"):
        rb.reactbench_scores(rows)


def test_dobench_level_true_is_not_level_1():
    rows = records_do()
    rows[0] = {**rows[0], "level": True}
    with pytest.raises(ValueError, match="level must be one of"):
        do.prior_robust(rows)


def test_causal_metrics():
    out = chb.causal_scores(records_chb())
    assert out["acc_original_contextual"] == 75.0 and out["acc_counterfactual_contextual"] == 50.0
    assert out["cac"] == 25.0                    # Eq. 4: 75 - 50
    assert out["aac"] == 25.0                    # Eq. 5: 75 - 50
    assert out["chr"] == pytest.approx(20.0)     # Eq. 6: 100 - 80
    assert out["accuracy"] == pytest.approx(100 * 14 / 21)  # 3 + 2 + 2 + 3 + 4 right of 21
    assert out["invalid_rate"] == pytest.approx(100 / 21)
    # CPR: contextual pairs c0..c3 both right: c0, c2 -> 2/4; absent a0..a3: a0 only -> 1/4
    assert out["cpr_contextual"] == 50.0 and out["cpr_absent"] == 25.0
    assert out["cpr"] == pytest.approx(100 * 3 / 8) and out["cpr_pairs"] == 8
    assert get_metric("causal_halbench.cac").fn(records_chb()) == 25.0
    assert get_metric("causal_halbench.chr").fn(records_chb()) == pytest.approx(20.0)


def test_cpr_one_original_with_several_counterfactuals():
    rs = [qa("original", "contextual", True, "g"), qa("counterfactual", "contextual", True, "g"),
          qa("counterfactual", "contextual", False, "g"), qa("original", "absent", True, "lonely")]
    out = chb.cpr(rs)
    assert out["cpr_contextual"] == 50.0 and out["cpr_pairs"] == 2   # (T,T) and (T,F)
    assert out["cpr_unpaired"] == 1 and isnan(out["cpr_absent"])
    assert out["cpr_no_pair_id"] == 0
    # a record without a pair_id is counted, not left out without a word
    assert chb.cpr([*rs, qa("counterfactual", "absent", True), qa("counterfactual", "counterfactual", True)]
                   )["cpr_no_pair_id"] == 1


def test_cpr_pairs_only_the_same_question_where_records_name_it():
    """Two absent questions per target (the paper's design): "fork?" on the original pairs
    with "fork?" on the counterfactual, never with "spoon?"."""
    def asked(image, correct, question):
        return {**qa(image, "absent", correct, "img"), "question": question}

    rs = [asked("original", True, "Is there a fork?"), asked("original", False, "Is there a spoon?"),
          asked("counterfactual", True, "is there a  fork?"), asked("counterfactual", False, "Is there a spoon?")]
    out = chb.cpr(rs)
    assert out["cpr_pairs"] == 2 and out["cpr_absent"] == 50.0  # (fork: T, T) and (spoon: F, F)
    unnamed = chb.cpr([{k: v for k, v in r.items() if k != "question"} for r in rs])
    # records without questions pair by type: each counterfactual answer (2) with the mean of
    # the original's absent answers (1/2): (1/2 * 1 + 1/2 * 0) / 2 = 25
    assert unnamed["cpr_pairs"] == 2 and unnamed["cpr_absent"] == 25.0


def test_cpr_one_pair_per_counterfactual_answer_when_the_original_repeats_a_question():
    """Table 1 asks the original image its questions once per counterfactual of it (4161 =
    3 x 1387 on 757 images), so two counterfactuals sharing o_c put "cup?" twice on the
    original. Each counterfactual answer is one pair; the repeated original answers are
    averaged. Crossing them had made A's 2 counterfactual images 4 pairs: 60% over 5 pairs."""
    def asked(image, correct, pair, question):
        return {**qa(image, "contextual", correct, pair), "question": question}

    rs = [asked("original", True, "A.jpg", "Is there a cup?"), asked("original", True, "A.jpg", "Is there a cup?"),
          asked("counterfactual", True, "A.jpg", "Is there a cup?"),    # A_001
          asked("counterfactual", False, "A.jpg", "Is there a cup?"),   # A_002
          asked("original", True, "B.jpg", "Is there a dog?"),
          asked("counterfactual", True, "B.jpg", "Is there a dog?")]
    out = chb.cpr(rs)
    assert out["cpr_pairs"] == 3 and out["cpr_contextual"] == pytest.approx(200 / 3)  # A_001, B_001 of 3
    # repeated original answers that disagree (sampling): each counterfactual pairs with their mean
    rs[1] = {**rs[1], "correct": False}
    assert chb.cpr(rs)["cpr_contextual"] == pytest.approx(100 * (0.5 + 1) / 3)


def test_causal_scores_n_and_invalid_rate_count_the_yes_no_answers_only():
    """A caption record (CHAIR) is no yes/no answer: an empty caption is not an invalid one."""
    rs = [qa("original", "contextual", True, "p"), qa("counterfactual", "contextual", True, "p"),
          {"image_type": "original", "caption": "", "objects": ["dog"], "invalid": True}]
    out = chb.causal_scores(rs)
    assert out["n"] == 2 and out["invalid_rate"] == 0.0 and out["accuracy"] == 100.0   # was n 3, invalid 33.3


def test_causal_empty_and_invalid_inputs():
    out = chb.causal_scores([])
    assert isnan(out["cac"]) and isnan(out["chr"]) and isnan(out["accuracy"])
    only_original = [qa("original", "contextual", True)]
    assert isnan(chb.causal_scores(only_original)["cac"])   # X_cf has no Q_c: NaN, no crash
    with pytest.raises(ValueError, match="only on counterfactual images"):
        chb.accuracy([qa("original", "counterfactual", True)])
    with pytest.raises(ValueError):
        chb.accuracy([qa("edited", "absent", True)])


def test_chair_world_table():
    from evaluators.world import SYNONYMS
    captions = ["A mug and a dog on a bench.",              # cup, dog, bench: all true
                "Two dogs chase a ball near a tree.",       # dog true; ball, tree hallucinated
                "A puppy, a puppy and a fork.",             # dog, dog hallucinated (repeats count); fork true
                "An empty room."]                           # no mention
    objects = [{"cup", "dog", "bench"}, {"dog"}, {"fork"}, {"cup"}]
    out = chb.chair(captions, objects, SYNONYMS)
    assert out["n_mentions"] == 9 and out["n_hallucinated"] == 4
    assert out["chair_s"] == 50.0                            # 2 of 4 captions
    assert out["chair_i"] == pytest.approx(100 * 4 / 9)      # 4 of 9 mentions
    assert out["per_caption"][2]["hallucinated"] == ["dog", "dog"]
    records = [{"caption": c, "objects": o} for c, o in zip(captions, objects)]
    assert get_metric("causal_halbench.chair_s").fn(records) == 50.0   # default table: the world's


def test_chair_coco_style_tables():
    rows = [["person", "girl", "boy", "man", "woman"], ["teddy bear", "teddybear"],
            ["dining table", "table"], ["hot dog"], ["dog", "puppy"]]
    caption = "Two men and a teddy bear near hot dogs on the table."
    # person (irregular plural "men"), teddy bear, hot dog ("hot dogs", not "dog"), dining table
    for table in (rows, "\n".join(", ".join(r) for r in rows)):
        out = chb.chair([caption], [{"person", "table"}], table)   # GT given as a synonym is mapped too
        assert out["per_caption"][0]["mentions"] == ["person", "teddy bear", "hot dog", "dining table"]
        assert out["chair_i"] == 50.0 and out["chair_s"] == 100.0
    assert isnan(chb.chair([], [], rows)["chair_s"])
    assert isnan(chb.chair(["nothing here"], [set()], rows)["chair_i"])   # no mentions: 0/0
    with pytest.raises(ValueError, match="listed under"):
        chb.synonym_index({"cup": ["mug"], "plate": ["mug"]})
    # a string is a comma-separated line, never its letters ("puppy" had made "p" a dog)
    lines = [", ".join(r) + "\n" for r in rows]  # synonyms.txt read with readlines()
    for table in ({"dog": "puppy", "cup": "mug, beaker"}, lines):
        index = chb.synonym_index(table)
        assert ("p",) not in index and ("u",) not in index
    assert chb.synonym_index({"dog": "puppy", "cup": "mug, beaker"})[("beaker",)] == "cup"
    assert chb.chair(["a puppy near a mug"], [set()], {"dog": "puppy", "cup": "mug"})["per_caption"][0]["mentions"] \
        == ["dog", "cup"]
    assert chb.chair([caption], [set()], lines)["per_caption"][0]["mentions"] == ["person", "teddy bear", "hot dog",
                                                                                  "dining table"]


# -- DO-Bench ---------------------------------------------------------------------------------
def answers(series, level, view, yes, no, invalid=0):
    out = [{"series": series, "level": level, "view": view, "pred_yes": True} for _ in range(yes)]
    out += [{"series": series, "level": level, "view": view, "pred_yes": False} for _ in range(no)]
    out += [{"series": series, "level": level, "view": view, "pred_yes": None} for _ in range(invalid)]
    return out


def records_do():
    rs = answers("A", 0, "Full", 4, 0)            # FN 0/4 = 0%
    rs += answers("A", 1, "Full", 3, 1)           # FN 25%
    rs += answers("A", 2, "Full", 2, 2)           # FN 50%
    rs += answers("A", 3, "Full", 0, 3, 1)        # FN 4/4 = 100% (the invalid one counts)
    rs += answers("A", 0, "Cluster", 3, 1)        # FN 25%
    rs += answers("A", 0, "Crop", 4, 0)           # FN 0%
    rs += answers("B", 0, "Full", 0, 4)           # FP 0%
    rs += answers("B", 1, "Full", 0, 4)           # FP 0%
    rs += answers("B", 2, "Full", 1, 3)           # FP 25%
    rs += answers("B", 3, "Full", 1, 2, 1)        # FP 2/4 = 50% (the invalid one counts)
    return rs


def test_dobench_diagnostics():
    rs = records_do()
    c = do.curves(rs)
    assert c["A_FN"] == {0: 0.0, 1: 25.0, 2: 50.0, 3: 100.0}
    assert c["B_FP"] == {0: 0.0, 1: 0.0, 2: 25.0, 3: 50.0}
    assert c["A0_FN_by_view"] == {"Full": 0.0, "Cluster": 25.0, "Crop": 0.0}
    # Eq. 2: 100 - (25 + 0) / 2
    assert do.perception_ability(rs) == 87.5
    # A_AUC = (0/2 + .25 + .5 + 1/2) / 3 = 1.25/3 ; B_AUC = (0 + 0 + .25 + .5/2) / 3 = 0.5/3
    assert do.normalised_auc(c["A_FN"]) == pytest.approx(1.25 / 3)
    assert do.normalised_auc(c["B_FP"]) == pytest.approx(0.5 / 3)
    # Eq. 3: 100 (1 - (1.25/3 + 0.5/3) / 2) = 100 (1 - 1.75/6) = 70.8333
    assert do.prior_robust(rs) == pytest.approx(100 * (1 - 1.75 / 6))
    assert get_metric("dobench.prior_robust").fn(rs) == pytest.approx(70.8333333)
    assert do.normalised_auc([100, 100, 100, 100]) == 1.0 and do.normalised_auc([0, 0, 0, 0]) == 0.0


def test_dobench_classification():
    out = do.classification(records_do())
    # A: 24 queries, 16 explicit yes (TP), 8 not yes; B: 16 queries, 2 yes (FP), 13 no (TN), 1 invalid
    assert out["n"] == 40
    assert out["accuracy"] == pytest.approx(100 * 29 / 40)    # (16 + 13) / 40
    assert out["precision"] == pytest.approx(100 * 16 / 18)   # 16 / (16 + 2)
    assert out["recall"] == pytest.approx(100 * 16 / 24)
    assert out["f1"] == pytest.approx(100 * 2 * (8 / 9) * (2 / 3) / (8 / 9 + 2 / 3))   # 76.19
    assert out["yes_rate"] == pytest.approx(100 * 18 / 40)
    assert out["invalid_rate"] == pytest.approx(100 * 2 / 40)


def test_dobench_grid_records_stay_out_of_the_protocol():
    rs = records_do() + answers("A", 2, "Cluster", 1, 1)
    assert do.classification(rs)["n"] == 40                  # the §4.4 grid cell is not counted
    grid = do.fn_grid(rs)
    assert grid[2]["Cluster"] == 50.0 and grid[3]["Full"] == 100.0 and isnan(grid[1]["Crop"])


def test_dobench_details_report_the_grid_where_records_hold_it():
    """Grid records (A-series Cluster/Crop above level 0, §4.4) load from users' files and feed
    only fn_grid, which no registered metric reads: ``details`` carries it where they exist."""
    assert "fn_grid" not in do.details(records_do())
    rs = records_do() + answers("A", 2, "Cluster", 1, 1)
    assert do.details(rs)["fn_grid"] == do.fn_grid(rs) and do.details(rs)["fn_grid"][2]["Cluster"] == 50.0


def test_dobench_crop_margins_are_read_one_at_a_time():
    """Views at 10% and 20% margins in one file (the schema allows both, Table 3 reports
    them apart): the protocol metrics read the 10% views alone, so the counts stay the
    10-instance protocol's, and PerceptionAbility is given per margin beside."""
    def at(margin, rows):
        return [{**r, "margin": margin} for r in rows]

    base = records_do()
    wide = at(0.2, answers("A", 0, "Cluster", 0, 4) + answers("A", 0, "Crop", 0, 4))  # FN 100% at 20%
    both = [r if r["view"] == "Full" else {**r, "margin": 0.1} for r in base] + wide
    assert do.classification(both) == do.classification(base)
    assert do.perception_ability(both) == do.perception_ability(base) == 87.5
    assert do.curves(both) == do.curves(base) and do.fn_grid(both) == do.fn_grid(base)
    assert do.perception_ability_by_margin(both) == {0.1: 87.5, 0.2: 0.0}
    assert do.details(both)["perception_ability_by_margin"] == {"0.1": 87.5, "0.2": 0.0}
    # one margin only (either), or none named: every record counts, as before
    only_wide = [r for r in base if r["view"] == "Full"] + wide
    assert do.perception_ability(only_wide) == 0.0 and do.perception_ability_by_margin(base) == {}
    assert "perception_ability_by_margin" not in do.details(base)
    # some views naming a margin and others not: which margin the others had is unknown
    with pytest.raises(ValueError, match="margin"):
        do.perception_ability(base + wide)


def test_dobench_missing_level_and_bad_records():
    rs = [r for r in records_do() if not (r["series"] == "B" and r["level"] == 3)]
    assert isnan(do.curves(rs)["B_FP"][3]) and isnan(do.prior_robust(rs))   # documented NaN, no crash
    assert isnan(do.perception_ability(answers("A", 0, "Full", 1, 0)))
    assert isnan(do.classification(answers("B", 0, "Full", 0, 2))["precision"])  # no "yes" at all
    # ``correct`` alone is enough; it must agree with ``pred_yes`` when both are given
    assert do.error_rate([{"series": "B", "level": 1, "correct": False}], "B", 1) == 100.0
    with pytest.raises(ValueError, match="inconsistent"):
        do.classification([{"series": "A", "level": 0, "pred_yes": False, "correct": True}])
    with pytest.raises(ValueError, match="Full view"):
        do.classification([{"series": "B", "level": 0, "view": "Crop", "pred_yes": False}])
    with pytest.raises(ValueError, match="level"):
        do.classification([{"series": "A", "level": 4, "pred_yes": True}])


def test_dobench_f1_of_a_model_that_never_says_yes_is_zero():
    """§3.3's "standard" F1 is 2 TP / (2 TP + FP + FN): a model answering "no" to every
    query has TP = 0 and a false negative per A-query, so F1 = 0 (the harmonic mean of P
    and R had given NaN, Precision being undefined with no "yes")."""
    rs = [{**r, "pred_yes": False} for r in records_do() if r["pred_yes"] is not None]
    out = do.classification(rs)
    assert isnan(out["precision"]) and out["recall"] == 0.0
    assert out["f1"] == 0.0 and do.f1(rs) == 0.0
    # where P and R exist it is their harmonic mean, as before: TP 1, FP 1, FN 1 -> 2 / 4
    one_each = answers("A", 0, "Full", 1, 1) + answers("B", 0, "Full", 1, 0)
    assert do.f1(one_each) == pytest.approx(50.0)
    assert isnan(do.f1(answers("B", 0, "Full", 0, 3)))   # nothing present, nothing said yes


# -- ReactBench -------------------------------------------------------------------------------
def block(task, mode, qtype, right, total, **extra):
    return [dict(task=task, mode=mode, qtype=qtype, correct=i < right, **extra) for i in range(total)]


def std_block(task):   # SA 50, MC 75, YN 100 -> S = .5*50 + .25*75 + .25*100 = 68.75
    return block(task, "standard", "SA", 2, 4) + block(task, "standard", "MC", 3, 4) + block(task, "std", "YN", 4, 4)


def cot_block(task, yn_right=2):   # SA 25, MC 100, YN 50 -> S = 12.5 + 25 + 12.5 = 50
    return block(task, "cot", "SA", 1, 4) + block(task, "cot", "MC", 4, 4) + block(task, "cot", "YN", yn_right, 4)


def records_rb():
    return (std_block("relational_erasure") + cot_block("relational_erasure")   # S_r = (68.75 + 50)/2 = 59.375
            + cot_block("counterfactual_attribute")                             # S_a = 50 (CoT only)
            + std_block("alteration_tracing")                                   # S_d = 68.75 (standard only)
            + std_block("dense_counting") + cot_block("dense_counting", 0))     # S_c = (68.75 + 37.5)/2 = 53.125


def test_react_score():
    rs = records_rb()
    assert rb.task_mode_score(rs, "relational_erasure", "standard") == pytest.approx(68.75)
    assert rb.task_mode_score(rs, "dense_counting", "cot") == pytest.approx(37.5)
    assert rb.task_score(rs, "relational_erasure") == pytest.approx(59.375)
    assert rb.task_score(rs, "counterfactual_attribute") == pytest.approx(50.0)
    # Eq. 3 with S_c = Dense Counting: .3*59.375 + .2*50 + .2*68.75 + .3*53.125 = 57.5
    assert rb.react_score_value(rs) == pytest.approx(57.5)
    assert get_metric("reactbench.react_score").fn(rs) == pytest.approx(57.5)
    assert get_metric("reactbench.dense_counting").fn(rs) == pytest.approx(53.125)
    assert rb.TASK_WEIGHTS == {"relational_erasure": 0.3, "counterfactual_attribute": 0.2,
                               "alteration_tracing": 0.2, "dense_counting": 0.3}


def test_reactbench_table():
    out = rb.reactbench_scores(records_rb())
    assert out["accuracy"]["relational_erasure"]["standard"] == pytest.approx(100 * 9 / 12)  # 2+3+4 of 12
    assert out["accuracy"]["relational_erasure"]["cot"] == pytest.approx(100 * 7 / 12)       # 1+4+2 of 12
    assert out["accuracy"]["relational_erasure"]["delta"] == pytest.approx(-100 * 2 / 12)
    assert isnan(out["accuracy"]["counterfactual_attribute"]["standard"])
    assert isnan(out["average"]["standard"])            # a task without standard runs
    assert out["by_qtype"]["dense_counting"]["cot"]["YN"] == 0.0
    assert out["modes_used"]["counterfactual_attribute"] == ["cot"]
    assert out["react_score"] == pytest.approx(57.5)


def test_reactbench_breakdowns_and_edge_cases():
    rs = (block("re", "std", "YN", 2, 2, dimension="direct") + block("re", "cot", "SA", 0, 2, dimension="absurd")
          + block("dc", "std", "MC", 1, 4, count_setting="exact") + block("dc", "std", "MC", 3, 4, count_setting="interval")
          + block("at", "std", "YN", 1, 2, hint="op"))
    bd = rb.breakdown(rs, "relational_erasure")
    assert bd["direct"] == 100.0 and bd["absurd"] == 0.0 and isnan(bd["commonsense"])
    assert isnan(rb.breakdown(rs, "relational_erasure", mode="std")["absurd"])   # absurd was asked in CoT only
    assert rb.breakdown(rs, "dense_counting") == {"exact": 25.0, "interval": 75.0}
    assert rb.breakdown(rs, "alteration_tracing")["operation"] == 50.0
    # RE has only YN (standard) and SA (cot): S^m needs all three types -> NaN, and so React-Score
    assert isnan(rb.task_score(rs, "relational_erasure")) and isnan(rb.react_score_value(rs))
    # an unreadable answer marked correct is still wrong
    assert rb.accuracy([dict(task="re", mode="cot", qtype="MC", correct=True, invalid=True)]) == 0.0
    with pytest.raises(ValueError, match="unknown value"):
        rb.accuracy(rs, task="counting_dense")


def test_reactbench_records_without_a_mode_are_standard():
    """The schema's ``mode`` defaults to standard; records that leave it out were in no mode,
    so S_t and React-Score were NaN while ``n`` and the breakdowns counted them."""
    named = std_block("relational_erasure") + std_block("alteration_tracing")
    unnamed = [{k: v for k, v in r.items() if k != "mode"} for r in named]
    assert rb.task_score(unnamed, "relational_erasure") == pytest.approx(68.75)
    assert rb.task_score(unnamed, "relational_erasure") == rb.task_score(named, "relational_erasure")
    assert rb.reactbench_scores(unnamed)["modes_used"]["alteration_tracing"] == ["standard"]
    assert rb.accuracy(unnamed, task="at", mode="standard") == pytest.approx(100 * 9 / 12)
    # a mix: the unnamed records join the standard ones, not a mode of their own
    mixed = unnamed[:6] + named[6:] + cot_block("relational_erasure")
    assert rb.task_score(mixed, "relational_erasure") == pytest.approx((68.75 + 50) / 2)


def test_reactbench_exact_count_answered_with_a_range_is_wrong():
    """An exact count answered with a range was read by its first number: "between 3 and 5"
    was right for 3 (the runner), where count_correct's exact rule says wrong."""
    import dataclasses

    from evaluators.query import Query, to_record

    q = Query("react-x-dc-0-SA", "reactbench", [], "how many cup are there ?", "number", 3,
              {"task": "dense_counting", "qtype": "SA", "mode": "standard", "count_setting": "exact"})
    assert rb.count_correct((3, 5), 3, "exact") is False       # the metrics' rule
    for stated in ("between 3 and 5", "3 to 5", "3-5", "from three to five"):
        record = to_record(q, stated)
        assert record["correct"] is False and record["invalid"] is False  # the runner's reading: wrong, not unreadable
    assert to_record(q, "there are 3 .")["correct"] and to_record(q, "twenty-one")["parsed"] == 21
    assert to_record(dataclasses.replace(q, truth=0), "none")["correct"]


@pytest.mark.parametrize("pred, setting, interval, expected", [
    (23, "exact", None, True), (22, "exact", None, False), (None, "exact", None, False),
    (27, "interval", (20, 29), True), (20, "interval", (20, 29), True), (30, "interval", (20, 29), False),
    ((20, 29), "interval", (20, 29), True), ((10, 19), "interval", (20, 29), False), (None, "interval", (20, 29), False),
])
def test_count_correct(pred, setting, interval, expected):
    assert rb.count_correct(pred, 23, setting, interval) is expected


def test_count_correct_needs_a_consistent_interval():
    with pytest.raises(ValueError):
        rb.count_correct(23, 23, "interval")
    with pytest.raises(ValueError, match="outside"):
        rb.count_correct(23, 23, "interval", (0, 9))


# -- MIOH -------------------------------------------------------------------------------------
def mq(task, condition, right, total, qtype="comprehensive", n_images=4, invalid_right=0):
    rs = [dict(task=task, qtype=qtype, condition=condition, n_images=n_images, correct=i < right)
          for i in range(total)]
    for r in rs[:invalid_right]:
        r["invalid"] = True   # marked correct but unreadable: wrong
    return rs


def records_mioh():
    return (mq("existence", "easy", 4, 4, invalid_right=1)                 # 3/4 = 75
            + mq("existence", "hard_negative", 1, 2)                       # 1/2 = 50
            + mq("existence", "NI", 2, 2, "selective", n_images=2)         # 2/2
            + mq("existence", "ni", 0, 2, "selective", n_images=8)         # 0/2 -> NI(8) 0, all 50
            + mq("counting", "easy", 2, 4)                                 # 2/4 = 50
            + mq("counting", "HN", 0, 8))                                  # 0/8 = 0


def test_mioh_table():
    out = mioh.mioh_table(records_mioh())
    ex, ct = out["by_task"]["existence"], out["by_task"]["counting"]
    assert ex["easy"] == 75.0 and ex["HN"] == 50.0 and ex["NI"] == 0.0 and isnan(ex["LC-S"])  # NI: NI(8)
    # Avg pools Table 1's questions (NI at 8 images): 4/8, not the column mean 41.7; every
    # NI question pooled is avg_all (6/10), which Avg was until session 37
    assert ex["avg"] == pytest.approx(50.0) and ex["avg_all"] == pytest.approx(60.0)
    assert ct["avg"] == pytest.approx(100 * 2 / 12)
    by_qtype = out["by_qtype"]["existence"]      # easy 3/4 + HN 1/2 comprehensive; NI 2/4 selective
    assert by_qtype["comprehensive"] == pytest.approx(100 * 4 / 6) and by_qtype["selective"] == 50.0
    assert isnan(by_qtype["comparative"])
    assert out["by_task_qtype_condition"]["existence"]["selective"]["NI"] == 0.0
    assert out["conditions"]["NI"]["pooled"] == 0.0 and out["ni_all"] == 50.0
    assert out["conditions"]["HN"]["pooled"] == pytest.approx(10.0)   # 1 of 10
    assert out["conditions"]["HN"]["macro"] == pytest.approx(25.0)    # (50 + 0) / 2
    assert isnan(out["conditions"]["LC-I"]["pooled"]) and isnan(out["conditions"]["LC-I"]["macro"])
    assert out["ni_by_count"][2] == 100.0 and out["ni_by_count"][8] == 0.0 and isnan(out["ni_by_count"][10])
    assert out["overall"] == pytest.approx(100 * 6 / 20) and out["overall_all"] == pytest.approx(100 * 8 / 22)
    assert get_metric("mioh.overall").fn(records_mioh()) == pytest.approx(30.0)
    assert out["overall_macro"] == pytest.approx((50 + 100 * 2 / 12) / 2)
    assert out["invalid_rate"] == pytest.approx(100 / 22)
    assert get_metric("mioh.hn").fn(records_mioh()) == pytest.approx(10.0)
    # Table 1's NI column is NI(8) (Sec. 5.3's 24.2 = the mean of its Overall NI cells);
    # every image count pooled is mioh.ni_all
    assert get_metric("mioh.ni").fn(records_mioh()) == 0.0
    assert get_metric("mioh.ni_all").fn(records_mioh()) == 50.0
    assert isnan(get_metric("mioh.lc_s").fn(records_mioh()))


def test_mioh_condition_names():
    assert [mioh.normalise_condition(c) for c in ("Easy", "hard_positive", "LC S", "sycophantic", "lc_i")] == [
        "easy", "HP", "LC-S", "LC-S", "LC-I"]
    with pytest.raises(ValueError, match="unknown MIOH condition"):
        mioh.accuracy([dict(task="existence", qtype="selective", condition="medium", correct=True)])


def test_mioh_decomposition():
    assert mioh.combine_existence([True, True]) == "all"
    assert mioh.combine_existence([True, False, False]) == "some"
    assert mioh.combine_existence([False, False]) == "none"
    assert mioh.combine_existence([True, None]) is None and mioh.combine_existence([]) is None
    dec = [dict(per_image=[True, True], gt="all"), dict(per_image=[True, False], gt="none"),
           dict(per_image=[False, False], gt="none"), dict(per_image=[True, None], gt="some")]
    out = mioh.decomposed_accuracy(dec)
    assert out == {"accuracy": 50.0, "invalid_rate": 25.0, "n": 4}
    gap = mioh.decomposition_gap(records_mioh(), dec)
    # comprehensive existence: easy 3/4 + HN 1/2 = 4/6 = 66.7; gap = 50 - 66.7
    assert gap["comprehensive"] == pytest.approx(100 * 4 / 6) and gap["gap"] == pytest.approx(50 - 100 * 4 / 6)
    with pytest.raises(ValueError):
        mioh.decomposed_accuracy([dict(per_image=[True], gt="maybe")])


def test_mioh_which_in_all():
    assert mioh.combine_which_in_all({"dog": [True, True], "cup": [True, False], "tree": [False, None]}) == "dog"
    assert mioh.combine_which_in_all({"dog": [True, False]}) == mioh.NONE_OF_THE_ABOVE
    assert mioh.combine_which_in_all({"dog": [True, True], "cup": [True, True]}) is None   # two qualify
    assert mioh.combine_which_in_all({"dog": [True, None]}) is None                        # cannot tell


def test_mioh_decomposition_compares_with_the_direct_questions_of_the_decomposed_tasks():
    """§5.5's gap: decomposed existence sets against direct *existence* NI questions; an NI
    counting question asked directly is not part of the comparison."""
    def row(task, correct, decomposed=False):
        return {"task": task, "qtype": "selective", "condition": "NI", "n_images": 4, "correct": correct,
                "decomposed": decomposed}

    rs = [row("existence", True), row("existence", False), row("counting", False), row("counting", False),
          row("existence", True, decomposed=True)]
    out = mioh.decomposition_by_qtype(rs)["selective"]
    assert out["direct"] == 50.0 and out["decomposed"] == 100.0 and out["gap"] == 50.0
    # the registered gap has the same baseline (it had pooled the counting questions too: 75)
    assert get_metric("mioh.decomposition_gap").fn(rs) == 50.0


def test_causal_halbench_chair_on_counterfactual_images_apart():
    """Table 4's parenthesised CHAIR figures are on the counterfactual images alone."""
    from evaluators.benchmarks.causal_halbench import metrics as chb

    records = [{"caption": "a fork and a dog", "objects": ["fork"], "image_type": "counterfactual"},
               {"caption": "a fork", "objects": ["fork"], "image_type": "inpainted"},  # the release's tag
               {"caption": "a knife", "objects": ["knife"], "image_type": "original"},
               {"image_type": "original", "question_type": "contextual", "correct": True, "invalid": False}]
    out = chb.details(records)
    assert out["chair_counterfactual"] == {"chair_s": 50.0, "chair_i": pytest.approx(100 / 3), "n_captions": 2,
                                           "n_empty": 0}
    assert out["chair_original"] == {"chair_s": 0.0, "chair_i": 0.0, "n_captions": 1, "n_empty": 0}
    assert get_metric("causal_halbench.chair_s").fn(records) == pytest.approx(100 / 3)  # pooled, as before
    # Table 2's columns over the question records alone (the captions are not in n)
    assert out["table2"]["acc_original_contextual"] == 100.0 and out["table2"]["n"] == 1


def test_an_empty_caption_is_not_a_clean_one():
    """No words is no description: out of CHAIR-s's denominator and counted, not a caption
    without hallucination (which lowered CHAIR-s: 50 -> 25 with two empty captions)."""
    from evaluators.world import SYNONYMS

    captions, objects = ["a fork and a dog", "a fork", "", "  . "], [{"fork"}] * 4
    out = chb.chair(captions, objects, SYNONYMS)
    assert out["chair_s"] == 50.0 and out["n_empty"] == 2 and out["n_captions"] == 4
    assert out["per_caption"][2] == {"mentions": [], "hallucinated": [], "empty": True}
    assert isnan(chb.chair(["", ""], [{"fork"}, {"fork"}], SYNONYMS)["chair_s"])
