"""Which mechanism each mitigation fixes, and which it breaks.

Every *arm* (a mitigation setting) answers the same probe queries as its baseline (greedy
or sampling, matching its own decoding). For every metric the benchmarks tag with a
mechanism, the paired bootstrap gives the delta and its 95% interval (resampling the
benchmark's units, :data:`UNITS`: DO-Bench scenes, Causal-HalBench pairs, HalluSegBench
image pairs, ReactBench items, MIOH image sets; a user's own questions where no group is known),
and :func:`~evaluators.report.stats.verdict` reads the interval. A (mitigation, mechanism)
cell is *fixes* when some metric of that mechanism improves and none worsens, *breaks* in
the opposite case, *mixed* when both happen, else *no detectable effect*. By default every
interval is Hesterberg's expanded percentile interval (the suites have 12-40 units, where the
plain percentile interval runs narrow) and all of an arm's metrics are corrected together
(Holm's procedure on their bootstrap p-values, :func:`adjusted`, :data:`FAMILIES`), so a
column of 6 cells is decided by chance in about 5% of comparisons (``null_check`` measures it).

Controls the contrastive-decoding literature demands (arXiv 2504.10020): VCD is run under
greedy and under sampling, the plausibility constraint alone is its own arm, and the
yes-ratio is reported beside every yes/no benchmark. A VCD gain under sampling that is not
shown beyond the plausibility-only arm (their paired interval includes 0) is flagged: the
constraint alone may explain it (an undetected difference, not a shown equivalence).
"""

from __future__ import annotations

import functools
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..metrics import MECHANISMS, metrics_for
from ..query import unit_key
from .stats import MIN_RESAMPLES, MIN_SUPPORT, UnpairedSamples, holm, mcnemar_exact, paired_bootstrap, verdict

SAMPLING = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}

# the unit a benchmark's records are resampled by (its scored groups stay together): the
# sample --limit keeps whole (evaluators.query.unit_key, where each benchmark's rule is
# given): a DO-Bench scene, a Causal-HalBench pair, a HalluSegBench image pair (its
# referring and reasoning queries), a ReactBench item, a MIOH image set
UNITS: dict[str, Callable[[dict], Any]] = {
    bench: functools.partial(unit_key, bench)
    for bench in ("dobench", "causal_halbench", "hallusegbench", "reactbench", "mioh")
}
YES_NO_BENCHMARKS = ("dobench", "causal_halbench")


@dataclass
class Arm:
    """A decoding setting: mitigations (built from the processor) and generate() arguments."""

    name: str
    build: Callable[[Any], list] = field(default=lambda processor: [])
    generate_kwargs: dict = field(default_factory=dict)
    baseline: str | None = None  # the arm it is compared with (None: it is a baseline)
    control: str | None = None  # an arm whose effect must be beaten for the gain to count


def default_arms() -> list[Arm]:
    from mitigate import VCD, CropVerify, Plausibility, PriorSuppression

    return [
        Arm("baseline (greedy)"),
        Arm("baseline (sampling)", generate_kwargs=SAMPLING),
        Arm("plausibility only (sampling)", lambda p: [Plausibility(0.1)], SAMPLING, "baseline (sampling)"),
        Arm("VCD (greedy)", lambda p: [VCD()], {}, "baseline (greedy)"),
        Arm("VCD (sampling)", lambda p: [VCD()], SAMPLING, "baseline (sampling)", control="plausibility only (sampling)"),
        Arm("prior suppression: context", lambda p: [PriorSuppression(p.tokenizer, mode="context")], {},
            "baseline (greedy)"),
        # the same masking with the positions closed up, as if the belief sentence were
        # deleted (docs/results/prior_full.md: masking alone leaves a position gap)
        Arm("prior suppression: context, compact", lambda p: [PriorSuppression(p.tokenizer, mode="context",
            compact_positions=True)], {}, "baseline (greedy)"),
        Arm("prior suppression: output", lambda p: [PriorSuppression(mode="output")], {}, "baseline (greedy)"),
        Arm("crop-and-verify", lambda p: [CropVerify(p)], {}, "baseline (greedy)"),
        Arm("combined", lambda p: [VCD(), PriorSuppression(p.tokenizer, mode="both"), CropVerify(p)], {},
            "baseline (greedy)"),
    ]


