"""MIOH metrics: accuracy per task x question type x condition (paper §3.1, §4.3, §5,
Table 1, Fig. 3) and the decomposed single-image ablation (§5.5, Fig. 5).

Every MIOH question is a multiple-choice question (§4.2), so every metric is an accuracy
(%) with an unreadable answer counted wrong and reported in ``invalid_rate``.

Record fields: ``task`` ("existence" | "counting" | "attribute" | "position"), ``qtype``
("comprehensive" | "comparative" | "selective"), ``condition`` ("easy" | "HN" | "HP" |
"NI" | "LC-S" | "LC-I"; aliases "hard_negative", "hard_positive", "sycophantic",
"instructional", ...), ``n_images`` (2, 4, 8 or 10; needed for the NI breakdown),
``correct``, optional ``invalid``.

Conditions -> mechanisms: HN (hard negatives: co-occurrence / contextual bias) ->
cooccurrence; HP (hard positives: small, occluded) -> perception; NI (number of images)
-> multi_image; LC-S / LC-I (sycophantic pressure / instructional override) ->
language_prior.

Choices:

* **Task "Avg" is question-weighted** (pooled over the task's questions): Table 1's Avg is
  not the plain mean of its six condition columns (GPT-5 existence: mean 73.0, Avg 73.5).
  It pools **Table 1's questions**, NI at 8 images only, as its NI column is: the paper does
  not say which NI questions its Avg pools, and our suite's NI(2), NI(4) and NI(10) sets
  (Fig. 3's sweep) had made NI about 44% of every Avg and of ``overall``. The same with
  every NI question is ``avg_all`` / ``overall_all`` (session 37; before it, ``avg`` and
  ``mioh.overall`` were these).
* **Condition scores across tasks** (§5.3: "on Hard Positives ... 40.9%") are pooled over
  all questions of the condition (``pooled``); the macro mean over the four tasks is given
  beside it (``macro``). The paper's per-model figures are not the macro mean of its task
  columns (GPT-5 LC-S: 69.25 vs 70.2 in §5.3), so pooling is our reading; the cross-model
  "Overall" row does equal the macro mean (HP: 57.2, 26.3, 32.6, 47.4 -> 40.9).
* **NI is NI(8)** wherever Table 1 has an NI column (``mioh.ni``, ``by_task``,
  ``conditions``, ``by_task_qtype_condition``): §5.3 reads "increasing the number of input
  images from 2 to 8 (NI(8) in Fig. 3) ... plummeting to 24.2% on average", and 24.2 is the
  mean of Table 1's Overall NI cells over the four tasks (29.3, 18.9, 26.6, 22.2 -> 24.25),
  so that column is the 8-image result. Until session 32 ``mioh.ni`` pooled 2, 4, 8 and 10
  images, which the 2- and 4-image sets (no more images than an easy set) diluted; that
  pooled figure is ``mioh.ni_all`` (our extension), and each count is in ``ni_by_count``
  (Fig. 3's NI(2) ... NI(10)). NI records without ``n_images`` enter ``mioh.ni_all`` only.
* **Empty cells** (e.g. LLaVA-v1.6 has no NI results in Table 1) are NaN, never 0.
* **Decomposition (§5.5).** The comprehensive existence question "Is there at least one
  OBJECT in any of these images?" has the options "Yes, all of them" / "Yes, in some of
  them" / "No, in none of them" / "I don't know" (Appendix, Fig. I). The decomposed
  variant asks "Is there a OBJECT in IMAGE?" per image and combines the yes/no answers into
  that option: all yes -> "all", some yes -> "some", no yes -> "none". "Some" means at
  least one but not all, because the options are mutually exclusive. If any per-image
  answer is unreadable the combination is unreadable (wrong, invalid): the paper never
  lets decomposition answer "I don't know". The "Which of the following objects appears
  in all of these images?" form combines per option (:func:`combine_which_in_all`). That
  exact-option rule is for records a user scores with :func:`decomposed_accuracy` (Fig. I's
  four options); the built-in suite asks the comprehensive question as yes / no ("is there
  ... in any of these images?") and combines by presence, "yes" when any image says yes
  (:func:`evaluators.benchmarks.mioh.suite.assemble`, §5.5's "combining the answers to
  determine overall presence").
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from ...metrics.fields import flag
from ...metrics.registry import metric

TASKS = ("existence", "counting", "attribute", "position")
QTYPES = ("comprehensive", "comparative", "selective")
CONDITIONS = ("easy", "HN", "HP", "NI", "LC-S", "LC-I")
N_IMAGES = (2, 4, 8, 10)
EXISTENCE_OPTIONS = ("all", "some", "none", "unknown")
NONE_OF_THE_ABOVE = "none_of_the_above"
_CONDITION_ALIASES = {
    "easy": "easy", "hn": "HN", "hard_negative": "HN", "hard_negatives": "HN", "hp": "HP",
    "hard_positive": "HP", "hard_positives": "HP", "ni": "NI", "num_images": "NI", "number_of_images": "NI",
    "lc-s": "LC-S", "lc_s": "LC-S", "lcs": "LC-S", "lc s": "LC-S", "sycophantic": "LC-S",
    "lc-i": "LC-I", "lc_i": "LC-I", "lci": "LC-I", "lc i": "LC-I", "instructional": "LC-I",
    "instructional_override": "LC-I",
}


#: the number of images of Table 1's NI column (module docstring)
PAPER_NI_IMAGES = 8


def _pct(num: float, den: int) -> float:
    return 100.0 * num / den if den else math.nan


def normalise_condition(condition: Any) -> str:
    """Canonical condition name (see :data:`CONDITIONS`); ValueError for an unknown one."""
    try:
        return _CONDITION_ALIASES[str(condition).strip().lower()]
    except KeyError:
        raise ValueError(f"unknown MIOH condition {condition!r}; known: {list(CONDITIONS)}") from None


def _parse(r: Mapping[str, Any]) -> tuple[str, str, str, int | None, bool, bool]:
    task, qtype = str(r.get("task", "")).lower(), str(r.get("qtype", "")).lower()
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {r.get('task')!r}")
    if qtype not in QTYPES:
        raise ValueError(f"qtype must be one of {QTYPES}, got {r.get('qtype')!r}")
    invalid = flag(r, "invalid", False)  # bools only (evaluators.metrics.fields)
    n_images = r.get("n_images")
    return (task, qtype, normalise_condition(r.get("condition")), None if n_images is None else int(n_images),
            flag(r, "correct") and not invalid, invalid)


def accuracy(records: Iterable[Mapping[str, Any]], task: str | None = None, qtype: str | None = None,
             condition: str | None = None, n_images: int | None = None, table: bool = False) -> float:
    """Pooled accuracy (%) of the records matching every given filter; NaN if none match.
    ``table``: Table 1's questions only, NI at :data:`PAPER_NI_IMAGES` images (module docstring)."""
    condition = normalise_condition(condition) if condition is not None else None
    hits = n = 0
    records = [r for r in records if not r.get("decomposed")]  # the §5.5 ablation is scored apart
    for t, q, c, k, ok, _ in map(_parse, records):
        if task not in (None, t) or qtype not in (None, q) or condition not in (None, c):
            continue
        if n_images is not None and k != n_images:
            continue
        if table and c == "NI" and k != PAPER_NI_IMAGES:
            continue
        n += 1
        hits += ok
    return _pct(hits, n)


