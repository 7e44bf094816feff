"""DO-Bench metrics: paper §3.3, Eqs. 2-3; Table 2; curves of Fig. 4; the 4x3 grid of §4.4.

Each scene yields 10 instances (§3.1, §4.1): the present A-object (GT yes) at prior levels
0-3 in the Full view, plus A0 in the Cluster and Crop views; the removed B-object (GT no) at
levels 0-3 in the Full view. Record fields: ``series`` ("A" | "B"), ``level`` (0-3),
``view`` ("Full" | "Cluster" | "Crop"; default "Full"), and the answer as ``pred_yes``
(True / False / None = unreadable) and/or ``correct``; optional ``invalid``. The
report's paired bootstrap also needs ``scene_id`` (it resamples whole scenes:
:data:`evaluators.report.attribution.UNIT_FIELD`); the metrics themselves do not read it.

Formulas (all values in %, as in Table 2)::

    FN(level, view) = A-records answered other than "yes" / A-records     (false denials)
    FP(level)       = B-records answered other than "no"  / B-records     (false affirmations)
    PerceptionAbility = 100 - 1/2 (FN(A0, Cluster) + FN(A0, Crop))                 (Eq. 2)
    X_AUC = trapz(rate_0..rate_3 as fractions, x = 0, 1, 2, 3) / 3,  X in {A (FN), B (FP)}
    PriorRobust = 100 (1 - 1/2 (A_AUC + B_AUC))                                    (Eq. 3)
    Acc, Precision, Recall, F1, Yes-rate with "yes" as the positive class;
    F1 = 2 TP / (2 TP + FP + FN)  (the harmonic mean of Precision and Recall where both exist)

Eq. 3 checked against Table 2: with 124 scenes, ``(100 - PriorRobust) * 3 * 124 * 2 / 100``
must be a half-integer (trapezoid weights 1/2, 1, 1, 1/2 times counts). Within rounding it
is for most open models (LLaVA-v1.5-7B: 78.22 * 7.44 = 581.96; InternVL2.5-38B: 306.01;
Qwen2.5-VL-3B: 347.00), and with a maximum area of 4 it is not (Qwen2.5-VL-3B:
46.64 * 9.92 = 462.67). So rates are fractions in [0, 1], the level spacing is 1 and the
maximum possible area is 3. Eq. 2 likewise: ``(100 - PerceptionAbility) * 2.48`` is an
integer count of Cluster+Crop denials for 12 of the 14 open models (InternVL2.5-8B:
14.52 * 2.48 = 36.0), so FN there is in %.

Choices:

* **Invalid answers** are wrong: an unreadable answer to an A-query is a false denial and
  to a B-query a false affirmation in the FN/FP curves (they are error-rate curves; an
  unreadable answer is not robust to the prior), and wrong in Accuracy. Precision,
  Yes-rate and Recall use the literal answers: predicted positive = an explicit "yes"
  (so an invalid B answer lowers Accuracy but not Precision); Recall = explicit yes on A /
  all A, which equals 100 - the pooled FN. ``invalid_rate`` is reported beside them.
* **Global metrics** (Acc ... Yes-rate, PriorRobust, PerceptionAbility) use the
  10-instance protocol only. Records outside it (A-series Cluster/Crop at levels 1-3, the
  §4.4 grid) feed only :func:`fn_grid`.
* **Crop margins.** §4.5 / Table 3 report PerceptionAbility per crop margin (10%, 20%),
  never pooled. Cluster/Crop records may carry ``margin``; where they carry more than one,
  every protocol metric (the 10 instances, PerceptionAbility, the curves and the grid)
  reads the views of :data:`BASE_MARGIN` (else the smallest margin present), so each scene
  still contributes 10 instances, and :func:`perception_ability_by_margin` gives Eq. 2 per
  margin (in ``details``).
* **A level or view with no samples** gives NaN there, and NaN propagates into
  PriorRobust / PerceptionAbility; Precision is NaN when nothing is answered "yes".
* **F1 of a model that never says "yes"** is 0, not NaN. §3.3 reports "standard
  classification metrics (Accuracy, Precision, Recall, F1)" without formulas; the standard
  F1 is 2 TP / (2 TP + FP + FN), defined whenever there is a present object or a "yes"
  (it equals the harmonic mean of Precision and Recall wherever those two exist). A model
  that answers "no" to every query has TP = 0 and 744 false negatives on the paper's 124
  scenes, so F1 = 0 although Precision (TP / "yes" answers) is undefined; until this audit
  F1 was the harmonic mean of Precision and Recall and came out NaN there. NaN only when
  there is nothing to score (no A-query and no "yes").
* **Reading the answers.** The paper's normalisation rules are in an appendix we do not
  have (§3.3, §4.1). The runner reads yes/no as :func:`evaluators.answers.parse_yes_no`
  does (VLMEvalKit's rule: "yes" without "no" is yes, "no" or a leading "not" without "yes"
  is no, both: the first word decides; since session 38 also the existence denials "There
  isn't a cup", "I do not see a cup" read as no and hedges such as "Not sure." as
  neither; since session 39 an echoed "yes or no" says nothing, and a statement that the
  asked object is there, "There is a small cup in the image.", reads as yes, the
  counterpart of the denials: it had been unreadable, a false denial on every A-query). A
  sentence these rules still cannot read is unreadable, and on a B-query it then counts as
  a false affirmation (the first choice above). Read ``invalid_rate`` beside FP and
  PriorRobust for models that answer in sentences.
* **Queries that could not be asked** (a missing or corrupt image in user data) are not
  scored: they are counted as ``invalid_inputs`` in ``results.json`` and on the console
  line, and every rate here is over the instances asked. §3.3 requires "binary outputs for
  all instances"; an unreadable answer is the model's and counts as an error, a file that
  is not there says nothing of the model (our choice).
* **Repeated runs.** For API models the paper repeats inference three times "and report[s]
  averaged results" (§3.3, §4.1): score each run's records on their own and average the
  metrics. Passing the three runs' records together pools them, which averages the
  rate-type metrics (Accuracy, Recall, Yes-rate, FN/FP, PerceptionAbility, PriorRobust:
  every run has the same counts) but not Precision or F1, whose denominators differ by run.
* Table 2's closed models imply a positive share of 2/3 rather than the protocol's 0.6
  (Prec·Yes-rate/Rec = 0.667 for GPT-5.2), so their global metrics were computed over some
  other subset; 10 of the 14 open models fit 0.6 (LLaVA-v1.5-7B: 0.4761·0.4726/0.375 =
  0.600), four do not (Qwen2.5-VL-72B: 0.9739·0.4113/0.6008 = 0.667; also InstructBLIP-13B,
  InternVL2.5-78B, Qwen2.5-VL-32B: 0.625-0.667). We follow the protocol.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ...metrics.fields import flag, optional_flag
from ...metrics.registry import metric

LEVELS = (0, 1, 2, 3)
VIEWS = ("Full", "Cluster", "Crop")
SERIES = ("A", "B")


#: The crop margin the protocol metrics read when records carry several (the built-in
#: suite's default). DO-Bench does not give the margin of its main results: Table 3's
#: "Base" column differs from its 10% column (InternVL2.5-8B: 86.29 vs 87.90) and Table 2
#: gives a third value (85.48), so 10%, one of the two margins its stability analysis
#: names, is our choice.
BASE_MARGIN = 0.1


def _view_of(r: Mapping[str, Any]) -> str:
    return str(r.get("view", "Full")).capitalize()


def _margin(r: Mapping[str, Any]) -> float | None:
    """A Cluster/Crop record's margin (None for a Full view or a record that names none)."""
    if _view_of(r) == "Full" or r.get("margin") is None:
        return None
    return round(float(r["margin"]), 6)