#: Arms added from user code (:func:`register_arm`): run, like the optional ones, only when
#: ``--arms`` names them (``vlm-report --include my_arms.py --arms "my arm"``).
USER_ARMS: dict[str, Arm] = {}


def slug(name: str) -> str:
    """An arm's name as ``--arms`` accepts it and its output folder is named: ``"VCD (greedy)"`` -> ``vcd-greedy``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def register_arm(arm: Arm) -> Arm:
    """Add ``arm`` for ``vlm-report --arms`` to name (after ``--include`` imported the module
    that registers it). Its ``baseline`` / ``control`` name arms it is compared with -- a
    built-in one (``"baseline (greedy)"``) or another registered one. A name the built-in arms
    use is refused; registering a name again (a notebook cell run twice) replaces it."""
    if not isinstance(arm, Arm):
        raise TypeError(f"register_arm() takes an Arm, got {type(arm).__name__}")
    if not isinstance(arm.name, str) or not arm.name.strip():
        raise ValueError(f"an arm needs a name, got {arm.name!r}")
    if not callable(arm.build):
        raise ValueError(f"arm {arm.name!r}: build must be callable, build(processor) -> [mitigations]")
    if any(slug(a.name) == slug(arm.name) for a in default_arms() + _builtin_optional_arms()):
        raise ValueError(f"arm {arm.name!r} is a built-in arm (or named like one: {slug(arm.name)!r}); give yours "
                         "another name")
    twin = next((a for a in USER_ARMS.values() if a.name != arm.name and slug(a.name) == slug(arm.name)), None)
    if twin is not None:
        raise ValueError(f"arm {arm.name!r} is named like the registered arm {twin.name!r} ({slug(arm.name)!r}: "
                         "--arms and the output folders tell arms apart by it)")
    USER_ARMS[arm.name] = arm
    return arm


def optional_arms() -> list[Arm]:
    """Arms run only when ``--arms`` names them (options measured on their own, not in the
    default table), the registered ones (:func:`register_arm`) last."""
    return _builtin_optional_arms() + list(USER_ARMS.values())


def _builtin_optional_arms() -> list[Arm]:
    from mitigate import CropVerify, PriorSuppression

    return [
        # multi-image "in which image ...?" questions verified image by image
        # (docs/results/crop_verify_which_image.md)
        Arm("crop-and-verify, which image", lambda p: [CropVerify(p, which_image=True)], {}, "baseline (greedy)"),
        # every unconfident multi-image answer re-derived from the images asked one by one
        # (MIOH Sec. 5.5's decomposition; docs/results/crop_verify_which_image.md)
        Arm("crop-and-verify, decomposed", lambda p: [CropVerify(p, which_image="decompose")], {},
            "baseline (greedy)"),
        # the same with the prompt's pressure sentence kept in every per-image question, alone
        # and under context-mode prior suppression: what suppression adds where the model can
        # read the images (MIOH's LC-S / LC-I; docs/results/crop_verify_which_image.md)
        Arm("crop-and-verify, decomposed, priors kept",
            lambda p: [CropVerify(p, which_image="decompose", strip_priors=False)], {}, "baseline (greedy)"),
        Arm("prior suppression: context, decomposed, priors kept",
            lambda p: [PriorSuppression(p.tokenizer, mode="context"),
                       CropVerify(p, which_image="decompose", strip_priors=False)], {},
            "crop-and-verify, decomposed, priors kept"),
        # the views cut where the image tokens look like the object's name rather than where
        # attention points (mitigate/localize_embedding.py; docs/results/crop_verify_locate.md)
        Arm("crop-and-verify, embedding localiser", lambda p: [CropVerify(p, locate="embedding")], {},
            "baseline (greedy)"),
        # the same read on 2x2 tiles of the image, for objects smaller than a patch
        Arm("crop-and-verify, zoomed search", lambda p: [CropVerify(p, locate="zoom")], {}, "baseline (greedy)"),
        # the decomposition with the views cut where the zoomed search finds the object: MIOH's
        # hard positives are small, where the attention localiser misses them
        # (docs/results/crop_verify_which_image.md, "--scale large")
        Arm("crop-and-verify, decomposed, zoomed search",
            lambda p: [CropVerify(p, which_image="decompose", locate="zoom")], {}, "baseline (greedy)"),
    ]


#: The field a benchmark's records must carry for the bootstrap to resample whole samples:
#: without it each record is its own unit (a DO-Bench scene's ten questions resampled one by
#: one), the interval comes out too narrow and the support counts records, not samples.
#: HalluSegBench, ReactBench and MIOH's decomposed records are told by their ids
#: (:data:`evaluators.query.UNIT_RULES`).
UNIT_FIELD = {"dobench": "scene_id", "causal_halbench": "pair_id"}


class MissingUnits(ValueError):
    """Records lack the field that groups them into the benchmark's samples (:data:`UNIT_FIELD`)."""


