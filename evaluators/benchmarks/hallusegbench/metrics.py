"""HalluSegBench metrics (Counterfactual Segmentation Reasoning), paper §4.2, Eqs. 1-3.

Notation (paper §3): ``c`` is the queried object in the factual image ``I``; ``I'`` is ``I``
with that object replaced by an object of class ``c'``. A sample has two ground-truth masks
and three scored predictions:

=================  ===========================  ============================================
record key         paper                        meaning
=================  ===========================  ============================================
``gt_fact``        ``M_c``                      mask of ``c`` in ``I``
``gt_counterfact`` ``M'_{c'}``                  mask of ``c'`` in ``I'`` (same place)
``pred_fact``      ``M̂_c  = f(I, c)``           should match ``M_c``
``pred_textual``   ``M̂_{c'} = f(I, c')``        label swapped: should be empty (abstain)
``pred_visual``    ``M̂'_c = f(I', c)``          object swapped: should be empty (abstain)
``split``          referring / reasoning        reported apart (Table 1)
=================  ===========================  ============================================

Formulas::

    IoU_fact    = |M_c ∩ M̂_c| / |M_c ∪ M̂_c|                               (Eq. 1)
    IoU_textual = |M_c ∩ M̂_{c'}| / |M_c ∪ M̂_{c'}|                          (Eq. 1, see note)
    IoU_visual  = |M'_{c'} ∩ M̂'_c| / |M'_{c'} ∪ M̂'_c|                      (Eq. 1)
    ΔIoU_textual = IoU_fact - IoU_textual ;  ΔIoU_visual = IoU_fact - IoU_visual   (§4.2)
    CMS = (α|C| + |N|) / (α|M|),  C = M̂ ∩ M,  N = M̂ \\ M,  α = 3            (Eq. 3, App. B)
    CMS_fact        : M̂ = M̂_{c'} (query c' on I),  M = M_c
    CMS_counterfact : M̂ = M̂'_c  (query c on I'),  M = M'_{c'}

Choices (the paper is silent or inconsistent):

* **IoU_textual.** Eq. 1 prints ``|M_{c'} ∩ M̂_c|``, but no mask ``M_{c'}`` exists in ``I``
  and ``M̂_c`` is the factual prediction; the text ("leakage when querying with a
  counterfactual label on the same image"), the definition of CMS and the authors'
  ``get_consistency.py`` (``compute_iou(gt1, pred2)``: factual mask vs. the prediction for the
  edited label on the original image) all give ``IoU(M̂_{c'}, M_c)``. We implement that.
* **CMS denominators.** The paper normalises by the mask of the object that *is* present
  where the hallucination lands: ``M_c`` for CMS_fact and ``M'_{c'}`` for CMS_counterfact
  (the authors' ``get_hallucination.py`` does the same). Predicted area outside that mask
  counts with weight 1 (the ``|N|`` term), so CMS grows without bound with stray area.
* **Abstention** is an empty predicted mask (``None`` is accepted and read as an empty
  mask: our harness always asks for every prediction; the authors' scripts instead skip a
  sample whose prediction file is missing). An abstention scores IoU = 0 against a non-empty
  ground truth and CMS = 0 - exactly what the paper wants of ``(I, c')`` and ``(I', c)``.
* **Empty union** (prediction and ground truth both empty): IoU = 0.0, as in the authors'
  scripts (``intersection / union if union > 0 else 0.0``). For the leakage IoUs this is the
  right reading (nothing leaked); LISA-style gIoU would use 1.0. Benchmark ground truths are
  never empty, so this only matters for degenerate inputs.
* **Empty ground truth in CMS**: Eq. 3 divides by ``α|M|``, so CMS is undefined; we return
  NaN for that sample and leave it out of the mean (reported as ``n_cms_undefined``). The
  authors' script would score it 0.0.
* **Resize.** Predictions are resized to the ground-truth size with nearest neighbour before
  scoring, as in the authors' scripts (``cv2.resize(..., INTER_NEAREST)`` to the mask shape).
  Index rule of :func:`resize_nearest`: output pixel ``i`` reads source pixel
  ``floor(i * in / out)`` (exact integer arithmetic), the OpenCV ``INTER_NEAREST`` and
  PyTorch ``mode="nearest"`` convention (not PIL's half-pixel-centred rule). Masks are
  binarised with ``> 0`` (the scripts read masks with ``cv2.imread(...) > 0``).
* **Grid of IoU_visual.** Each score is computed on the grid of its own ground truth:
  IoU_visual and CMS_counterfact on ``M'_{c'}``'s, i.e. the counterfactual image ``I'``'s.
  The authors' ``get_hallucination.py`` does the same for CMS, but ``get_consistency.py``
  resizes ``M'_{c'}`` *and* ``M̂'_c`` to the factual mask's shape (``image_shape =
  gt1.shape``) before IoU_visual. Eq. 1 is a ratio of pixel sets and says nothing of a
  grid; resampling the ground truth to another image's size (and aspect ratio, where the
  edit changed it) changes the sets, so we keep ``I'``'s. The two agree whenever ``I`` and
  ``I'`` have one size (the built-in suite always; a release whose edits keep the size);
  where they do not, IoU_visual can differ (a 3x3 ``I'`` with ``M'_{c'}`` on the diagonal's
  first two pixels and ``M̂'_c`` on its last two: 1/3 here, 1/2 on a 2x2 ``I`` grid).
* **No rounding.** Per-sample CMS is averaged unrounded (``get_hallucination.py`` rounds
  each sample to 4 decimals before its mean: at most 5e-5 apart).
* **Aggregation.** Per-sample scores averaged over samples (a mean IoU, not a cumulative
  cIoU/gIoU): App. B describes the metrics as instance-level and Table 3 / Fig. 8 report
  per-sample means, distributions and 95% CIs; the scripts take ``np.mean`` over samples.
  ΔIoU is averaged per sample, which equals the difference of the mean IoUs.
* **Unreadable answers** (record field ``unreadable``: the roles among ``fact``,
  ``textual``, ``visual`` whose answer no mask could be read from). The authors' scripts
  skip such samples, which would let a mitigation that breaks the answer format drop
  exactly its hard pairs. We keep them: IoU takes its worst value (IoU_fact 0; IoU 1 on the
  two queries where abstaining is right, so ΔIoU counts the answer as full leakage), and
  each such role counts in ``unreadable_textual`` / ``unreadable_visual`` (the share of
  unreadable answers, tagged with the mechanism of its query, lower is better). CMS is left
  out for that role (its mean is over readable answers; ``n_cms_unreadable`` counts them):
  CMS is unbounded above, so no value stands for "wrong in an unknown way". Its largest,
  the whole-image mask's, is 1 + (A - |M|) / (α|M|) -- 6 to 152 on the built-in suites of
  seeds 0 and 1, in the hundreds for COCO-sized objects -- and let a few unreadable answers
  decide the mean (tried for one commit in session 33: VCD (greedy)'s CMS_fact rose 0.00 ->
  0.81 on readable answers but read as a fall, because it gave 2 fewer unreadable answers
  of 60);
  the confusable object's own mask (CMS 1, until session 33) scored gibberish better than
  a real hallucination that spills over. An unreadable role is no abstention.
* Values are fractions (the paper prints 0.5312, not 53.12); CMS is unbounded above.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ...metrics import memo
from ...metrics.registry import metric

ALPHA = 3.0
SPLITS = ("referring", "reasoning")
_SPLIT_ALIASES = {"referring": "referring", "referral": "referring", "ref": "referring", "refcoco": "referring",
                  "reasoning": "reasoning", "rsn": "reasoning", "reasonseg": "reasoning"}
_KEYS = ("iou_fact", "iou_textual", "iou_visual", "delta_iou_textual", "delta_iou_visual",
         "cms_fact", "cms_counterfact")


def resize_nearest(mask: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Nearest-neighbour resize of a 2-D mask to ``shape = (height, width)``.

    Output row ``i`` takes source row ``floor(i * H_in / H_out)`` (columns likewise), in exact
    integer arithmetic; dtype is kept. OpenCV's ``INTER_NEAREST`` and PyTorch's ``"nearest"``
    state the same rule but compute it in floating point, and pick the neighbouring source
    row for some sizes (PyTorch: 215 of the 18,496 pairs of sizes 1-136, e.g. 2 -> 82 rows),
    a one-pixel difference in a mask that had to be resized. The paper does not say how a
    prediction of another size is compared; the exact rule is used so that a score does not
    depend on a library's rounding.
    """
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D, got shape {mask.shape}")
    out_h, out_w = (int(s) for s in shape)
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f"shape must be positive, got {tuple(shape)}")
    in_h, in_w = mask.shape
    if (in_h, in_w) == (out_h, out_w):
        return mask.copy()
    if in_h == 0 or in_w == 0:
        raise ValueError("cannot resize an empty (0-sized) array")
    rows = np.minimum(np.arange(out_h) * in_h // out_h, in_h - 1)
    cols = np.minimum(np.arange(out_w) * in_w // out_w, in_w - 1)
    return mask[rows[:, None], cols[None, :]]


def _binary(mask: Any, shape: Sequence[int] | None = None) -> np.ndarray:
    """A boolean mask; ``None`` (abstention) is an all-False mask of ``shape``."""
    if mask is None:
        if shape is None:
            raise ValueError("a ground-truth mask cannot be None")
        return np.zeros(tuple(shape), dtype=bool)
    mask = np.asarray(mask)
    if shape is not None and mask.shape != tuple(shape):
        mask = resize_nearest(mask, shape)
    return mask > 0


def iou(pred: Any, gt: Any) -> float:
    """|P ∩ G| / |P ∪ G| after resizing ``pred`` to ``gt``'s size; 0.0 when both are empty."""
    g = _binary(gt)
    p = _binary(pred, g.shape)
    union = int(np.logical_or(p, g).sum())
    return float(np.logical_and(p, g).sum()) / union if union else 0.0


def cms(pred: Any, gt: Any, alpha: float = ALPHA) -> float:
    """Confusion Mask Score, Eq. 3: (α|P ∩ G| + |P \\ G|) / (α|G|); NaN when G is empty.
    The paper takes α > 1 ("penalizes overlap with confusing regions more heavily", α = 3 in
    its evaluations, :data:`ALPHA`); any α > 0 is accepted here, for ablations."""
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    g = _binary(gt)
    p = _binary(pred, g.shape)
    area = int(g.sum())
    if area == 0:
        return math.nan
    confusing = int(np.logical_and(p, g).sum())
    non_overlap = int(np.logical_and(p, ~g).sum())
    return (alpha * confusing + non_overlap) / (alpha * area)


ROLES = ("fact", "textual", "visual")


def is_abstention(pred: Any) -> bool:
    """True for ``None`` or a mask with no foreground pixel."""
    return pred is None or not bool((np.asarray(pred) > 0).any())


def sample_scores(gt_fact: Any, gt_counterfact: Any, pred_fact: Any, pred_textual: Any,
                  pred_visual: Any, alpha: float = ALPHA) -> dict[str, float]:
    """All seven per-sample values of Eqs. 1-3 for one factual/counterfactual pair."""
    i_fact = iou(pred_fact, gt_fact)
    i_text = iou(pred_textual, gt_fact)
    i_vis = iou(pred_visual, gt_counterfact)
    return {
        "iou_fact": i_fact,
        "iou_textual": i_text,
        "iou_visual": i_vis,
        "delta_iou_textual": i_fact - i_text,
        "delta_iou_visual": i_fact - i_vis,
        "cms_fact": cms(pred_textual, gt_fact, alpha),
        "cms_counterfact": cms(pred_visual, gt_counterfact, alpha),
    }


def _record_scores(record: Mapping[str, Any], alpha: float) -> dict[str, float]:
    """The per-sample values of one record: computed once per record and alpha inside
    :func:`evaluators.metrics.memo.records_unchanged` (the report's bootstrap scores the same
    records ~1000 times), afresh on every call outside it."""
    return memo.per_record(record, ("hallusegbench", alpha), lambda: _compute_record_scores(record, alpha))


def _compute_record_scores(record: Mapping[str, Any], alpha: float) -> dict[str, float]:
    missing = [k for k in ("gt_fact", "gt_counterfact") if k not in record]
    if missing:
        raise KeyError(f"HalluSegBench record lacks {missing}; it needs gt_fact, gt_counterfact, "
                       "pred_fact, pred_textual, pred_visual (None = abstention)")
    unreadable = set(record.get("unreadable") or ())
    if not unreadable <= set(ROLES):
        raise ValueError(f"unreadable: roles must be among {ROLES}, got {sorted(unreadable)}")
    scores = sample_scores(record["gt_fact"], record["gt_counterfact"],
                           None if "fact" in unreadable else record.get("pred_fact"),
                           record.get("pred_textual"), record.get("pred_visual"), alpha)
    # an answer no mask could be read from (module notes): IoU at its worst, CMS left out
    for role, iou_key, cms_key, gt in (("textual", "iou_textual", "cms_fact", record["gt_fact"]),
                                       ("visual", "iou_visual", "cms_counterfact", record["gt_counterfact"])):
        scores[f"unreadable_{role}"] = float(role in unreadable)
        if role in unreadable:
            scores[iou_key] = 1.0 if _binary(gt).any() else 0.0  # an empty truth: every IoU is 0
            scores[cms_key] = math.nan
    scores["delta_iou_textual"] = scores["iou_fact"] - scores["iou_textual"]
    scores["delta_iou_visual"] = scores["iou_fact"] - scores["iou_visual"]
    scores["abstain_textual"] = float("textual" not in unreadable and is_abstention(record.get("pred_textual")))
    scores["abstain_visual"] = float("visual" not in unreadable and is_abstention(record.get("pred_visual")))
    return scores


def ci95_halfwidth(values: Sequence[float]) -> float:
    """Normal-approximation 95% CI half-width, 1.96·s/√n (sample std); NaN for n < 2.

    Table 3 reports such half-widths; the paper does not say how it computed them."""
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if v.size < 2:
        return math.nan
    return float(1.96 * v.std(ddof=1) / math.sqrt(v.size))


def scores(records: Iterable[Mapping[str, Any]], alpha: float = ALPHA) -> dict[str, Any]:
    """Mean of each per-sample value over ``records`` (fractions; NaN when there are none).

    Returns the seven metrics, ``abstain_textual`` / ``abstain_visual`` (share of empty
    predictions where abstaining is right), ``unreadable_textual`` / ``unreadable_visual``
    (share of answers no mask could be read from), ``n``, ``n_cms_fact`` /
    ``n_cms_counterfact`` (the pairs each CMS mean is over), ``n_cms_undefined`` (empty ground
    truth), ``n_cms_unreadable`` (pairs with either CMS left out as unreadable) and ``ci95``
    (a dict of half-widths)."""
    per = [_record_scores(r, alpha) for r in records]
    out: dict[str, Any] = {"n": len(per)}
    ci: dict[str, float] = {}
    for key in _KEYS + ("abstain_textual", "abstain_visual", "unreadable_textual", "unreadable_visual"):
        vals = [s[key] for s in per if not math.isnan(s[key])]
        out[key] = float(np.mean(vals)) if vals else math.nan
        if key in _KEYS:
            ci[key] = ci95_halfwidth(vals)
    # how many pairs each CMS mean is over (the two leave out different pairs: the counts
    # below count a pair once whichever role it lost)
    out["n_cms_fact"] = sum(not math.isnan(s["cms_fact"]) for s in per)
    out["n_cms_counterfact"] = sum(not math.isnan(s["cms_counterfact"]) for s in per)
    out["n_cms_unreadable"] = sum(bool(s["unreadable_textual"] or s["unreadable_visual"]) for s in per)
    out["n_cms_undefined"] = sum((math.isnan(s["cms_fact"]) and not s["unreadable_textual"])
                                 or (math.isnan(s["cms_counterfact"]) and not s["unreadable_visual"]) for s in per)
    out["ci95"] = ci
    return out


def scores_by(records: Iterable[Mapping[str, Any]], key: str = "split", alpha: float = ALPHA) -> dict[Any, dict]:
    """:func:`scores` for each value of ``record[key]`` (default: per split, as in Table 1;
    ``key="size"`` gives the S/M/L breakdown of Tables 4-5 if records carry a size bin)."""
    groups: dict[Any, list] = defaultdict(list)
    for r in records:
        if key not in r:
            raise KeyError(f"record lacks the grouping field {key!r}")
        groups[r[key]].append(r)
    return {value: scores(group, alpha) for value, group in groups.items()}


def scores_by_split(records: Iterable[Mapping[str, Any]], alpha: float = ALPHA) -> dict[str, dict]:
    """Referring and reasoning reported apart (Table 1). Both splits are always present in
    the result; a split without samples has ``n = 0`` and NaN metrics. Split names are
    normalised ("referral", "ref", "refcoco" -> "referring"; "rsn", "reasonseg" -> "reasoning")."""
    normalised = []
    for r in records:
        if "split" not in r:
            raise KeyError("record lacks the field 'split'")
        split = _SPLIT_ALIASES.get(str(r["split"]).lower(), r["split"])
        normalised.append({**r, "split": split})
    out = scores_by(normalised, "split", alpha)
    for split in SPLITS:
        out.setdefault(split, scores([], alpha))
    return out


# the runner reports every metric pooled and per value of this record field (Table 1
# reports the referring and reasoning splits apart)
REPORTED_APART = "split"

# answers are boxes: the runner stores in each record the frame its model writes them in
# (evaluators.box_frames), which answer_invalid and the pairs' masks read
READS_BOXES = True


def answer_invalid(record: Mapping[str, Any]) -> bool:
    """Is one query's answer (a per-query record of ``samples.jsonl``) unreadable as these
    metrics read it? True when no mask can be read from it (:func:`evaluators.masks.answer_mask`,
    the reading that puts its role in a pair's ``unreadable``: :func:`..suite.assemble`) or
    its input could not be asked. The runner sets each record's ``invalid`` by this, and
    counts the invalid-answer rate from those flags: the query's own parse
    (:func:`evaluators.query.to_record`) takes any non-empty text as an answer, so
    ``"<c7> <c0>"`` (half a box) had been flagged valid and then scored as unreadable.
    The answer is read on the grid :func:`..suite.answer_grid` gives, as the pair's record
    reads it: a box off the image covers no pixel and is unreadable."""
    from ...box_frames import DEFAULT_FRAME
    from ...masks import answer_mask
    from .suite import answer_grid, asked_for

    if record.get("invalid_input"):
        return True
    return answer_mask(record.get("answer"), answer_grid(record), record.get("box_frame", DEFAULT_FRAME),
                       asked_for(record), record.get("empty_abstains", False))[1]


def _mean_of(key: str):
    def fn(records, alpha: float = ALPHA) -> float:
        return scores(records, alpha)[key]
    return fn


@metric("hallusegbench.iou_fact", "hallusegbench", None, True, "per_sample_mean")
def iou_fact(records, alpha: float = ALPHA) -> float:
    """Mean IoU(M̂_c, M_c) on the factual image (Eq. 1): segmentation quality."""
    return _mean_of("iou_fact")(records, alpha)


@metric("hallusegbench.iou_textual", "hallusegbench", "label_grounding", False, "per_sample_mean")
def iou_textual(records, alpha: float = ALPHA) -> float:
    """Mean IoU(M̂_{c'}, M_c) (Eq. 1): leakage of a swapped label onto the factual object."""
    return _mean_of("iou_textual")(records, alpha)


@metric("hallusegbench.iou_visual", "hallusegbench", "vision_grounding", False, "per_sample_mean")
def iou_visual(records, alpha: float = ALPHA) -> float:
    """Mean IoU(M̂'_c, M'_{c'}) (Eq. 1): the removed object still segmented on its replacement."""
    return _mean_of("iou_visual")(records, alpha)


@metric("hallusegbench.delta_iou_textual", "hallusegbench", "label_grounding", True, "per_sample_mean")
def delta_iou_textual(records, alpha: float = ALPHA) -> float:
    """Mean IoU_fact - IoU_textual (§4.2): larger = label-driven hallucination suppressed."""
    return _mean_of("delta_iou_textual")(records, alpha)


@metric("hallusegbench.delta_iou_visual", "hallusegbench", "vision_grounding", True, "per_sample_mean")
def delta_iou_visual(records, alpha: float = ALPHA) -> float:
    """Mean IoU_fact - IoU_visual (§4.2): larger = vision-driven hallucination suppressed."""
    return _mean_of("delta_iou_visual")(records, alpha)


@metric("hallusegbench.cms_fact", "hallusegbench", "label_grounding", False, "per_sample_mean")
def cms_fact(records, alpha: float = ALPHA) -> float:
    """Mean CMS of f(I, c') against M_c (Eq. 3, α = 3), over readable answers."""
    return _mean_of("cms_fact")(records, alpha)


@metric("hallusegbench.cms_counterfact", "hallusegbench", "vision_grounding", False, "per_sample_mean")
def cms_counterfact(records, alpha: float = ALPHA) -> float:
    """Mean CMS of f(I', c) against M'_{c'} (Eq. 3, α = 3), over readable answers."""
    return _mean_of("cms_counterfact")(records, alpha)


@metric("hallusegbench.unreadable_textual", "hallusegbench", "label_grounding", False, "per_sample_mean")
def unreadable_textual(records, alpha: float = ALPHA) -> float:
    """Share of f(I, c') answers no mask can be read from (ours: CMS_fact leaves them out)."""
    return _mean_of("unreadable_textual")(records, alpha)


@metric("hallusegbench.unreadable_visual", "hallusegbench", "vision_grounding", False, "per_sample_mean")
def unreadable_visual(records, alpha: float = ALPHA) -> float:
    """Share of f(I', c) answers no mask can be read from (ours: CMS_counterfact leaves them out)."""
    return _mean_of("unreadable_visual")(records, alpha)


__all__ = [
    "ALPHA", "REPORTED_APART", "SPLITS", "answer_invalid", "ci95_halfwidth", "cms", "cms_counterfact", "cms_fact", "delta_iou_textual",
    "delta_iou_visual", "iou", "iou_fact", "iou_textual", "iou_visual", "is_abstention", "resize_nearest",
    "ROLES", "sample_scores", "scores", "scores_by", "scores_by_split", "unreadable_textual", "unreadable_visual",
]