def margins(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """The distinct crop margins of the records' Cluster/Crop views, ascending; a
    ``ValueError`` when some of those views name a margin and others do not (which margin
    the unnamed ones were cut with cannot be told)."""
    views = [r for r in records if _view_of(r) != "Full"]
    named = [_margin(r) for r in views]
    if any(m is None for m in named) and any(m is not None for m in named):
        raise ValueError("margin: some Cluster/Crop records name a crop margin and others do not; "
                         "name it on all of them or on none")
    return sorted({m for m in named if m is not None})


def _at_margin(records: Iterable[Mapping[str, Any]], margin: float | None = None) -> list[Mapping[str, Any]]:
    """The records with only one margin's Cluster/Crop views: ``margin``, or where several
    are present :data:`BASE_MARGIN` (else the smallest); all records where at most one is."""
    records = list(records)
    present = margins(records)
    if margin is None:
        if len(present) <= 1:
            return records
        margin = BASE_MARGIN if round(BASE_MARGIN, 6) in present else present[0]
    margin = round(float(margin), 6)
    return [r for r in records if _margin(r) in (None, margin)]


def _pct(num: float, den: int) -> float:
    return 100.0 * num / den if den else math.nan


def _parse(r: Mapping[str, Any]) -> tuple[str, int, str, bool | None]:
    """(series, level, view, answer) with answer True = yes, False = no, None = unreadable."""
    series = str(r.get("series", "")).upper()
    if series not in SERIES:
        raise ValueError(f"series must be 'A' or 'B', got {r.get('series')!r}")
    level = r.get("level")
    if isinstance(level, bool) or level not in LEVELS:  # True == 1 would pass as level 1
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    view = str(r.get("view", "Full")).capitalize()
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {r.get('view')!r}")
    if series == "B" and view != "Full":
        raise ValueError("the B-series (absent object) is only posed in the Full view")
    gt_yes = series == "A"
    # bools only (evaluators.metrics.fields): pred_yes "no" had read as yes
    if flag(r, "invalid", False):
        return series, int(level), view, None
    if "pred_yes" in r:
        answer = optional_flag(r, "pred_yes")
        if answer is None:
            return series, int(level), view, None
        if "correct" in r and flag(r, "correct") != (answer == gt_yes):
            raise ValueError(f"record is inconsistent: series {series}, pred_yes={answer}, correct={r['correct']}")
        return series, int(level), view, answer
    if "correct" not in r:
        raise KeyError("record needs 'pred_yes' or 'correct'")
    return series, int(level), view, flag(r, "correct") == gt_yes


def _in_protocol(series: str, level: int, view: str) -> bool:
    return view == "Full" or (series == "A" and level == 0)


def _protocol(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, str, bool | None]]:
    return [p for p in map(_parse, records) if _in_protocol(*p[:3])]