def _check_units(bench: str, *arms: Sequence[dict]) -> None:
    need = UNIT_FIELD.get(bench)
    if need is None:
        return
    lacking = [r.get("id", "?") for records in arms for r in records if r.get(need) is None]
    if lacking:
        raise MissingUnits(f"{bench}: {len(lacking)} records lack {need!r} (e.g. {lacking[:3]}); the paired bootstrap "
                           f"resamples whole samples by it, and without it each record would count as a sample of "
                           "its own, giving intervals that are too narrow")


def _unit(bench: str) -> Callable[[dict], Any]:
    return UNITS.get(bench) or functools.partial(unit_key, bench)


def compare(base: dict[str, list], arm: dict[str, list], *, n_resamples: int = 1000, seed: int = 0,
            interval: str = "expanded", family: str = "arm") -> list[dict]:
    """Per benchmark and mechanism-tagged metric: the paired delta, interval and verdict;
    a ``ValueError`` for fewer than :data:`~evaluators.report.stats.MIN_RESAMPLES` resamples
    (no 95% interval, yet verdicts). ``interval``: ``"percentile"`` or ``"expanded"``
    (:func:`~evaluators.report.stats.expanded_tail`); ``family``: which metrics Holm's
    procedure corrects together (:data:`FAMILIES`, :func:`adjusted`)."""
    if n_resamples < MIN_RESAMPLES:
        raise ValueError(f"n_resamples must be at least {MIN_RESAMPLES} for a 95% interval, got {n_resamples}")
    _check_family(family)  # before the bootstraps, not after them in adjusted()
    rows = []
    for bench in sorted(set(base) & set(arm)):
        _check_units(bench, base[bench], arm[bench])
        for spec in metrics_for(bench):
            if spec.mechanism is None and not spec.name.endswith(("accuracy", "yes_rate")):
                continue
            try:
                stats = paired_bootstrap(base[bench], arm[bench], spec.fn, unit=_unit(bench),
                                         n_resamples=n_resamples, seed=seed, interval=interval)
            except UnpairedSamples:
                raise  # the arms were not run on the same samples: no verdict may rest on them
            except KeyError:
                continue  # a metric whose fields this suite lacks (reported as not computed elsewhere)
            except (ValueError, TypeError) as err:
                # a malformed value (pred_yes "no"): an error, never a mechanism silently "not measured"
                raise type(err)(f"{spec.name}: {err}") from err
            rows.append({"benchmark": bench, "metric": spec.name, "mechanism": spec.mechanism,
                         "higher_is_better": spec.higher_is_better, **stats,
                         "verdict": verdict(stats["low"], stats["high"], spec.higher_is_better,
                                            min(stats["support"], stats["changed"]))})
        correct_a = {r["id"]: bool(r.get("correct")) for r in base[bench] if "correct" in r}
        correct_b = {r["id"]: bool(r.get("correct")) for r in arm[bench] if "correct" in r}
        shared = sorted(set(correct_a) & set(correct_b))
        if shared:
            test = mcnemar_exact([correct_a[i] for i in shared], [correct_b[i] for i in shared])
            rows.append({"benchmark": bench, "metric": f"{bench}.mcnemar(correct)", "mechanism": None, **test})
    return adjusted(rows, family=family)


