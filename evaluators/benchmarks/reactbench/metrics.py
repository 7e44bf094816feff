"""ReactBench metrics: paper §4.1 "Evaluation Metrics and Methods", Eqs. 1-3; Tables 3-4.

Tasks (§3.1) and their React-Score letters (Eq. 3 - note ``S_c`` is Dense *Counting*,
not Counterfactual attribute)::

    relational_erasure       S_r  weight 0.3   co-occurrence bias
    counterfactual_attribute S_a  weight 0.2   language priors
    alteration_tracing       S_d  weight 0.2   cross-image comparison
    dense_counting           S_c  weight 0.3   fine-grained perception

    A_q          = accuracy (%) of question type q in {MC, SA, YN} for task t, mode m
    S_t^m        = 0.5 A_SA + 0.25 A_MC + 0.25 A_YN                    (Eq. 1)
    S_t          = 1/2 (S_t^cot + S_t^std)                             (Eq. 2)
    React-Score  = 0.3 S_r + 0.2 S_a + 0.2 S_d + 0.3 S_c               (Eq. 3)

Record fields: ``task``, ``qtype`` ("MC" | "SA" | "YN"), ``mode`` ("standard" | "cot";
aliases "std", "normal"; a record without one is standard, as the schema's ``mode`` defaults),
``correct``, optional ``invalid`` (counted wrong, reported in
``invalid_rate``), and the task's breakdown field: ``dimension`` ("direct" |
"commonsense" | "premise" | "absurd") for relational_erasure / counterfactual_attribute,
``hint`` ("none" | "location" | "operation") for alteration_tracing, ``count_setting``
("exact" | "interval") for dense_counting.

Choices:

* **Table 3's per-task Std/CoT columns are pooled accuracies**, not ``S_t^m`` (Qwen3.5-27B:
  the weighted sums of its columns give 60.8, its React-Score is 59.5), and its "Average"
  is the unweighted mean of the four task accuracies (48.0, 56.3, 79.9, 69.3 -> 63.4). We
  report both. App. C.2 supports this reading: each column is 100 minus the unweighted
  mean of that model's per-question hallucination rates in Tables 11-14 (Qwen3.5-27B,
  Normal: its 13 Relational Erasure rates average 52.04, Table 3 gives 48.0; within 0.15 in
  93 of the 96 model x mode x task cells, all 96 checked in this audit), an accuracy in
  which each question counts once whatever its type (Eq. 1's 0.5 / 0.25 / 0.25 only if
  half of a task's questions were short answers, which the React-Scores of the models run
  in both modes rule out). That mean equals our pooled accuracy when every question is asked
  of every image (12, 12, 12 and 8 per image by Table 2's counts; the built-in suite asks
  every item of a task the same questions). Table 11 averages Relational Erasure over 13
  columns although "Q1a and Q1b are viewed as one question" (19,140 QA = 1,595 images x
  12): where Q1a and Q1b are asked of different numbers of images, the paper's column
  weights them as two questions and our pooled accuracy by their counts; records carry no
  question-template id, so we pool. Only the two models run with CoT alone fit Eq. 3 over
  their columns (65.25 for 65.3, Qwen3VL-32B-Thinking; 57.53 for 57.5, MiMO-VL-7B), as if
  the authors' React-Score had used the column in place of ``S_t`` where a mode is missing;
  we apply Eq. 1 in every case.
* **One mode only.** Eq. 2 averages both modes, yet Table 3 gives React-Scores for models
  run only with CoT (Qwen3VL-32B-Thinking, MiMO-VL-7B). ``S_t`` is therefore the mean over
  the modes present for that task; ``modes_used`` says which.
* **Missing cells.** A question type with no samples makes ``S_t^m`` NaN (its weight cannot
  be redistributed without changing Eq. 1), which propagates into ``S_t`` and React-Score.
  Empty breakdown cells are NaN.
* **Breakdowns** (Table 4: inducing dimension, hint, exact/interval) pool both modes and
  all question types unless ``mode`` is given; the paper does not say, and its Table 4
  averages models, not modes.
* **Exact vs interval counting.** The paper gives no rule for the intervals (only
  "exact-count queries and interval-based queries", §3.1; Table 4); the interval is part of
  the question. :func:`count_correct` scores an exact query by equality and an interval
  query by whether the answer lies in the question's ground-truth interval, inclusive at
  both ends (an answered interval must equal it). The runner applies this rule to interval
  queries (:func:`evaluators.query.to_record`, answer kind "interval"), reading "between 3
  and 5" / "3 to 5" / "3-5" as an answered interval (:func:`evaluators.answers.parse_count`).
  An exact query (answer kind "number": the built-in suite's and users' short-answer
  counts) reads a stated range as that range, so "between 3 and 5" is wrong for a ground
  truth of 3, as ``count_correct(..., "exact")`` has it (the paper asks for "the exact
  quantity", §3.1); until session 36 the runner took its first number, and it was right.
* **Short answers (SA) are scored by keywords unless a judge is given**: the paper grades
  with an LLM judge (App. C.1, Fig. 24), which the runner applies when given one
  (:mod:`evaluators.judge`, ``vlm-eval --judge``; the rule's grade is kept in
  ``rule_correct``); without one, no judge model runs. By rule, an answer is right when it says every word of the
  ground truth or of one of its ``synonyms``, each word counted only where neither of the
  two words before it negates it ("there is no fork" does not say "fork";
  :func:`evaluators.answers.keywords_found`; "wasn't" is "was not"). A users' file's
  answer is graded on its content words ("the fork was removed" on fork and removed:
  ``protocols.STOPWORDS``). A paraphrase outside the synonyms is scored wrong where a judge
  might accept it; and, unlike a judge, the words are not read in order or against what
  else the answer says: "the fork was replaced by a bird" says every word of "the bird was
  replaced by a fork", and "added, moved or removed" says "removed". So A_SA is neither a
  lower nor an upper bound of the judged accuracy; compare it between arms, as the report does.
* **Breakdowns mix question types** as the suite builds them (hint "none" holds SA, YN and
  MC; "location" / "operation" SA only; dimension "absurd" MC only; the paper does not say
  which types each of Table 4's columns holds), so compare a breakdown cell between arms,
  not across cells; ``by_qtype`` gives the per-type accuracies.
* **Multiple-choice and yes/no answers are read by rule** unless a judge is given: App. C.1
  grades "across all question types" with an LLM judge (Fig. 24), and so does
  :mod:`evaluators.judge` when given one; by rule, the runner reads an option
  letter or a unique option text (:func:`evaluators.answers.parse_option`) and yes/no as
  :func:`evaluators.answers.parse_yes_no` does ("yes" without "no" and vice versa, and a
  few existence denials without "no": "There isn't a fork."). An answer these rules cannot
  read ("The fork seems to be gone.") is invalid, and so wrong, where a judge would read
  it; ``invalid_rate`` says how many.
* **Chain-of-thought answers** are read from what follows their closing "answer is" /
  "final answer:" when that part is readable (:func:`evaluators.answers.answer_tail`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Mapping, Sequence

from ...metrics.fields import flag
from ...metrics.registry import metric

TASKS = ("relational_erasure", "counterfactual_attribute", "alteration_tracing", "dense_counting")
QTYPES = ("MC", "SA", "YN")
MODES = ("standard", "cot")
QTYPE_WEIGHTS = {"SA": 0.5, "MC": 0.25, "YN": 0.25}
TASK_WEIGHTS = {"relational_erasure": 0.3, "counterfactual_attribute": 0.2, "alteration_tracing": 0.2,
                "dense_counting": 0.3}
BREAKDOWN_FIELD = {"relational_erasure": "dimension", "counterfactual_attribute": "dimension",
                   "alteration_tracing": "hint", "dense_counting": "count_setting"}
BREAKDOWN_VALUES = {"dimension": ("direct", "commonsense", "premise", "absurd"),
                    "hint": ("none", "location", "operation"),
                    "count_setting": ("exact", "interval")}
_ALIASES = {
    "task": {"relational_erasure": "relational_erasure", "re": "relational_erasure", "rela": "relational_erasure",
             "counterfactual_attribute": "counterfactual_attribute", "ca": "counterfactual_attribute",
             "attr": "counterfactual_attribute", "alteration_tracing": "alteration_tracing",
             "at": "alteration_tracing", "comp": "alteration_tracing", "dense_counting": "dense_counting",
             "dc": "dense_counting", "count": "dense_counting"},
    "qtype": {"mc": "MC", "sa": "SA", "yn": "YN"},
    "mode": {"standard": "standard", "std": "standard", "normal": "standard", "cot": "cot"},
    "dimension": {"direct": "direct", "commonsense": "commonsense", "common": "commonsense",
                  "premise": "premise", "absurd": "absurd"},
    "hint": {"none": "none", "no": "none", "none-hint": "none", "location": "location", "loc": "location",
             "loc-hint": "location", "operation": "operation", "op": "operation", "op-hint": "operation"},
    "count_setting": {"exact": "exact", "interval": "interval"},
}


def _pct(num: float, den: int) -> float:
    return 100.0 * num / den if den else math.nan


def _norm(field: str, value: Any) -> str:
    try:
        return _norm_hashable(field, value)
    except TypeError:  # an unhashable value (a list where a name belongs): same rule, no memo
        return _norm_hashable.__wrapped__(field, value)


@functools.lru_cache(maxsize=4096)  # pure; called for every record and filter in every bootstrap resample
def _norm_hashable(field: str, value: Any) -> str:
    key = str(value).lower().replace(" ", "_") if field == "task" else str(value).lower()
    try:
        return _ALIASES[field][key]
    except KeyError:
        known = sorted(set(_ALIASES[field].values()))
        raise ValueError(f"{field}: unknown value {value!r}; known: {known}") from None


def _is_correct(r: Mapping[str, Any]) -> bool:
    # bools only (evaluators.metrics.fields): correct="False" had counted as right
    return flag(r, "correct") and not flag(r, "invalid", False)


#: A record field's value where the record has none: a question without ``mode`` was asked
#: in the standard mode (the schema's default, :mod:`.schema`). Until this audit such
#: records were in no mode, so S_t, React-Score and the per-mode accuracies left them out
#: while ``n`` and the breakdowns counted them (a file without modes scored NaN).
_DEFAULTS = {"mode": "standard"}


def _value(r: Mapping[str, Any], field: str) -> Any:
    return r.get(field, _DEFAULTS.get(field))


def _matches(r: Mapping[str, Any], filters: Mapping[str, Any]) -> bool:
    for field, wanted in filters.items():
        if wanted is None:
            continue
        value = _value(r, field)
        if value is None or _norm(field, value) != _norm(field, wanted):
            return False
    return True


def accuracy(records: Iterable[Mapping[str, Any]], **filters: Any) -> float:
    """Pooled accuracy (%) of the records matching ``filters`` (field=value; None = any),
    e.g. ``accuracy(rs, task="dense_counting", count_setting="interval")``. NaN if none."""
    hits = n = 0
    for r in records:
        # a record without its task or question type was pooled in `n` and the per-task
        # accuracy but in no S_t^m, so React-Score left it out unsaid (an audit, session 39)
        if r.get("task") is None or r.get("qtype") is None:
            raise ValueError(f"record needs 'task' and 'qtype' (MC, SA or YN), got {dict(r)!r:.200}")
        if _matches(r, filters):
            n += 1
            hits += _is_correct(r)
    return _pct(hits, n)


def count_correct(pred: Any, gt: int, setting: str = "exact",
                  interval: tuple[int, int] | None = None) -> bool:
    """Is a dense-counting answer right? ``pred`` is a count (int), an answered interval
    ``(lo, hi)``, or None (unreadable: wrong). Exact: ``pred == gt``. Interval: ``interval``
    is the question's ground-truth interval (inclusive, must contain ``gt``); a count is
    right when it lies inside, an answered interval when it equals it."""
    setting = _norm("count_setting", setting)
    if pred is None:
        return False
    if setting == "exact":
        return not isinstance(pred, tuple) and int(pred) == int(gt)
    if interval is None:
        raise ValueError("an interval query needs its ground-truth interval (lo, hi)")
    lo, hi = (int(x) for x in interval)
    if not lo <= int(gt) <= hi:
        raise ValueError(f"ground truth {gt} is outside its interval {interval}")
    if isinstance(pred, tuple):
        return tuple(int(x) for x in pred) == (lo, hi)
    return lo <= int(pred) <= hi


def task_mode_score(records: Sequence[Mapping[str, Any]], task: str, mode: str) -> float:
    """S_t^m of Eq. 1 (%); NaN if a question type has no samples."""
    return sum(w * accuracy(records, task=task, mode=mode, qtype=q) for q, w in QTYPE_WEIGHTS.items())


def _modes_present(records: Sequence[Mapping[str, Any]], task: str) -> list[str]:
    present = {_norm("mode", _value(r, "mode")) for r in records if _matches(r, {"task": task})}
    return [m for m in MODES if m in present]


def task_score(records: Sequence[Mapping[str, Any]], task: str) -> float:
    """S_t of Eq. 2 (%): mean of S_t^m over the modes present; NaN if the task has none."""
    records = list(records)
    modes = _modes_present(records, task)
    if not modes:
        return math.nan
    return sum(task_mode_score(records, task, m) for m in modes) / len(modes)


def react_score_value(records: Sequence[Mapping[str, Any]]) -> float:
    """React-Score of Eq. 3 (%)."""
    records = list(records)
    return sum(w * task_score(records, t) for t, w in TASK_WEIGHTS.items())


def breakdown(records: Sequence[Mapping[str, Any]], task: str, mode: str | None = None) -> dict[str, float]:
    """Table 4 breakdown of one task (%): by inducing dimension, hint or exact/interval, and
    ``"not given"`` for the task's records that do not say (users' data may leave the field
    out; they would otherwise be in no group, silently)."""
    task = _norm("task", task)
    field = BREAKDOWN_FIELD[task]
    records = list(records)
    out = {v: accuracy(records, task=task, mode=mode, **{field: v}) for v in BREAKDOWN_VALUES[field]}
    unsaid = [r for r in records if r.get(field) is None and _matches(r, {"task": task, "mode": mode})]
    if unsaid:
        out["not given"] = accuracy(unsaid)
    return out


def reactbench_scores(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Everything of Tables 3-4 for one model.

    ``accuracy[task][mode]`` (pooled, Table 3) with ``delta`` = cot - standard,
    ``average[mode]`` (mean over tasks, Table 3), ``by_qtype[task][mode][qtype]``,
    ``S_tm[task][mode]``, ``S_t[task]``, ``modes_used[task]``, ``react_score``,
    ``breakdown[task]``, ``invalid_rate``, ``n``."""
    records = list(records)
    acc = {t: {m: accuracy(records, task=t, mode=m) for m in MODES} for t in TASKS}
    for t in TASKS:
        acc[t]["delta"] = acc[t]["cot"] - acc[t]["standard"]
    return {
        "accuracy": acc,
        "average": {m: sum(acc[t][m] for t in TASKS) / len(TASKS) for m in MODES},
        "by_qtype": {t: {m: {q: accuracy(records, task=t, mode=m, qtype=q) for q in QTYPES} for m in MODES}
                     for t in TASKS},
        "S_tm": {t: {m: task_mode_score(records, t, m) for m in MODES} for t in TASKS},
        "S_t": {t: task_score(records, t) for t in TASKS},
        "modes_used": {t: _modes_present(records, t) for t in TASKS},
        "react_score": react_score_value(records),
        "breakdown": {t: breakdown(records, t) for t in TASKS},
        "invalid_rate": _pct(sum(flag(r, "invalid", False) for r in records), len(records)),
        "n": len(records),
    }


