"""Causal-HalBench metrics: paper §4.3, Eqs. 4-6; CPR from the authors' ``metric.py``; CHAIR
(Rohrbach et al. 2018) as used in §5.2 / Table 4.

Question types (§4.3): contextual ``Q_c`` (object ``o_c``, GT yes), counterfactual ``Q_cf``
(object ``o_cf``, GT yes, counterfactual images only) and absent ``Q_a`` (object ``o_a``,
GT no). ``Acc(X, Q)`` is the accuracy on the image set ``X`` (original) or ``X_cf``
(counterfactual) and question set ``Q``. All values are percentages, as in Table 2.

::

    CAC = Acc(X, Q_c) - Acc(X_cf, Q_c)        (Eq. 4)   lower is better
    AAC = Acc(X_cf, Q_a) - Acc(X, Q_a)        (Eq. 5)   lower is better
    CHR = 100 - Acc(X_cf, Q_cf)               (Eq. 6)   lower is better  (1 - Acc, in %)
    Acc = accuracy over every image-question pair (Table 2 "Acc", Table 3)
    CPR = share of (original, counterfactual) pairs asking the same question type whose
          answers are both right (authors' ``calculate_cpr``; not in the paper)

Record fields: ``image_type`` ("original" | "counterfactual"; aliases "origin", "inpainted",
"cf"), ``question_type`` ("contextual" | "counterfactual" | "absent"; the authors' code
calls them "target", "inpaint", "absent"), ``correct`` (bool), optional ``invalid`` (an
unparseable answer: counted wrong and reported in ``invalid_rate``) and, for CPR,
``pair_id``.

Choices:

* **Overall Acc** is pooled over all pairs (the §4.3 definition of ``Acc(X, Q)`` applied to
  the whole benchmark). Table 2's Acc column cannot be rebuilt from its other columns with
  Table 1's counts (e.g. Gemini1.5-pro: pooling gives 83.5, the table says 86.1), so there
  is no published number to match more closely.
* **CPR pairing.** Records sharing ``pair_id``, ``question_type`` and, where records carry
  it, the ``question`` text (case and spacing aside) form a group, whose
  counterfactual-image records are paired with its original-image record(s) (next note;
  the authors pair a base image with each of its numbered counterfactual images, asking
  the same question; with the paper's
  two absent questions per target, pairing by type alone would also pair "fork?" on the
  original with "spoon?" on the counterfactual). The user-data protocol stores the
  question, and so do the built-in suite's records (it asks two absent questions per image,
  Table 1's count). Groups lacking one
  side are skipped, as in the authors' code, and counted in ``cpr_unpaired``; Q_c / Q_a
  records without a ``pair_id`` cannot be paired and are counted in ``cpr_no_pair_id``. We report
  ``cpr_contextual`` and ``cpr_absent`` (the authors' ``cpr_target`` / ``cpr_absent``) and,
  as our addition, ``cpr`` pooled over both.
* **CPR unit: one counterfactual-image answer.** Each counterfactual record of a group is
  one pair (``cpr_pairs`` counts them), "both right" when it is right and the original
  image's answer to that question is. The original image is asked its questions once per
  counterfactual derived from it (§4.2 / Table 1: 4161 original-image questions, 3 per
  counterfactual image, on only 757 images), so where two counterfactuals of one image
  share ``o_c`` (or an ``o_a``) the original holds the same question twice, under two ids.
  Those repeated original answers are averaged (identical under greedy decoding); pairing
  each of them with each counterfactual answer had counted ``d x m`` pairs for ``m``
  counterfactual images and weighted such a group ``d``-fold in the pooled rate. The
  authors' ``calculate_cpr`` keeps only the *first* question of each type per
  counterfactual image, so of the paper's two absent questions it pairs one; we pair every
  question (both absent ones), so ``cpr_absent`` is over twice the authors' absent pairs and
  can differ from theirs when the two answers differ (a second absent question answered
  wrong: ours 50, theirs 100 for that image). Records naming no question
  pair by type: the original side is then the mean over that type's original answers.
* **Unreadable answers are wrong on every question type.** The paper does not say how an
  answer is read. The authors' inference scripts map any answer containing "yes" to yes
  and *everything else* to no, so an answer that says neither counts as right on every
  absent question (``Q_a``, GT no) and wrong on ``Q_c`` / ``Q_cf``. We read answers with
  :func:`evaluators.answers.parse_yes_no` and count one that says neither (``invalid``) as
  wrong whatever the ground truth, so a model (or a mitigation) that stops answering gains
  no ``Acc(Q_a)`` (nor overall Acc) from it; ``invalid_rate`` reports how many.
* **Empty selections** give NaN (the authors' code returns 0, which would read as a real
  accuracy); a NaN propagates into CAC/AAC/CHR.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

from ...metrics.fields import flag
from ...metrics.registry import metric

IMAGE_TYPES = ("original", "counterfactual")
QUESTION_TYPES = ("contextual", "counterfactual", "absent")
_IMAGE_ALIASES = {"original": "original", "origin": "original", "orig": "original", "x": "original",
                  "counterfactual": "counterfactual", "inpainted": "counterfactual", "cf": "counterfactual",
                  "x_cf": "counterfactual"}
_QUESTION_ALIASES = {"contextual": "contextual", "context": "contextual", "target": "contextual", "q_c": "contextual",
                     "counterfactual": "counterfactual", "inpaint": "counterfactual", "cf": "counterfactual",
                     "q_cf": "counterfactual", "absent": "absent", "q_a": "absent"}


def _pct(num: float, den: int) -> float:
    return 100.0 * num / den if den else math.nan


def _is_correct(r: Mapping[str, Any]) -> bool:
    """Right only when marked correct and not invalid (an unreadable answer is wrong)."""
    return flag(r, "correct") and not flag(r, "invalid", False)


def _qa(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The question-answer records (caption records, scored by CHAIR, carry ``caption``)."""
    return [r for r in records if "caption" not in r]