def table_accuracy(records: Iterable[Mapping[str, Any]], task: str | None = None, qtype: str | None = None,
                   condition: str | None = None) -> float:
    """:func:`accuracy` as Table 1's columns read: the NI column is NI(8) (module docstring)."""
    return accuracy(records, task, qtype, condition, table=True)


def condition_score(records: Sequence[Mapping[str, Any]], condition: str) -> dict[str, float]:
    """Accuracy (%) of one condition across tasks (NI: NI(8)): ``pooled`` over questions and
    ``macro`` (mean of the per-task accuracies that exist)."""
    records = list(records)
    per_task = [table_accuracy(records, task=t, condition=condition) for t in TASKS]
    present = [a for a in per_task if not math.isnan(a)]
    return {"pooled": table_accuracy(records, condition=condition),
            "macro": sum(present) / len(present) if present else math.nan}


def mioh_table(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Table 1 and Fig. 3 for one model.

    ``by_task[task][condition]`` plus ``["avg"]`` (pooled over the task's Table 1 questions)
    and ``["avg_all"]`` (every NI question too); ``by_qtype[task][qtype]`` (every question);
    ``by_task_qtype_condition[task][qtype][condition]``; ``conditions[condition]`` (pooled and
    macro across tasks); ``ni_by_count[k]``; ``overall`` (pooled over Table 1's questions),
    ``overall_all`` and ``overall_macro`` (mean of task averages); ``invalid_rate`` and ``n``
    over every question."""
    records = [r for r in records if not r.get("decomposed")]
    by_task = {t: {c: table_accuracy(records, task=t, condition=c) for c in CONDITIONS} for t in TASKS}
    for t in TASKS:
        by_task[t]["avg"] = table_accuracy(records, task=t)
        by_task[t]["avg_all"] = accuracy(records, task=t)
    task_avgs = [by_task[t]["avg"] for t in TASKS if not math.isnan(by_task[t]["avg"])]
    parsed = [_parse(r) for r in records]
    return {
        "by_task": by_task,
        "by_qtype": {t: {q: accuracy(records, task=t, qtype=q) for q in QTYPES} for t in TASKS},
        "by_task_qtype_condition": {t: {q: {c: table_accuracy(records, task=t, qtype=q, condition=c)
                                            for c in CONDITIONS} for q in QTYPES} for t in TASKS},
        "conditions": {c: condition_score(records, c) for c in CONDITIONS},
        "ni_by_count": {k: accuracy(records, condition="NI", n_images=k) for k in N_IMAGES},
        "ni_all": accuracy(records, condition="NI"),
        "overall": table_accuracy(records),
        "overall_all": accuracy(records),
        "overall_macro": sum(task_avgs) / len(task_avgs) if task_avgs else math.nan,
        "invalid_rate": _pct(sum(p[5] for p in parsed), len(parsed)),
        "n": len(parsed),
    }


def details(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``results.json`` carries beside the registered metrics: Table 1 / Fig. 3 --
    accuracy per task x question type x condition, per task, per question type, NI per
    number of images (:func:`mioh_table`) -- and §5.5 per question type
    (:func:`decomposition_by_qtype`)."""
    table = mioh_table(records)
    out = {k: table[k] for k in ("by_task", "by_qtype", "by_task_qtype_condition", "ni_by_count", "ni_all",
                                 "overall_all", "overall_macro")}
    out["decomposition"] = decomposition_by_qtype(records)
    return out


# -- §5.5: decomposed single-image answers --------------------------------------------------
def combine_existence(per_image: Sequence[bool | None]) -> str | None:
    """Combine per-image yes/no answers into the comprehensive option: "all", "some" or
    "none"; None (unreadable) if any answer is None or there are no images."""
    if not per_image or any(a is None for a in per_image):
        return None
    yes = sum(bool(a) for a in per_image)
    return "all" if yes == len(per_image) else "some" if yes else "none"


def combine_which_in_all(per_option: Mapping[str, Sequence[bool | None]]) -> str | None:
    """For "Which of the following objects appears in all of these images?": the option
    whose per-image answers are all yes; :data:`NONE_OF_THE_ABOVE` if no option qualifies;
    None (unreadable) if several qualify or an answer that matters is unreadable."""
    qualifying, unsure = [], False
    for option, answers in per_option.items():
        if not answers:
            raise ValueError(f"option {option!r} has no per-image answers")
        if any(a is False for a in answers):
            continue  # ruled out whatever the unreadable answers say
        if any(a is None for a in answers):
            unsure = True
        else:
            qualifying.append(option)
    if unsure or len(qualifying) > 1:
        return None
    return qualifying[0] if qualifying else NONE_OF_THE_ABOVE


def decomposed_accuracy(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Accuracy (%) of the decomposed evaluation: records carry ``per_image`` (list of
    True/False/None answers, one per image) and ``gt`` (one of "all", "some", "none").
    Returns ``accuracy``, ``invalid_rate``, ``n``."""
    hits = invalid = n = 0
    for r in records:
        gt = str(r["gt"]).lower()
        if gt not in EXISTENCE_OPTIONS[:3]:
            raise ValueError(f"gt must be 'all', 'some' or 'none', got {r['gt']!r}")
        answer = combine_existence(r["per_image"])
        n += 1
        invalid += answer is None
        hits += answer == gt
    return {"accuracy": _pct(hits, n), "invalid_rate": _pct(invalid, n), "n": n}


def decomposition_gap(comprehensive: Sequence[Mapping[str, Any]],
                      decomposed: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Fig. 5: comprehensive existence accuracy (records as for :func:`accuracy`, existence
    comprehensive questions only) beside the decomposed one; ``gap`` = decomposed -
    comprehensive (points; positive = the multi-image context adds errors)."""
    comp = accuracy(comprehensive, task="existence", qtype="comprehensive")
    dec = decomposed_accuracy(decomposed)["accuracy"]
    return {"comprehensive": comp, "decomposed": dec, "gap": dec - comp}


def _condition_metric(condition: str):
    def fn(records) -> float:
        return accuracy(list(records), condition=condition)
    return fn


@metric("mioh.easy", "mioh", None, True, "pooled")
def easy(records) -> float:
    """Accuracy (%) on easy questions, pooled over tasks."""
    return _condition_metric("easy")(records)


@metric("mioh.hn", "mioh", "cooccurrence", True, "pooled")
def hard_negative(records) -> float:
    """Accuracy (%) under hard negatives (contextual / co-occurrence bias), pooled over tasks."""
    return _condition_metric("HN")(records)


@metric("mioh.hp", "mioh", "perception", True, "pooled")
def hard_positive(records) -> float:
    """Accuracy (%) under hard positives (small / occluded / low-CLIP objects), pooled over tasks."""
    return _condition_metric("HP")(records)


@metric("mioh.ni", "mioh", "multi_image", True, "pooled")
def number_of_images(records) -> float:
    """Accuracy (%) under the visual-context-scale condition at 8 images, Table 1's NI
    column (NI(8), module docstring), pooled over tasks."""
    return accuracy(list(records), condition="NI", n_images=PAPER_NI_IMAGES)


@metric("mioh.ni_all", "mioh", "multi_image", True, "pooled")
def number_of_images_all(records) -> float:
    """Accuracy (%) of every NI question, 2, 4, 8 and 10 images pooled (our extension: what
    ``mioh.ni`` was until session 32)."""
    return _condition_metric("NI")(records)


@metric("mioh.lc_s", "mioh", "language_prior", True, "pooled")
def sycophantic(records) -> float:
    """Accuracy (%) under sycophantic linguistic pressure (LC-S), pooled over tasks."""
    return _condition_metric("LC-S")(records)


@metric("mioh.lc_i", "mioh", "language_prior", True, "pooled")
def instructional_override(records) -> float:
    """Accuracy (%) under instructional override (LC-I), pooled over tasks."""
    return _condition_metric("LC-I")(records)


@metric("mioh.overall", "mioh", None, True, "pooled")
def overall(records) -> float:
    """Accuracy (%) over Table 1's questions (NI at 8 images; every question is
    ``details["overall_all"]``)."""
    return table_accuracy(list(records))


__all__ = [
    "CONDITIONS", "EXISTENCE_OPTIONS", "NONE_OF_THE_ABOVE", "N_IMAGES", "QTYPES", "TASKS", "accuracy",
    "combine_existence", "combine_which_in_all", "details", "condition_score", "decomposed_accuracy", "decomposition_gap",
    "decomposition_by_qtype",
    "easy", "hard_negative", "hard_positive", "instructional_override", "mioh_table", "normalise_condition",
    "number_of_images", "number_of_images_all", "overall", "PAPER_NI_IMAGES", "sycophantic", "table_accuracy",
]


def combine_selective(per_image: Sequence[bool | None]) -> int | str | None:
    """Decomposed answer to the *selective* question "In which image is there a X?": the
    one image answered yes, "none" when no image is, None (unreadable) when several are or
    an answer is unreadable -- our extension of §5.5's combination to the selective form."""
    if not per_image or any(a is None for a in per_image):
        return None
    yes = [i for i, a in enumerate(per_image) if a]
    return "none" if not yes else yes[0] if len(yes) == 1 else None


def _decomposed_ni(records: Sequence[Mapping[str, Any]], qtype: str) -> list[Mapping[str, Any]]:
    """The decomposed NI records (``decomposed=True``) of ``qtype``, empty when no NI
    question of that type was asked directly (nothing to compare them with)."""
    of_type = [r for r in records if normalise_condition(r.get("condition")) == "NI"
               and str(r.get("qtype", "")).lower() == qtype]
    if not any(not r.get("decomposed") for r in of_type):
        return []
    return [r for r in of_type if r.get("decomposed")]


def decomposition_by_qtype(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """§5.5 per question type: ``direct`` (NI questions over all the images), ``decomposed``
    (the same sets image by image, answers combined) and ``gap`` = decomposed - direct, for
    each question type that has both. The comprehensive row is the paper's comparison."""
    records = list(records)
    out = {}
    for qtype in QTYPES:
        rows = _decomposed_ni(records, qtype)
        if rows:  # direct over the tasks that were decomposed (the built-in suite: existence)
            tasks = {_parse(r)[0] for r in rows}
            direct = accuracy([r for r in records if _parse(r)[0] in tasks], qtype=qtype, condition="NI")
            dec = _pct(sum(flag(r, "correct") and not flag(r, "invalid", False) for r in rows), len(rows))
            out[qtype] = {"direct": direct, "decomposed": dec, "gap": dec - direct, "n": len(rows)}
    return out


@metric("mioh.ni_decomposed", "mioh", "multi_image", True, "pooled")
def ni_decomposed(records) -> float:
    """Accuracy (%) of the decomposed NI sets (each image asked alone; records with
    ``decomposed=True``), the §5.5 ablation beside :func:`number_of_images`: the per-image
    answers combined into the *selective* answer, right exactly when every per-image answer
    about the images the question lists is right (an 8- or 10-image set's question lists 4 of
    them, :mod:`evaluators.benchmarks.mioh.suite`; answers about the others do not count). One unit per set: the comprehensive combination of the same answers
    ("yes" when any image says yes, §5.5's own) is lenient and would count each answer
    twice, so it is reported apart (``details["decomposition"]``)."""
    rows = _decomposed_ni(list(records), "selective")
    return _pct(sum(flag(r, "correct") and not flag(r, "invalid", False) for r in rows), len(rows))


@metric("mioh.decomposition_gap", "mioh", "multi_image", None, "difference")
def decomposition_gap_ni(records) -> float:
    """Decomposed minus direct NI accuracy of the selective question (points): how much the
    multi-image context itself costs (positive = the model does better image by image).
    Per question type in ``details["decomposition"]``.

    No direction (``higher_is_better=None``), so it never decides a report verdict: a gap
    closes as much when the per-image answers get worse as when the multi-image ones get
    better (VCD on the organism narrows it by breaking the per-image answers). Whether the
    multi-image mechanism is fixed is read from ``mioh.ni`` and ``mioh.ni_decomposed``."""
    records = list(records)
    # the direct baseline of details["decomposition"]["selective"]: the decomposed tasks only
    tasks = {_parse(r)[0] for r in _decomposed_ni(records, "selective")}
    direct = accuracy([r for r in records if _parse(r)[0] in tasks], qtype="selective", condition="NI")
    return ni_decomposed(records) - direct
