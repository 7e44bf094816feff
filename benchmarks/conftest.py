"""Benchmarks report ratios against a baseline timed in the same run.

Run deliberately: ``python -m pytest benchmarks --benchmark-enable``. Each benchmark
names its ``group`` (the comparison) and sets ``extra_info["role"]``; the baseline of a
group has role ``"baseline"``. At the end the ratios (median time / baseline median time)
and tokens/s are printed and written to ``benchmarks/results/<group>.json``, means beside.

Medians of ``ROUNDS`` rounds: a decoding run of a tiny model takes ~0.1 s, and on a shared
2-core machine a single slow round moved a mean of 3 by 5-10 % (ratios of 1.13 and 1.05
for the same code in two runs), more than the differences the targets are about.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).parent / "results"
ROUNDS = 15


@pytest.fixture(scope="session")
def rounds() -> int:
    """Timed rounds per benchmark (after 2 warm-up rounds)."""
    return ROUNDS


@pytest.fixture(scope="session")
def organism():
    """The shipped organism (model, processor); benchmarks that need it skip without it."""
    import torch

    from evaluators.organism import ORGANISM_DIR, load_organism

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism not trained: python -m evaluators.organism.train")
    torch.set_num_threads(2)
    return load_organism()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups: dict[str, list] = {}
    for bench in session.benchmarks:
        if bench.stats is None:
            continue
        groups.setdefault(bench.group or "", []).append(bench)
    RESULTS.mkdir(exist_ok=True)
    write = terminalreporter.write_line
    for group, benches in sorted(groups.items()):
        base = next((b for b in benches if b.extra_info.get("role") == "baseline"), None)
        if base is None:
            continue
        rows = []
        write(f"\n{group}: ratios against {base.name.split('[')[0]} measured in the same run")
        for b in benches:
            median, mean = b.stats.median, b.stats.mean
            tokens = b.extra_info.get("tokens", 0)
            row = {
                "name": b.name, "role": b.extra_info.get("role"), "rounds": len(b.stats.data),
                "median_s": median, "mean_s": mean,
                "ratio_to_baseline": median / base.stats.median, "ratio_of_means": mean / base.stats.mean,
                "tokens_per_s": tokens / median if tokens else None,
            }
            rows.append(row)
            write(f"  {b.name:<48} {median:8.3f} s  x{row['ratio_to_baseline']:.2f} (means x{row['ratio_of_means']:.2f})  "
                  f"{row['tokens_per_s'] or 0:8.1f} tok/s")
        (RESULTS / f"{group}.json").write_text(json.dumps(rows, indent=2) + "\n")