def error_rate(records: Iterable[Mapping[str, Any]], series: str, level: int, view: str = "Full") -> float:
    """FN rate (series A) or FP rate (series B), in %, at one level and view; invalid = error."""
    return _error_rate([_parse(r) for r in _at_margin(records)], series, level, view)


def _error_rate(parsed: Sequence[tuple], series: str, level: int, view: str = "Full") -> float:
    series, view = series.upper(), view.capitalize()
    gt_yes = series == "A"
    cell = [a for s, lv, v, a in parsed if (s, lv, v) == (series, level, view)]
    return _pct(sum(a is not gt_yes for a in cell), len(cell))


def classification(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Acc, Precision, Recall, F1, Yes-rate and invalid rate (%), yes = positive class."""
    parsed = _protocol(_at_margin(records))
    n = len(parsed)
    pos = sum(s == "A" for s, *_ in parsed)
    tp = sum(s == "A" and a is True for s, _, _, a in parsed)
    fp = sum(s == "B" and a is True for s, _, _, a in parsed)
    tn = sum(s == "B" and a is False for s, _, _, a in parsed)
    said_yes = tp + fp
    precision = _pct(tp, said_yes)
    recall = _pct(tp, pos)
    # F1 = 2 TP / (2 TP + FP + FN), FN = present objects not answered "yes" (module notes):
    # 0 for a model that never says "yes", where the harmonic mean of P and R had been NaN
    f1 = _pct(2 * tp, 2 * tp + fp + (pos - tp))
    return {
        "accuracy": _pct(tp + tn, n),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "yes_rate": _pct(said_yes, n),
        "invalid_rate": _pct(sum(a is None for *_, a in parsed), n),
        "n": n,
    }


def curves(records: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    """Plot data of Fig. 4, in %: ``A_FN`` {level: FN}, ``B_FP`` {level: FP} (Full view),
    ``A0_FN_by_view`` {view: FN at A0}."""
    parsed = [_parse(r) for r in _at_margin(records)]  # once: the bootstrap calls this ~1000 times per arm
    return {
        "A_FN": {lv: _error_rate(parsed, "A", lv) for lv in LEVELS},
        "B_FP": {lv: _error_rate(parsed, "B", lv) for lv in LEVELS},
        "A0_FN_by_view": {v: _error_rate(parsed, "A", 0, v) for v in VIEWS},
    }


def fn_grid(records: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """FN (%) over prior level x evidence view for the A-object (§4.4, Fig. 5); NaN cells
    where no records were given."""
    parsed = [_parse(r) for r in _at_margin(records)]
    return {lv: {v: _error_rate(parsed, "A", lv, v) for v in VIEWS} for lv in LEVELS}


def normalised_auc(rates_pct: Mapping[int, float] | Sequence[float]) -> float:
    """Trapezoidal area under a rate curve over levels 0-3 (spacing 1), rates given in %,
    divided by the maximum possible area 3 (rate 1 everywhere): a value in [0, 1]."""
    values = [rates_pct[lv] for lv in LEVELS] if isinstance(rates_pct, Mapping) else list(rates_pct)
    if len(values) != len(LEVELS):
        raise ValueError(f"need one rate per level {LEVELS}, got {len(values)}")
    y = np.asarray(values, dtype=float) / 100.0
    area = float(np.sum((y[1:] + y[:-1]) / 2.0))  # trapezoid rule, unit spacing
    return area / (len(LEVELS) - 1)


@metric("dobench.perception_ability", "dobench", "perception", True, "pooled")
def perception_ability(records) -> float:
    """Eq. 2: 100 - 1/2 (FN(A0, Cluster) + FN(A0, Crop)), FN in %, at one crop margin
    (module notes)."""
    return _perception([_parse(r) for r in _at_margin(records)])  # parsed once: bootstrapped ~1000 times


def _perception(parsed: Sequence[tuple]) -> float:
    return 100.0 - 0.5 * (_error_rate(parsed, "A", 0, "Cluster") + _error_rate(parsed, "A", 0, "Crop"))


def perception_ability_by_margin(records: Iterable[Mapping[str, Any]]) -> dict[float, float]:
    """Eq. 2 per crop margin the records carry (Table 3's 10% / 20% columns); empty when
    none names a margin."""
    records = list(records)
    return {m: _perception([_parse(r) for r in _at_margin(records, m)]) for m in margins(records)}


@metric("dobench.prior_robust", "dobench", "language_prior", True, "trapezoid_auc")
def prior_robust(records) -> float:
    """Eq. 3: 100 (1 - 1/2 (A_AUC + B_AUC)), AUCs of the A-FN and B-FP curves over levels
    0-3 (Full view), each normalised by the maximum area."""
    c = curves(records)
    return 100.0 * (1.0 - 0.5 * (normalised_auc(c["A_FN"]) + normalised_auc(c["B_FP"])))


def _global(key: str):
    def fn(records) -> float:
        return classification(records)[key]
    return fn


@metric("dobench.accuracy", "dobench", None, True, "pooled")
def accuracy(records) -> float:
    """Accuracy (%) over the 10-instance protocol; an invalid answer is wrong."""
    return _global("accuracy")(records)


@metric("dobench.precision", "dobench", None, True, "pooled")
def precision(records) -> float:
    """Precision (%) of "yes" (TP / explicit yes answers)."""
    return _global("precision")(records)


@metric("dobench.recall", "dobench", None, True, "pooled")
def recall(records) -> float:
    """Recall (%) of "yes" (TP / present A-queries)."""
    return _global("recall")(records)


@metric("dobench.f1", "dobench", None, True, "pooled")
def f1(records) -> float:
    """F1 (%) of the "yes" class."""
    return _global("f1")(records)


@metric("dobench.yes_rate", "dobench", None, None, "pooled")
def yes_rate(records) -> float:
    """Share (%) of explicit "yes" answers; no preferred direction (the protocol's GT yes share is 60%)."""
    return _global("yes_rate")(records)


def dobench_scores(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Table 2 row plus the Fig. 4 curves: classification metrics, PerceptionAbility,
    PriorRobust, A_AUC, B_AUC and ``curves``."""
    records = list(records)
    out: dict[str, Any] = classification(records)
    c = curves(records)
    out["a_auc"] = normalised_auc(c["A_FN"])
    out["b_auc"] = normalised_auc(c["B_FP"])
    out["perception_ability"] = perception_ability(records)
    out["prior_robust"] = 100.0 * (1.0 - 0.5 * (out["a_auc"] + out["b_auc"]))
    out["curves"] = c
    return out


def details(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``results.json`` carries beside the registered metrics: Fig. 4's FN/FP curves
    per level and view, the two normalised AUCs PriorRobust is made of, and where records
    hold A-series Cluster/Crop views above level 0 (which no registered metric reads) the
    §4.4 grid, :func:`fn_grid`."""
    records = list(records)
    c = curves(records)
    out = {"curves": c, "a_auc": normalised_auc(c["A_FN"]), "b_auc": normalised_auc(c["B_FP"])}
    if any(not _in_protocol(*_parse(r)[:3]) for r in records):
        out["fn_grid"] = fn_grid(records)
    by_margin = perception_ability_by_margin(records)
    if by_margin:
        out["perception_ability_by_margin"] = {str(m): v for m, v in by_margin.items()}
    return out


__all__ = [
    "LEVELS", "details", "SERIES", "VIEWS", "accuracy", "classification", "curves", "dobench_scores", "error_rate", "f1",
    "fn_grid", "margins", "normalised_auc", "perception_ability", "perception_ability_by_margin", "precision",
    "prior_robust", "recall", "yes_rate", "BASE_MARGIN",
]
