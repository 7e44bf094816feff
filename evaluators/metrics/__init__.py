"""The metrics of the five benchmarks, as their papers define them, and a registry.

Each benchmark keeps its metrics beside its loader, in
``evaluators/benchmarks/<name>/metrics.py`` (pure functions over numpy arrays and plain
dict records; no torch); importing this package imports them all and so registers them. Each module's docstring gives the formulas with the
paper's section and equation numbers and every choice made where the paper is silent.

Importing this package registers every metric::

    from evaluators.metrics import get_metric, metrics_for
    get_metric("dobench.prior_robust").fn(records)
    {m.name: m.mechanism for m in metrics_for("mioh")}

Percentages: Causal-HalBench, DO-Bench, ReactBench and MIOH return %, as their papers
print; HalluSegBench returns fractions (IoU, ΔIoU) and unbounded CMS, as its paper prints.
An empty selection gives NaN, never 0.
"""

from .registry import (  # noqa: I001 - the registry first: the benchmark modules import it
    AGGREGATIONS, BENCHMARKS, MECHANISMS, MetricSpec, UnknownMetricError, all_metrics, get_metric, metric, metric_names,
    metrics_by_mechanism, metrics_for,
)
from ..benchmarks.causal_halbench import metrics as causal_halbench
from ..benchmarks.dobench import metrics as dobench
from ..benchmarks.hallusegbench import metrics as hallusegbench
from ..benchmarks.mioh import metrics as mioh
from ..benchmarks.reactbench import metrics as reactbench

__all__ = [
    "AGGREGATIONS", "BENCHMARKS", "MECHANISMS", "MetricSpec", "UnknownMetricError", "all_metrics", "causal_halbench", "dobench",
    "get_metric", "hallusegbench", "metric", "metric_names", "metrics_by_mechanism", "metrics_for", "mioh",
    "reactbench",
]