#: what :func:`adjusted` corrects together: ``"mechanism"``, the metrics of one cell (a cell
#: is not decided more easily for having several metrics, but a column of 6 cells is decided
#: by chance in 1 - 0.95^6 = 26% of comparisons if its cells were independent, up to 30% if
#: not); ``"arm"``, every mechanism-tagged
#: metric of the comparison (the family-wise error of the whole column, all its cells, held
#: at 5%: a false cell anywhere in an arm's column is what a reader acts on)
FAMILIES = ("mechanism", "arm")


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")


def adjusted(rows: list[dict], alpha: float = 0.05, family: str = "arm") -> list[dict]:
    """``rows`` with the metrics of each family corrected together (Holm 1979, :func:`holm`).

    A cell is decided by *any* of its mechanism's metrics (:func:`cell_verdicts`), and each
    metric's 95% interval alone would let a cell with four metrics read FIXES or BREAKS by
    chance more often than 5% (``python -m evaluators.report.null_check`` measures it). The
    metrics that can reach a verdict (a direction, a p-value, at least :data:`MIN_SUPPORT`
    units read and changed) are grouped by ``family`` (:data:`FAMILIES`): per mechanism, or
    all of the comparison (arm and baseline) together. A metric keeps its interval's verdict
    only where Holm's procedure rejects its bootstrap p-value at ``alpha``; the others read
    *no detectable effect* (``verdict_unadjusted`` keeps what the interval alone said, and
    ``family`` on the corrected metrics which correction was made). Arms are not corrected together: each column is
    its own question (README, "Multiplicity").
    """
    _check_family(family)
    families: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if "verdict" in r:
            r["verdict_unadjusted"] = r["verdict"]
            if r.get("mechanism") and r.get("higher_is_better") is not None and r["verdict"] != "not measured" \
                    and min(r.get("support", 0), r.get("changed", 0)) >= MIN_SUPPORT \
                    and not math.isnan(r.get("p_value", math.nan)):
                r["family"] = family
                families[r["mechanism"] if family == "mechanism" else "arm"].append(r)
    for members in families.values():
        for r, rejected in zip(members, holm([r["p_value"] for r in members], alpha)):
            if not rejected and r["verdict"] in ("fixes", "breaks"):
                r["verdict"] = "no detectable effect"
    return rows


def cell_verdicts(rows: Sequence[dict]) -> dict[str, str]:
    """Mechanism -> fixes / breaks / mixed / no detectable effect / not measured (no metric
    of the mechanism has an interval: none computed, or NaN in every resample)."""
    by: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r.get("mechanism") and r.get("verdict") not in (None, "not measured"):  # NaN: no interval
            by[r["mechanism"]].append(r["verdict"])
    out = {}
    for mechanism in MECHANISMS:
        found = by.get(mechanism)
        if not found:
            out[mechanism] = "not measured"
        elif "fixes" in found and "breaks" in found:
            out[mechanism] = "mixed"
        elif "fixes" in found:
            out[mechanism] = "fixes"
        elif "breaks" in found:
            out[mechanism] = "breaks"
        else:
            out[mechanism] = "no detectable effect"
    return out


def explained_by_control(arm_rows: Sequence[dict], versus_control: Sequence[dict]) -> list[str]:
    """Metrics the arm 'fixes' against its baseline but not against its control: the gain is
    not shown beyond the control's (absence of a detected difference, not equivalence)."""
    beaten = {r["metric"] for r in versus_control if r.get("verdict") == "fixes"}
    return sorted(r["metric"] for r in arm_rows if r.get("verdict") == "fixes" and r["metric"] not in beaten)


def yes_ratio(records: dict[str, list]) -> dict[str, float]:
    """Share of explicit "yes" answers per yes/no benchmark (%)."""
    out = {}
    for bench in YES_NO_BENCHMARKS:
        rows = [r for r in records.get(bench, []) if "pred_yes" in r]
        out[bench] = 100.0 * sum(r["pred_yes"] is True for r in rows) / len(rows) if rows else math.nan
    return out