def details(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``results.json`` carries beside the registered metrics: Table 4's breakdowns
    (inducing dimension, hint, exact/interval; NaN -> None for JSON) and the per-mode
    pooled accuracies of Table 3."""
    records = list(records)

    def clean(value: float) -> float | None:
        return None if isinstance(value, float) and math.isnan(value) else value

    return {
        "breakdown": {t: {k: clean(v) for k, v in breakdown(records, t).items()} for t in TASKS},
        "accuracy_by_mode": {t: {m: clean(accuracy(records, task=t, mode=m)) for m in MODES} for t in TASKS},
    }


@metric("reactbench.relational_erasure", "reactbench", "cooccurrence", True, "weighted_sum")
def relational_erasure(records) -> float:
    """S_r (Eq. 2): question-weighted Relational Erasure score, mean over modes (%)."""
    return task_score(list(records), "relational_erasure")


@metric("reactbench.counterfactual_attribute", "reactbench", "language_prior", True, "weighted_sum")
def counterfactual_attribute(records) -> float:
    """S_a (Eq. 2): question-weighted Counterfactual Attribute score, mean over modes (%)."""
    return task_score(list(records), "counterfactual_attribute")


@metric("reactbench.alteration_tracing", "reactbench", "multi_image", True, "weighted_sum")
def alteration_tracing(records) -> float:
    """S_d (Eq. 2): question-weighted Alteration Tracing score, mean over modes (%)."""
    return task_score(list(records), "alteration_tracing")


@metric("reactbench.dense_counting", "reactbench", "perception", True, "weighted_sum")
def dense_counting(records) -> float:
    """S_c (Eq. 2): question-weighted Dense Counting score, mean over modes (%)."""
    return task_score(list(records), "dense_counting")


@metric("reactbench.react_score", "reactbench", None, True, "weighted_sum")
def react_score(records) -> float:
    """React-Score (Eq. 3): 0.3 S_r + 0.2 S_a + 0.2 S_d + 0.3 S_c (%)."""
    return react_score_value(list(records))


__all__ = [
    "BREAKDOWN_FIELD", "BREAKDOWN_VALUES", "MODES", "QTYPES", "QTYPE_WEIGHTS", "TASKS", "TASK_WEIGHTS",
    "accuracy", "alteration_tracing", "breakdown", "details", "count_correct", "counterfactual_attribute", "dense_counting",
    "react_score", "react_score_value", "reactbench_scores", "relational_erasure", "task_mode_score",
    "task_score",
]
