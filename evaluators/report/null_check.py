"""How often the report decides a cell when no mitigation does anything.

    python -m evaluators.report.null_check -n 80 [--scale small] [--seed 0] [--out null.json]

A cell is decided when *any* of its metrics is (``attribution.cell_verdicts``), and each
arm's column has 6 cells. This measures how often that happens by chance under the report's
correction (``--interval``, ``--family``, the report's defaults unless given): on the real
built-in suites (every benchmark), through the real answer reader, metrics, bootstrap,
correction and verdicts, it draws pairs of simulated answer sets in which the "mitigated"
answers come from the same distribution as the baseline's (an exchangeable null), and counts
the decided cells, all of them false by construction.

The simulated model: each query is answered right with probability
``expit(0.5 + u + e)``, ``u ~ N(0, 1)`` per unit (a DO-Bench scene, a Causal-HalBench pair:
answers within a unit are correlated) and ``e ~ N(0, 1)`` per query; the mitigated arm keeps
the baseline's answer with probability ``keep`` and otherwise draws anew from the same
probability (with ``--effect``, from ``expit(logit + effect)``: a real gain, and the rates
become the correction's power; the table rate then means nothing). A right answer is the query's truth; a wrong one is another valid answer
(:func:`answer`), so nothing is unreadable. The report's small scale has few units per
benchmark, so most metrics fall below ``MIN_SUPPORT`` and the rate depends on the scale.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import time

import numpy as np

BENCHMARKS = ("dobench", "causal_halbench", "mioh", "reactbench", "hallusegbench")
DECIDED = ("fixes", "breaks", "mixed")


def _box(obj: dict) -> str:
    h = obj["size"] / 2
    return f"[{obj['cx'] - h:.0f}, {obj['cy'] - h:.0f}, {obj['cx'] + h:.0f}, {obj['cy'] + h:.0f}]"


def answer(query, right: bool) -> str:
    """A text answer the reader scores right (``right``) or wrong, for a built-in query."""
    kind, truth = query.kind, query.truth
    if kind == "yes_no":
        return truth if right else ("no" if truth == "yes" else "yes")
    if kind == "option":
        return truth if right else next(x for x in "abcdefgh"[: len(query.options)] if x != truth)
    if kind == "number":
        return str(truth) if right else str(int(truth) + 2)
    if kind == "interval":
        low, high = truth
        return str(low) if right else str(high + 3)
    if kind == "choice":
        return truth if right else next(o for o in query.options if o != truth)
    if kind == "keywords":
        return " ".join(truth) if right else " ".join([*truth[:-1], next(o for o in query.options if o not in truth)])
    if kind == "text" and query.benchmark == "causal_halbench":  # a caption (CHAIR, no mechanism)
        return "a " + " and a ".join(query.record["objects"]) if right else "a dog and a knife"
    if kind == "text":  # HalluSegBench: a box for the factual object, "none" where it is absent
        role = query.record["role"]
        scene = query.record["counterfactual_scene" if role == "visual" else "factual_scene"]
        obj = next(o for o in scene["objects"] if o["uid"] == query.record["uid"])
        if role == "fact":
            return _box(obj) if right else "none"
        return "none" if right else _box(obj)
    raise ValueError(f"no simulated answer for a {kind!r} query ({query.id})")


class NullWorld:
    """The built-in queries of ``scale`` with each query's record for a right and a wrong answer."""

    def __init__(self, scale: str = "small", seed: int = 0, benchmarks=BENCHMARKS) -> None:
        from ..benchmarks.suites import build_queries
        from ..query import to_record, unit_of
        from ..runner import flag_invalid

        self.queries = build_queries(list(benchmarks), seed, scale)
        units = [unit_of(q) for q in self.queries]
        order = {u: i for i, u in enumerate(sorted(set(units)))}
        self.unit_index = np.array([order[u] for u in units])
        self.n_units = len(order)
        self.records = {(i, right): flag_invalid(to_record(q, answer(q, right)))
                        for i, q in enumerate(self.queries) for right in (False, True)}
        #: queries with a right/wrong reading whose simulated answers the reader does not score
        #: as meant (must be none; captions and boxes are scored by their metrics, not here)
        self.misread = [q.id for i, q in enumerate(self.queries) if q.kind != "text"
                        and "correct" in self.records[(i, True)]
                        and (self.records[(i, True)]["correct"] is not True
                             or self.records[(i, False)]["correct"] is not False)]

    def arm(self, correct: np.ndarray) -> dict[str, list]:
        from ..runner import metric_records

        by: dict[str, list] = {}
        for i, q in enumerate(self.queries):
            by.setdefault(q.benchmark, []).append(self.records[(i, bool(correct[i]))])
        return {bench: metric_records(bench, rows) for bench, rows in by.items()}

    def draw(self, rng: np.random.Generator, keep: float = 0.6, effect: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(baseline, mitigated) right/wrong per query: under the exchangeable null with
        ``effect`` 0; otherwise the mitigated arm's new draws are right with probability
        ``expit(logit + effect)``, a real effect on every query (to see what a correction
        costs in power)."""
        logit = 0.5 + rng.normal(0, 1, self.n_units)[self.unit_index] + rng.normal(0, 1, len(self.queries))
        p = 1 / (1 + np.exp(-logit))
        base = rng.random(len(p)) < p
        p_mitigated = 1 / (1 + np.exp(-(logit + effect)))
        mitigated = np.where(rng.random(len(p)) >= keep, rng.random(len(p)) < p_mitigated, base)
        return base, mitigated


def run(n: int, scale: str = "small", seed: int = 0, keep: float = 0.6, n_resamples: int = 1000,
        arms_per_table: int = 8, log=print, interval: str = "expanded", family: str = "arm",
        effect: float = 0.0) -> dict:
    """``n`` comparisons (null ones unless ``effect``); the share of arm columns with a decided cell, per cell, and
    what that makes for a table of ``arms_per_table`` arms if the columns were independent
    (they share a baseline in the report, so this is an estimate)."""
    from .attribution import cell_verdicts, compare

    world = NullWorld(scale, seed)
    if world.misread:
        raise RuntimeError(f"the reader does not score the simulated answers as meant: {world.misread[:5]}")
    rng = np.random.default_rng([seed, 2024])
    cells: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    metrics: collections.Counter = collections.Counter()  # which metrics decided, to find a narrow one
    columns_decided, start = 0, time.time()
    for i in range(n):
        base, mitigated = world.draw(rng, keep, effect)
        rows = compare(world.arm(base), world.arm(mitigated), n_resamples=n_resamples, seed=i,
                       interval=interval, family=family)
        verdicts = cell_verdicts(rows)
        for r in rows:
            if r.get("mechanism") and r.get("verdict") in ("fixes", "breaks"):
                metrics[r["metric"]] += 1
        columns_decided += any(v in DECIDED for v in verdicts.values())
        for mechanism, v in verdicts.items():
            cells[mechanism][v] += 1
        if log and (i + 1) % 10 == 0:
            log(f"{i + 1}/{n} comparisons, {time.time() - start:.0f}s")
    column = columns_decided / n
    return {"comparisons": n, "scale": scale, "seed": seed, "keep": keep, "n_resamples": n_resamples,
            "interval": interval, "family": family, "effect": effect,
            "columns_with_a_decided_cell": columns_decided, "column_rate": column,
            f"table_rate_{arms_per_table}_arms_if_independent": 1 - (1 - column) ** arms_per_table,
            "cells": {m: dict(c) for m, c in cells.items()},
            "cell_rates": {m: sum(c[v] for v in DECIDED) / n for m, c in cells.items()},
            "decided_by_metric": dict(metrics.most_common())}


def main(argv: list[str] | None = None) -> int:
    from .attribution import FAMILIES
    from .stats import INTERVALS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=80, help="null comparisons (one arm against its baseline each)")
    parser.add_argument("--scale", default="small")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=float, default=0.6, help="share of answers the null arm keeps")
    parser.add_argument("--effect", type=float, default=0.0,
                        help="logit shift of the mitigated arm's new answers: 0 (default) is the null; a positive "
                             "one is a real gain on every query, and the rates become the correction's power")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--interval", choices=INTERVALS, default="expanded")
    parser.add_argument("--family", choices=FAMILIES, default="arm",
                        help="which metrics Holm's procedure corrects together (attribution.FAMILIES)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.n < 1 or not 0 <= args.keep <= 1:
        parser.error("-n must be >= 1 and --keep in [0, 1]")
    result = run(args.n, args.scale, args.seed, args.keep, args.resamples,
                 log=lambda m: print(m, file=sys.stderr, flush=True), interval=args.interval, family=args.family,
                 effect=args.effect)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "cells"}, indent=2))
    return 0 if not math.isnan(result["column_rate"]) else 1


if __name__ == "__main__":
    sys.exit(main())