def _kind(r: Mapping[str, Any]) -> tuple[str, str]:
    try:
        image = _IMAGE_ALIASES[str(r["image_type"]).lower()]
        question = _QUESTION_ALIASES[str(r["question_type"]).lower()]
    except KeyError as err:
        raise ValueError(f"record needs image_type in {IMAGE_TYPES} and question_type in {QUESTION_TYPES}; "
                         f"got {r.get('image_type')!r}, {r.get('question_type')!r}") from err
    if image == "original" and question == "counterfactual":
        raise ValueError("counterfactual questions (Q_cf) exist only on counterfactual images")
    return image, question


def accuracy(records: Iterable[Mapping[str, Any]], image_type: str | None = None,
             question_type: str | None = None) -> float:
    """Acc(X, Q) in %: pooled accuracy of the records of that image and question type
    (``None`` = any). NaN when none match."""
    if image_type is not None or question_type is not None:
        probe = {"image_type": image_type or "counterfactual", "question_type": question_type or "absent"}
        wanted_image, wanted_question = _kind(probe)  # validates the names
        image_type = wanted_image if image_type is not None else None
        question_type = wanted_question if question_type is not None else None
    hits = n = 0
    for r in _qa(records):
        image, question = _kind(r)
        if (image_type in (None, image)) and (question_type in (None, question)):
            n += 1
            hits += _is_correct(r)
    return _pct(hits, n)


