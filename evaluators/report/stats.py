"""Paired statistics for mitigation-vs-baseline comparisons on identical samples.

* :func:`paired_bootstrap` -- the delta of any metric (mitigated - baseline) with a
  percentile 95% interval from resampling *units* with replacement, the same units for
  both arms (paired). A unit is a sample, or a group the benchmark scores together (a
  DO-Bench scene, a HalluSegBench pair), so within-group structure is kept; a unit drawn
  several times enters as that many distinct units (:func:`resampled`).
* :func:`mcnemar_exact` -- the exact McNemar test for binary outcomes on the same samples:
  under H0 the discordant pairs split 50/50, two-sided binomial p-value. It treats every
  query as independent, which a DO-Bench scene's questions are not: with effects whose
  direction varies by scene it rejects far more often than 5% (a clustered McNemar test,
  Obuchowski 1998, would not). It is reported beside the intervals; no verdict reads it.
* :func:`verdict` -- *fixes* / *breaks* / *no detectable effect* from the interval and the
  metric's direction, never from the point estimate alone, and never from fewer than
  :data:`MIN_SUPPORT` units (:func:`support`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np
from scipy.stats import binomtest

from ..metrics import memo
from ..query import UNIT_FIELDS

Record = Mapping[str, Any]

#: The fewest units a metric may rest on for a verdict: units it reads (:func:`support`)
#: *and* units where the two arms differ as it sees them (:func:`changed`). A metric often
#: reads a few units of its benchmark (MIOH's LC-S: 4 queries at the small scale); when
#: they all move the same way, every resample gives the same delta and the percentile
#: interval collapses onto it ("+100 [+100, +100]" from 4 queries). Likewise 4 changed
#: answers among 100 unchanged ones leave the interval above 0 (the chance that a resample
#: misses all 4 is 0.96**100 = 1.7%), while the exact McNemar test gives p = 0.125. No
#: paired two-sided test at the 5% level can decide on fewer than 6 discordant units -- the
#: sign test's smallest p-value on k of them is 2 * 0.5**k, 0.0625 for k = 5 and 0.031 for
#: k = 6 -- so neither may the bootstrap. Applying that bound to the bootstrap is our choice
#: (no benchmark paper addresses it).
MIN_SUPPORT = 6

#: How far :func:`changed` counts for a bootstrap p-value's floor: a p-value is never given
#: below the sign test's smallest on the units that changed, ``2 * 0.5**changed``
#: (:func:`p_floor`). The same bound as :data:`MIN_SUPPORT`, carried to Holm's stricter
#: thresholds: at 0.05/17 (an arm's family at ``--scale full``) 6 changed units give 0.031,
#: not the 0 the bootstrap reads when every resample lands on one side (under sign flips of
#: 7 changed units among 40 the bootstrap's p fell below 0.0025 six times as often as it
#: should). 20 units take the floor below 2e-6, under any threshold Holm meets here.
FLOOR_UNITS = 20


def p_floor(changed_units: int) -> float:
    """The smallest p-value a paired two-sided test can give on ``changed_units`` discordant
    units (the exact sign test's, ``2 * 0.5**k``, capped at 1). Our choice; no benchmark
    paper addresses it (see :data:`FLOOR_UNITS`)."""
    return min(1.0, 2 * 0.5 ** changed_units)


#: The fewest resamples a 95% percentile interval is read from (``vlm-report --resamples``).
#: Its ends are the 2.5% and 97.5% quantiles of the resampled deltas. Under 39 resamples
#: there is no 95% interval in them at all: the whole range of B resampled values covers a
#: further one with probability (B - 1) / (B + 1), below 95% for B < 39 (Davison & Hinkley
#: 1997, Sec. 5.2.3, take B with (B + 1) * 0.025 a whole number, 1 at B = 39); with 1
#: resample the "interval" is a single delta, which decided verdicts on its own (first seen
#: as "FIXES +23.6 [+19.4, +19.4]"). At 100 each tail holds 2.5 resamples, so neither end is
#: the most extreme draw. Still far from stable ends (Efron & Tibshirani 1993 ask for about
#: 1000 for percentile intervals, the default): 100 is our floor, not a recommendation.
MIN_RESAMPLES = 100

#: Record fields a metric may group a unit's records by: the record's own id and the fields
#: that tie records of one sample together (:data:`evaluators.query.UNIT_FIELDS`: a
#: Causal-HalBench pair, a DO-Bench scene, ...). Each extra copy of a unit drawn several
#: times gets them relabelled (:func:`resampled`).
COPY_FIELDS = ("id", *UNIT_FIELDS)


def resampled(groups: Sequence[Sequence[Record]], pick: Sequence[int], fields: Sequence[str] = COPY_FIELDS,
              cache: dict | None = None) -> list[Record]:
    """The records of one bootstrap resample: the records of ``groups[i]`` for each ``i`` in
    ``pick``, the ``c``-th repeat of a unit (c >= 1) with every field of ``fields`` it holds
    relabelled ``"<value>#copy<c>"``, so that each draw of a unit is a unit of its own.

    A unit drawn k times must weigh k times one unit. Concatenated unchanged, its records
    met themselves in any metric that pairs records inside a unit: Causal-HalBench's CPR
    pairs every original-image answer with every counterfactual one of a ``pair_id``, so a
    pair drawn 3 times gave 9 times its pairs, not 3 (the small suite's 12 pairs, the first
    drawn 3 times: 60 answer pairs counted instead of 42, CPR 63.3 instead of 61.9).
    Relabelled, a resample is exactly the data with that unit repeated under new ids;
    metrics that read records one by one see the same records as before, so their
    resamples are unchanged. The first draw keeps its records as they are (and the point
    estimate, with no resampling, is the metric of the data). A metric that groups records
    by a field outside ``fields`` needs that field added. ``cache`` keeps each relabelled
    copy for reuse across resamples (one cache per arm)."""
    out: list[Record] = []
    seen: dict[int, int] = {}
    for i in pick:
        i = int(i)
        c = seen.get(i, 0)
        seen[i] = c + 1
        if c == 0:
            out.extend(groups[i])
            continue
        copy = cache.get((i, c)) if cache is not None else None
        if copy is None:
            copy = [{**r, **{f: f"{r[f]}#copy{c}" for f in fields if r.get(f) is not None}} for r in groups[i]]
            if cache is not None:
                cache[(i, c)] = copy
        out.extend(copy)
    return out


class UnpairedSamples(ValueError):
    """The two arms of a paired comparison hold different samples: a setup error (for
    example answers of another run in an arm's folder), never a metric that does not apply."""


def paired_bootstrap(
    baseline: Sequence[Record],
    mitigated: Sequence[Record],
    metric: Callable[[list[Record]], float],
    *,
    unit: Callable[[Record], Hashable] = lambda r: r["id"],
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    interval: str = "percentile",
) -> dict[str, float]:
    """``{"delta", "low", "high", "baseline", "mitigated", "n_units", "support", "dropped"}``
    for ``metric``.

    Both arms must hold the same units (the comparison is on identical samples); a
    resample whose metric is NaN in either arm is dropped and counted in ``dropped``.
    ``support`` is how many of the ``n_units`` the metric reads (:func:`support`),
    ``changed`` in how many the arms differ as the metric sees it (:func:`changed`, counted
    up to :data:`FLOOR_UNITS`); ``p_value`` the two-sided p-value that goes with the interval,
    never below :func:`p_floor` of ``changed``.

    A unit drawn several times into a resample enters as that many distinct units, its
    repeats' id and unit fields relabelled (:func:`resampled`), so a metric that pairs
    records inside a unit (Causal-HalBench's CPR) weighs it k times, not k squared.

    ``interval``: ``"percentile"`` (the default) or ``"expanded"``, Hesterberg's expanded
    percentile interval (:func:`expanded_tail`), wider where the units are few.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {', '.join(INTERVALS)}, got {interval!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        # 0 or fewer gave NaN intervals without a word (compare() asks for MIN_RESAMPLES)
        raise ValueError(f"n_resamples must be a positive int, got {n_resamples!r}")
    groups_a: dict[Hashable, list] = {}
    groups_b: dict[Hashable, list] = {}
    for r in baseline:
        groups_a.setdefault(unit(r), []).append(r)
    for r in mitigated:
        groups_b.setdefault(unit(r), []).append(r)
    if set(groups_a) != set(groups_b):
        missing = sorted(map(str, set(groups_a) ^ set(groups_b)))[:5]
        raise UnpairedSamples(f"baseline and mitigated runs cover different samples (e.g. {missing}); "
                              "paired statistics need identical samples")
    with memo.records_unchanged():  # a metric's per-record work is done once, not per resample
        return _paired_bootstrap(groups_a, groups_b, metric, n_resamples, seed, level, interval)


#: the intervals :func:`paired_bootstrap` reads from the resampled deltas
INTERVALS = ("percentile", "expanded")


def expanded_tail(level: float, n_units: int) -> float:
    """The tail share each end of Hesterberg's expanded percentile interval leaves out:
    ``Phi(-sqrt(n / (n - 1)) * t_{n-1, 1 - (1 - level) / 2})`` (Hesterberg 2015, "What
    teachers should know about the bootstrap", Am. Stat. 69:371, Sec. 5.2). The percentile
    interval is too narrow on few units (it ignores the t distribution's wider tails and the
    n/(n-1) variance bias); at level 0.95 this leaves 1.08% per tail at 12 units and 2.03% at
    40, tending to 2.5%. Fewer than 2 units: the plain percentile tail."""
    from scipy.stats import norm, t

    plain = (1 - level) / 2
    if n_units < 2:
        return plain
    return float(norm.cdf(-math.sqrt(n_units / (n_units - 1)) * t.ppf(1 - plain, n_units - 1)))


def _expanded_p(q: float, n_units: int) -> float:
    """The two-sided p-value that goes with the expanded interval: the smallest alpha at
    which it excludes 0, given the share ``q`` of resampled deltas on the far side of 0
    (inverts :func:`expanded_tail`; 2q for many units)."""
    from scipy.stats import norm, t

    if n_units < 2:
        return min(1.0, 2 * q)
    if q <= 0:
        return 0.0
    z = -norm.ppf(min(q, 0.5)) / math.sqrt(n_units / (n_units - 1))
    return float(min(1.0, 2 * (1 - t.cdf(z, n_units - 1))))


def _paired_bootstrap(groups_a: dict, groups_b: dict, metric: Callable[[list[Record]], float], n_resamples: int,
                      seed: int, level: float, interval: str = "percentile") -> dict[str, float]:
    units = sorted(groups_a, key=str)
    base_value = metric([r for u in units for r in groups_a[u]])
    mit_value = metric([r for u in units for r in groups_b[u]])
    rng = np.random.default_rng(seed)
    deltas, dropped = [], 0
    in_a, in_b = [groups_a[u] for u in units], [groups_b[u] for u in units]
    copies_a: dict = {}
    copies_b: dict = {}
    for _ in range(n_resamples):
        pick = rng.integers(0, len(units), size=len(units))
        a = metric(resampled(in_a, pick, cache=copies_a))
        b = metric(resampled(in_b, pick, cache=copies_b))
        if math.isnan(a) or math.isnan(b):
            dropped += 1
            continue
        deltas.append(b - a)
    expanded = interval == "expanded"
    tail = (expanded_tail(level, len(units)) if expanded else (1 - level) / 2) * 100
    low, high = (np.percentile(deltas, [tail, 100 - tail]) if deltas else (math.nan, math.nan))
    p_value = bootstrap_p(deltas)
    if expanded and not math.isnan(p_value):
        p_value = _expanded_p(p_value / 2, len(units))
    moved = changed(in_a, in_b, metric, enough=FLOOR_UNITS)
    if not math.isnan(p_value):
        p_value = max(p_value, p_floor(moved))
    return {"baseline": base_value, "mitigated": mit_value, "delta": mit_value - base_value,
            "low": float(low), "high": float(high), "p_value": p_value, "interval": interval,
            "n_units": len(units), "support": support(in_a, metric, other=in_b), "changed": moved,
            "dropped": dropped}


def bootstrap_p(deltas: Sequence[float]) -> float:
    """The two-sided p-value that goes with the percentile interval: twice the share of
    resampled deltas on the far side of 0 (within :data:`TOLERANCE` counts as 0, so ties
    count against the effect), capped at 1 -- the smallest alpha at which the (1 - alpha)
    percentile interval excludes 0, up to its interpolation (Efron & Tibshirani 1993, Sec.
    16.4, the bootstrap's achieved significance level). NaN without resamples. It lets
    :func:`holm` correct a family of metrics together (:func:`paired_bootstrap` raises it to
    :func:`p_floor` of the units that changed)."""
    if not len(deltas):
        return math.nan
    d = np.asarray(deltas, dtype=float)
    return float(min(1.0, 2 * min(np.mean(d <= TOLERANCE), np.mean(d >= -TOLERANCE))))


def holm(p_values: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down procedure (Holm 1979): which of ``p_values`` are rejected with the
    family-wise error rate held at ``alpha``. Sorted ascending, the i-th smallest (from 0) is
    rejected while ``p <= alpha / (m - i)``; the first that is not stops it."""
    order = sorted(range(len(p_values)), key=lambda i: (math.isnan(p_values[i]), p_values[i]))  # NaN last
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if math.isnan(p_values[i]) or p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected


def _same_records(a: list, b: list, skip: frozenset = frozenset()) -> bool:
    """The two arms' records of a unit say the same, fields in ``skip`` and caches (fields
    starting with "_") aside; arrays (masks) compare elementwise."""
    def same(x, y) -> bool:
        return bool(np.array_equal(x, y)) if isinstance(x, np.ndarray) or isinstance(y, np.ndarray) else x == y

    def fields(r) -> set:
        return {k for k in r if k not in skip and not str(k).startswith("_")}

    return len(a) == len(b) and all(fields(ra) == fields(rb) and all(same(ra[k], rb[k]) for k in fields(ra))
                                    for ra, rb in zip(a, b))


#: Metric values closer than this are the same value: a mean of per-unit scores recomputed
#: over another order of the same records differs in its last bits (a denial moved from
#: level 1 to level 2 of PriorRobust left it 1e-14 off and counted as a changed unit), and an
#: interval end that is exactly 0 comes out as +-1e-14 (read as "excludes 0": a BREAKS from
#: [+6.9e-15, +100]). Metrics are percentages or IoUs, so 1e-9 is far below any real change.
TOLERANCE = 1e-9


def _same_value(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=0.0, abs_tol=TOLERANCE)


def changed(baseline: Sequence[list], mitigated: Sequence[list], metric: Callable[[list[Record]], float],
            enough: int = MIN_SUPPORT) -> int:
    """In how many units (each a unit's records, same order in both arms) the arms differ as
    ``metric`` sees them, counted up to ``enough``: putting the baseline's records of the
    unit in place of the mitigated ones changes the mitigated value. The paired analogue of
    McNemar's discordant pairs for any metric (:data:`MIN_SUPPORT`)."""
    full = _value(metric, [r for u in mitigated for r in u])
    count = 0
    for i, (a, b) in enumerate(zip(baseline, mitigated)):
        # screen (linear): records equal but for their raw answer text, with the unit's own
        # value equal in both arms, say the same to the metric. Sampled arms word most answers
        # differently, and the swap below costs a whole metric per unit; the metrics read
        # parsed fields, and a caption metric (CHAIR) shows a changed caption in the unit's value
        if _same_records(a, b) or (_same_records(a, b, skip=frozenset({"answer"}))
                                   and _same_value(_value(metric, list(a)), _value(metric, list(b)))):
            continue
        swapped = _value(metric, [r for j, u in enumerate(mitigated) for r in (a if j == i else u)])
        if not _same_value(swapped, full):
            count += 1
            if count >= enough:
                break
    return count


def _value(metric: Callable[[list[Record]], float], records: list[Record]) -> float:
    """The metric, NaN where it is undefined on these records (some raise instead)."""
    try:
        return float(metric(records))
    except (KeyError, ValueError, TypeError, ZeroDivisionError):
        return math.nan


def support(units: Sequence[list], metric: Callable[[list[Record]], float], enough: int = MIN_SUPPORT,
            other: Sequence[list] | None = None) -> int:
    """How many of ``units`` (each a unit's records) ``metric`` reads, as a lower bound: the
    union of three signs that it reads a unit, the later ones only while fewer than
    ``enough`` are found (then counted up to ``enough``):

    1. it is defined on the unit alone -- a pooled metric over a subset, such as MIOH's
       LC-S queries, is NaN on every other unit;
    2. the unit makes it defined together with a unit it is undefined on alone -- a metric
       of two parts, such as MIOH's decomposition gap, is defined on no single unit;
    3. leaving the unit out changes it, in these records or in ``other`` (the other arm's
       units, same order) -- metrics that need several units at once (ReactBench's).

    The first two depend on which records a unit holds, not on the answers; the third
    misses units whose outcome equals the metric's value (all answers alike), which the
    first two catch for the metrics they apply to."""
    defined = [not math.isnan(_value(metric, list(u))) for u in units]
    read = {i for i, d in enumerate(defined) if d}
    if len(read) >= enough:
        return len(read)
    undefined = [u for u, d in zip(units, defined) if not d]
    for i, u in enumerate(units):
        if i not in read and any(v is not u and not math.isnan(_value(metric, list(u) + list(v))) for v in undefined):
            read.add(i)
            if len(read) >= enough:
                return len(read)
    for arm in (units, other) if other is not None else (units,):
        full = _value(metric, [r for u in arm for r in u])
        for i in range(len(arm)):
            if i in read:
                continue
            rest = _value(metric, [r for j, u in enumerate(arm) if j != i for r in u])
            if not _same_value(rest, full):
                read.add(i)
                if len(read) >= enough:
                    return len(read)
    return len(read)


def mcnemar_exact(baseline_correct: Sequence[bool], mitigated_correct: Sequence[bool]) -> dict[str, float]:
    """Exact McNemar test on paired binary outcomes: ``b`` = right only at baseline,
    ``c`` = right only when mitigated; p = two-sided binomial test of b vs c at 1/2."""
    if len(baseline_correct) != len(mitigated_correct):
        raise ValueError("paired outcomes must have the same length")
    b = sum(bool(x) and not bool(y) for x, y in zip(baseline_correct, mitigated_correct))
    c = sum(bool(y) and not bool(x) for x, y in zip(baseline_correct, mitigated_correct))
    p = 1.0 if b + c == 0 else float(binomtest(c, b + c, 0.5).pvalue)
    return {"only_baseline_right": b, "only_mitigated_right": c, "p_value": p}


def verdict(low: float, high: float, higher_is_better: bool | None, support: int | None = None) -> str:
    """*fixes* when the whole interval lies on the good side of 0, *breaks* when on the bad
    side, otherwise *no detectable effect* (also for metrics without a direction, and for a
    metric that rests on fewer than :data:`MIN_SUPPORT` units, whatever its interval:
    ``support`` is the fewer of the units it reads and the units that changed); *not
    measured* when there is no interval (NaN: no resample defined the metric)."""
    if not (math.isnan(low) or math.isnan(high)) and low > high:
        raise ValueError(f"verdict: the interval's low end {low} is above its high end {high}")
    if math.isnan(low) or math.isnan(high):
        # no resample defined it (DO-Bench data without Cluster / Crop views: PerceptionAbility):
        # nothing was measured, which "-" (no detectable effect at this size) would misstate
        return "not measured"
    if higher_is_better is None:
        return "no detectable effect"
    if support is not None and support < MIN_SUPPORT:
        return "no detectable effect"
    good_low, good_high = (low, high) if higher_is_better else (-high, -low)
    if good_low > TOLERANCE:  # an end within TOLERANCE of 0 is 0 (see TOLERANCE)
        return "fixes"
    if good_high < -TOLERANCE:
        return "breaks"
    return "no detectable effect"
