"""A typed registry of the benchmark metrics.

Every registered metric is a function ``fn(records, **options) -> float`` over a list of
per-sample records (plain dicts; see each benchmark module for the fields it reads) and is
tagged with the benchmark it belongs to, the hallucination *mechanism* it measures, whether
higher is better and how it aggregates samples::

    @metric("dobench.prior_robust", benchmark="dobench", mechanism="language_prior",
            higher_is_better=True, aggregation="trapezoid_auc")
    def prior_robust(records): ...

    get_metric("dobench.prior_robust").fn(records)
    [m.name for m in metrics_for("dobench")]

Names are ``"<benchmark>.<metric>"``. :func:`get_metric` also accepts the bare metric name
when it is unique across benchmarks (``"prior_robust"``), case-insensitively, and answers an
unknown name with the closest known names (:mod:`difflib`) and the full list.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

MECHANISMS: tuple[str, ...] = (
    "language_prior",     # text prior overrides the image (DO-Bench PriorRobust, MIOH LC-S/LC-I, ReactBench CA)
    "cooccurrence",       # co-occurring objects are completed (Causal-HalBench, MIOH HN, ReactBench RE)
    "perception",         # the evidence is there but not seen (DO-Bench PerceptionAbility, MIOH HP, ReactBench DC)
    "vision_grounding",   # a mask follows the scene, not the object (HalluSegBench ΔIoU_visual, CMS_counterfact)
    "label_grounding",    # a mask follows the image, not the label (HalluSegBench ΔIoU_textual, CMS_fact)
    "multi_image",        # errors that several images add (MIOH NI, ReactBench Alteration Tracing)
)

BENCHMARKS: tuple[str, ...] = ("hallusegbench", "causal_halbench", "dobench", "reactbench", "mioh")

# How a metric turns samples into one number.
AGGREGATIONS: tuple[str, ...] = (
    "per_sample_mean",  # score each sample, then average (HalluSegBench mIoU-style, CMS)
    "pooled",           # one ratio over all samples of the selection (accuracy, rates, CHAIR)
    "difference",       # difference of two pooled accuracies (CAC, AAC)
    "weighted_sum",     # fixed weights over sub-scores (ReactBench S_t^m, React-Score)
    "trapezoid_auc",    # normalised area under a rate curve (DO-Bench PriorRobust)
    "macro_mean",       # unweighted mean of per-group scores
)


@dataclass(frozen=True)
class MetricSpec:
    """One registered metric. ``higher_is_better`` is None for a rate with no preferred
    direction (e.g. DO-Bench's yes-rate)."""

    name: str
    benchmark: str
    mechanism: str | None
    higher_is_better: bool | None
    fn: Callable[..., float]
    doc: str
    aggregation: str

    def __call__(self, records, **options) -> float:
        return self.fn(records, **options)


_REGISTRY: dict[str, MetricSpec] = {}


def _check_choice(value: str, choices: tuple[str, ...], argument: str) -> str:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{argument}: unknown value {value!r}.{hint} Known: {list(choices)}")
    return value


def metric(name: str, benchmark: str, mechanism: str | None, higher_is_better: bool | None,
           aggregation: str) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Register ``fn`` under ``name``; the function itself is returned unchanged."""
    _check_choice(benchmark, BENCHMARKS, "benchmark")
    if mechanism is not None:
        _check_choice(mechanism, MECHANISMS, "mechanism")
    _check_choice(aggregation, AGGREGATIONS, "aggregation")
    if not name.startswith(benchmark + "."):
        raise ValueError(f"name: {name!r} must start with {benchmark + '.'!r}")
    if higher_is_better not in (True, False, None):
        raise TypeError(f"higher_is_better must be a bool or None, got {higher_is_better!r}")

    def register(fn: Callable[..., float]) -> Callable[..., float]:
        old = _REGISTRY.get(name)
        # Re-registering the same function (a module reload) replaces it; a clash does not.
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"metric {name!r} is already registered by {old.fn.__module__}.{old.fn.__qualname__}")
        doc = (fn.__doc__ or "").strip()
        _REGISTRY[name] = MetricSpec(name, benchmark, mechanism, higher_is_better, fn, doc, aggregation)
        return fn

    return register


def metric_names() -> list[str]:
    return sorted(_REGISTRY)


def all_metrics() -> list[MetricSpec]:
    return [_REGISTRY[n] for n in metric_names()]


class UnknownMetricError(KeyError):
    """An unknown or ambiguous metric name; the message lists close and known names."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


def _squash(name: str) -> str:
    """Lower case without separators: "PriorRobust", "prior_robust", "prior-robust" agree."""
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


def get_metric(name: str) -> MetricSpec:
    """The metric called ``name``: exact, else ignoring case and separators
    ("DOBench.PriorRobust"), else a bare name that is unique across benchmarks
    ("prior_robust"). Otherwise :class:`UnknownMetricError` (a KeyError) naming the closest
    known metrics and listing all of them."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    wanted = _squash(name)
    for known in _REGISTRY:
        if _squash(known) == wanted:
            return _REGISTRY[known]
    bare = [known for known in _REGISTRY if _squash(known.split(".", 1)[1]) == wanted]
    if len(bare) == 1:
        return _REGISTRY[bare[0]]
    known = metric_names()
    if len(bare) > 1:
        raise UnknownMetricError(f"metric {name!r} is ambiguous: {bare}; use the full name")
    # Compare against full and bare names alike, then map the matches back to full names.
    lookup = {_squash(k): k for k in known}
    for k in known:
        lookup.setdefault(_squash(k.split(".", 1)[1]), k)
    close: list[str] = []
    for match in difflib.get_close_matches(wanted, list(lookup), n=5, cutoff=0.6):
        if lookup[match] not in close:
            close.append(lookup[match])
    hint = f" Did you mean {', '.join(repr(c) for c in close[:3])}?" if close else ""
    raise UnknownMetricError(f"unknown metric {name!r}.{hint} Known metrics: {known}")


def metrics_for(benchmark: str) -> list[MetricSpec]:
    """All metrics of one benchmark, sorted by name."""
    _check_choice(benchmark, BENCHMARKS, "benchmark")
    return [spec for spec in all_metrics() if spec.benchmark == benchmark]


def metrics_by_mechanism(mechanism: str) -> list[MetricSpec]:
    """All metrics, across benchmarks, that measure ``mechanism``."""
    _check_choice(mechanism, MECHANISMS, "mechanism")
    return [spec for spec in all_metrics() if spec.mechanism == mechanism]


__all__ = [
    "AGGREGATIONS", "BENCHMARKS", "MECHANISMS", "MetricSpec", "UnknownMetricError", "all_metrics", "get_metric",
    "metric", "metric_names", "metrics_by_mechanism", "metrics_for",
]