def cpr(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Consistent-pair rate (%), see the module notes on pairing."""
    groups: dict[tuple, dict[str, list[bool]]] = defaultdict(lambda: {"original": [], "counterfactual": []})
    no_pair_id = 0
    for r in _qa(records):
        image, question = _kind(r)
        if question == "counterfactual":
            continue
        if "pair_id" not in r:  # nothing to pair it with: counted, not silently left out
            no_pair_id += 1
            continue
        asked = " ".join(str(r.get("question", "")).lower().split())  # "" where records name no question
        groups[(r["pair_id"], question, asked)][image].append(_is_correct(r))
    both = {"contextual": 0, "absent": 0}
    total = {"contextual": 0, "absent": 0}
    unpaired = 0
    for (_, question, _), sides in groups.items():
        if not sides["original"] or not sides["counterfactual"]:
            unpaired += 1
            continue
        # one pair per counterfactual answer; a question the original image was asked several
        # times (once per counterfactual of it, Table 1) counts by the mean of its answers
        original_right = sum(sides["original"]) / len(sides["original"])
        total[question] += len(sides["counterfactual"])
        both[question] += original_right * sum(sides["counterfactual"])
    return {
        "cpr_contextual": _pct(both["contextual"], total["contextual"]),
        "cpr_absent": _pct(both["absent"], total["absent"]),
        "cpr": _pct(both["contextual"] + both["absent"], total["contextual"] + total["absent"]),
        "cpr_pairs": total["contextual"] + total["absent"],
        "cpr_unpaired": unpaired,
        "cpr_no_pair_id": no_pair_id,
    }


def causal_scores(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Every Table 2 number plus CPR and the invalid rate (all in %).

    ``n`` and ``invalid_rate`` are over the question-answer records, the ones every other
    number here reads: caption records (CHAIR, Sec. 5.2) are left out of them as
    :func:`accuracy` leaves them out (an empty caption had counted as an invalid yes/no
    answer, and each caption in ``n``)."""
    records = list(records)
    qa_records = _qa(records)
    acc_x_c = accuracy(records, "original", "contextual")
    acc_x_a = accuracy(records, "original", "absent")
    acc_cf_c = accuracy(records, "counterfactual", "contextual")
    acc_cf_a = accuracy(records, "counterfactual", "absent")
    acc_cf_cf = accuracy(records, "counterfactual", "counterfactual")
    out = {
        "acc_original_contextual": acc_x_c,
        "acc_original_absent": acc_x_a,
        "acc_counterfactual_contextual": acc_cf_c,
        "acc_counterfactual_absent": acc_cf_a,
        "acc_counterfactual_counterfactual": acc_cf_cf,
        "cac": acc_x_c - acc_cf_c,
        "aac": acc_cf_a - acc_x_a,
        "chr": 100.0 - acc_cf_cf,
        "accuracy": accuracy(records),
        "invalid_rate": _pct(sum(flag(r, "invalid", False) for r in qa_records), len(qa_records)),
        "n": len(qa_records),
    }
    out.update(cpr(records))
    return out


@metric("causal_halbench.cac", "causal_halbench", "cooccurrence", False, "difference")
def cac(records) -> float:
    """Contextual object Accuracy Change, Eq. 4: Acc(X, Q_c) - Acc(X_cf, Q_c), in points."""
    records = list(records)
    return accuracy(records, "original", "contextual") - accuracy(records, "counterfactual", "contextual")


@metric("causal_halbench.aac", "causal_halbench", "cooccurrence", False, "difference")
def aac(records) -> float:
    """Absent object Accuracy Change, Eq. 5: Acc(X_cf, Q_a) - Acc(X, Q_a), in points."""
    records = list(records)
    return accuracy(records, "counterfactual", "absent") - accuracy(records, "original", "absent")


@metric("causal_halbench.chr", "causal_halbench", "cooccurrence", False, "pooled")
def chr_(records) -> float:
    """Counterfactual object Hallucination Rate, Eq. 6: 100 - Acc(X_cf, Q_cf), in %."""
    return 100.0 - accuracy(records, "counterfactual", "counterfactual")


@metric("causal_halbench.accuracy", "causal_halbench", None, True, "pooled")
def overall_accuracy(records) -> float:
    """Accuracy over all image-question pairs, in % (Table 2 "Acc")."""
    return accuracy(records)


@metric("causal_halbench.cpr", "causal_halbench", "cooccurrence", True, "pooled")
def cpr_pooled(records) -> float:
    """Share (%) of original/counterfactual pairs (Q_c and Q_a) with both answers right."""
    return cpr(records)["cpr"]


# -- CHAIR ----------------------------------------------------------------------------------
_WORD = re.compile(r"[a-z]+")
_IRREGULAR = {"person": "people", "man": "men", "woman": "women", "child": "children", "mouse": "mice",
              "foot": "feet", "tooth": "teeth", "goose": "geese", "sheep": "sheep", "fish": "fish"}


def _plurals(word: str) -> set[str]:
    forms = {word + "s", word + "es"}
    if word in _IRREGULAR:
        forms.add(_IRREGULAR[word])
    if len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou":
        forms.add(word[:-1] + "ies")
    if word.endswith("fe"):
        forms.add(word[:-2] + "ves")
    elif word.endswith("f"):
        forms.add(word[:-1] + "ves")
    return forms


def _split(line: str) -> list[str]:
    """One line of CHAIR's synonyms.txt, "category, syn, syn": its comma-separated phrases."""
    return [w.strip() for w in line.split(",") if w.strip()]


def _rows(synonyms: Any) -> list[tuple[str, list[str]]]:
    """``(category, phrases)`` rows. A string is never iterated letter by letter (a
    ``{"dog": "puppy"}`` value, or CHAIR's file read with ``readlines()``, had made each
    letter a synonym): it is a comma-separated line, as in ``synonyms.txt``."""
    if isinstance(synonyms, str):  # CHAIR's synonyms.txt: "category, syn, syn" per line
        rows = [_split(line) for line in synonyms.splitlines()]
        return [(row[0], row) for row in rows if row]
    if isinstance(synonyms, Mapping):
        return [(cat, [cat, *(_split(syns) if isinstance(syns, str) else list(syns))]) for cat, syns in synonyms.items()]
    out = []
    for row in synonyms:  # COCO-style rows: first entry is the category
        row = _split(row) if isinstance(row, str) else list(row)
        if row:
            out.append((row[0], row))
    return out


def synonym_index(synonyms: Any) -> dict[tuple[str, ...], str]:
    """Phrase (tuple of lower-case words) -> category. ``synonyms`` is a dict
    ``category -> synonyms`` (e.g. :data:`evaluators.world.SYNONYMS`), a list of COCO-style
    rows ``[category, syn, ...]``, or the text of CHAIR's ``synonyms.txt``. Each phrase also
    matches the regular/irregular plurals of its last word unless that form is itself listed.
    A phrase listed under two categories is an error."""
    explicit: dict[tuple[str, ...], str] = {}
    for category, phrases in _rows(synonyms):
        for phrase in phrases:
            key = tuple(_WORD.findall(phrase.lower()))
            if not key:
                continue
            if explicit.get(key, category) != category:
                raise ValueError(f"synonym {phrase!r} is listed under {explicit[key]!r} and {category!r}")
            explicit[key] = category
    index = dict(explicit)
    for key, category in explicit.items():
        for plural in _plurals(key[-1]):
            index.setdefault(key[:-1] + (plural,), category)
    return index


def mentions(caption: str, index: Mapping[tuple[str, ...], str]) -> list[str]:
    """Categories mentioned in ``caption``, in order, one entry per mention (repeats kept,
    as in CHAIR), by greedy longest-phrase match over lower-cased words."""
    words = _WORD.findall(caption.lower())
    longest = max((len(k) for k in index), default=0)
    found, i = [], 0
    while i < len(words):
        for span in range(min(longest, len(words) - i), 0, -1):
            category = index.get(tuple(words[i:i + span]))
            if category is not None:
                found.append(category)
                i += span
                break
        else:
            i += 1
    return found


def chair(captions: Sequence[str], gt_objects: Sequence[Iterable[str]], synonyms: Any) -> dict[str, Any]:
    """CHAIR-s and CHAIR-i (Rohrbach et al. 2018), in %.

    CHAIR-i = hallucinated object mentions / all object mentions, pooled over captions;
    CHAIR-s = captions with at least one hallucinated mention / captions. A mention is
    hallucinated when its category is not among the image's ground-truth objects (which may
    be given as categories or as synonyms). Mentions are counted with repeats, as in the
    reference ``chair.py`` (``coco_word_count += len(node_words)``). NaN for no captions
    (CHAIR-s) or no mentions (CHAIR-i). Not reproduced from ``chair.py``: lemmatisation (we
    match listed forms plus generated plurals) and its special cases ("toilet seat",
    "baby bird", ...).

    An empty caption (no words) is no description at all: it is left out of CHAIR-s's
    denominator and counted in ``n_empty`` (the papers are silent). Counted as a caption
    without hallucination, it made a model that answers nothing look cleaner."""
    if len(captions) != len(gt_objects):
        raise ValueError(f"{len(captions)} captions but {len(gt_objects)} ground-truth object sets")
    index = synonym_index(synonyms)
    n_mentions = n_hall = n_hall_caps = n_empty = 0
    per_caption = []
    for caption, objects in zip(captions, gt_objects):
        if not _WORD.findall(caption.lower()):
            n_empty += 1
            per_caption.append({"mentions": [], "hallucinated": [], "empty": True})
            continue
        truth = {index.get(tuple(_WORD.findall(o.lower())), o) for o in objects}
        said = mentions(caption, index)
        hallucinated = [c for c in said if c not in truth]
        n_mentions += len(said)
        n_hall += len(hallucinated)
        n_hall_caps += bool(hallucinated)
        per_caption.append({"mentions": said, "hallucinated": hallucinated})
    return {
        "chair_s": _pct(n_hall_caps, len(captions) - n_empty),
        "chair_i": _pct(n_hall, n_mentions),
        "n_captions": len(captions),
        "n_empty": n_empty,
        "n_mentions": n_mentions,
        "n_hallucinated": n_hall,
        "per_caption": per_caption,
    }


def _default_synonyms(synonyms: Any) -> Any:
    if synonyms is None:
        from evaluators.world.vocab import SYNONYMS  # plain data; imported only when needed
        return SYNONYMS
    return synonyms


def _chair_records(records, synonyms) -> dict[str, Any]:
    records = [r for r in records if "caption" in r]
    if not records:
        return {"chair_s": math.nan, "chair_i": math.nan}
    return chair([r["caption"] for r in records], [r["objects"] for r in records], _default_synonyms(synonyms))


@metric("causal_halbench.chair_s", "causal_halbench", None, False, "pooled")
def chair_s(records, synonyms: Any = None) -> float:
    """CHAIR-s (%) over records ``{"caption", "objects"}``; default table: the world's SYNONYMS."""
    return _chair_records(records, synonyms)["chair_s"]


@metric("causal_halbench.chair_i", "causal_halbench", None, False, "pooled")
def chair_i(records, synonyms: Any = None) -> float:
    """CHAIR-i (%) over records ``{"caption", "objects"}``; default table: the world's SYNONYMS."""
    return _chair_records(records, synonyms)["chair_i"]


def details(records: Sequence[Mapping[str, Any]], synonyms: Any = None) -> dict[str, Any]:
    """What ``results.json`` carries beside the registered metrics: ``table2``, every Table 2
    number (:func:`causal_scores`: the four Acc(Q_c) / Acc(Q_a) columns, CPR's contextual and
    absent parts, and ``n`` / ``invalid_rate`` over the question-answer records alone), and
    CHAIR-s / CHAIR-i on the captions of each ``image_type`` apart -- Table 4 gives, in
    parentheses, the figures of "a subset containing only counterfactual images", and Sec.
    5.2 reads the gap between them. Image types are read through the same aliases as
    everywhere here ("origin", "inpainted", ...)."""
    records = list(records)
    out: dict[str, Any] = {"table2": causal_scores(records) if _qa(records) else {}}
    for image_type in IMAGE_TYPES:
        of_type = [r for r in records if "caption" in r
                   and _IMAGE_ALIASES.get(str(r.get("image_type")).lower()) == image_type]
        scores = _chair_records(of_type, synonyms)
        out[f"chair_{image_type}"] = {"chair_s": scores["chair_s"], "chair_i": scores["chair_i"],
                                      "n_captions": len(of_type), "n_empty": scores.get("n_empty", 0)}
    return out


__all__ = [
    "IMAGE_TYPES", "QUESTION_TYPES", "aac", "accuracy", "cac", "causal_scores", "chair", "chair_i", "chair_s",
    "details",
    "chr_", "cpr", "cpr_pooled", "mentions", "overall_accuracy", "synonym_index",
]
