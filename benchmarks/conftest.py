"""Benchmarks report ratios against a baseline timed in the same run.

Run deliberately: ``python -m pytest benchmarks --benchmark-enable``. Each benchmark
names its ``group`` (the comparison) and sets ``extra_info["role"]``; the baseline of a
group has role ``"baseline"``. At the end the ratios (median time / baseline median time)
and tokens/s are printed and written to ``benchmarks/results/<group>.json``, means beside
(``results/<device type>/<group>.json`` for a group timed on another device, see ``DEVICE``).

Medians of ``ROUNDS`` rounds: a decoding run of a tiny model takes ~0.1 s, and on a shared
2-core machine a single slow round moved a mean of 3 by 5-10 % (ratios of 1.13 and 1.05
for the same code in two runs), more than the differences the targets are about.

**Paired ratios.** Even medians drift when the baseline's rounds and a mitigation's rounds
run minutes apart (the same code measured 0.95x-1.25x in five runs). The ``paired``
fixture therefore runs one plain ``generate()`` right before every timed round of the
mitigation (in pytest-benchmark's untimed ``setup``, timed by the fixture) and reports the
median of the per-round ratios, ``paired_ratio``: the headline figure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROUNDS = 15
#: where the models run: ``VLM_BENCH_DEVICE`` (default the CPU, the figures docs/performance.md
#: quotes). Benchmarks of a model (the ``organism`` fixture, the 7B-shaped model) run there;
#: the others (span detection, the generic map) stay on the CPU. Each row records its
#: device, and a group timed on another device is written to ``results/<device type>/``.
DEVICE = os.environ.get("VLM_BENCH_DEVICE", "cpu")
RESULTS = Path(__file__).parent / "results"
MODEL_FIXTURES = ("organism", "llava7b")


def device_type(device: str) -> str:
    import torch

    return torch.device(device).type


def skip_unless_device_present() -> None:
    import torch

    if device_type(DEVICE) == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"VLM_BENCH_DEVICE={DEVICE} but no CUDA device is present")


def synchronize() -> None:
    """Wait for the device's queued work, so a timed call is billed all of its own work."""
    import torch

    if device_type(DEVICE) == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize()


@pytest.fixture(autouse=True)
def _record_device(request):
    """Each benchmark's ``extra_info["device"]``: ``DEVICE`` for those that time a model,
    else the CPU."""
    if "benchmark" not in request.fixturenames:
        return
    on_device = any(name in request.fixturenames for name in MODEL_FIXTURES)
    request.getfixturevalue("benchmark").extra_info["device"] = _device_name(DEVICE if on_device else "cpu")


@pytest.fixture(scope="session")
def rounds() -> int:
    """Timed rounds per benchmark (after 2 warm-up rounds): ``ROUNDS``, or the environment's
    ``VLM_BENCH_ROUNDS`` for a ratio near its target (the quartiles of 15 paired rounds on
    this shared machine span about 0.15x)."""
    value = os.environ.get("VLM_BENCH_ROUNDS", str(ROUNDS))
    if not value.isdigit() or int(value) < 3:
        raise ValueError(f"VLM_BENCH_ROUNDS must be an integer >= 3, got {value!r}")
    return int(value)


@pytest.fixture
def paired(benchmark, rounds):
    """``paired(target, baseline, attach=None)``: benchmark ``target`` with ``baseline`` run
    (and timed here) right before each round; ``attach()`` -> handle is called after each
    baseline run and the handle detached before the next, so the baseline runs unmitigated.
    Stores the per-round ratios' median in ``extra_info["paired_ratio"]``."""
    import statistics
    import time

    def measure(target, baseline, attach=None):
        base: list[float] = []
        handle = {"h": None}

        def setup():
            if handle["h"] is not None:
                handle["h"].detach()
                handle["h"] = None
            synchronize()
            start = time.perf_counter()
            baseline()
            synchronize()
            base.append(time.perf_counter() - start)
            if attach is not None:
                handle["h"] = attach()

        def timed():
            result = target()
            synchronize()
            return result

        try:
            out = benchmark.pedantic(timed, setup=setup, rounds=rounds, warmup_rounds=2)
        finally:
            if handle["h"] is not None:
                handle["h"].detach()
        if benchmark.stats is None:  # --benchmark-disable: the target ran once, untimed (a smoke run)
            return out
        timed = benchmark.stats.stats.data[-rounds:]
        ratios = [t / b for t, b in zip(timed, base[-rounds:])]
        benchmark.extra_info.update(paired_ratio=statistics.median(ratios),
                                    paired_baseline_median_s=statistics.median(base[-rounds:]),
                                    paired_ratio_quartiles=statistics.quantiles(ratios, n=4))
        return out

    return measure


@pytest.fixture(scope="session")
def organism():
    """The shipped organism (model, processor) on ``DEVICE``; benchmarks that need it skip
    without it. Benchmarks move their inputs to ``model.device``."""
    import torch

    from evaluators.organism import ORGANISM_DIR, load_organism

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism not trained: python -m evaluators.organism.train")
    skip_unless_device_present()
    torch.set_num_threads(2)
    model, processor = load_organism()
    return model.to(DEVICE), processor


def _device_name(device: str) -> str:
    import torch

    if device_type(device) == "cuda" and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups: dict[str, list] = {}
    for bench in session.benchmarks:
        if bench.stats is None:
            continue
        groups.setdefault(bench.group or "", []).append(bench)
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
            paired = b.extra_info.get("paired_ratio")
            row = {
                "name": b.name, "role": b.extra_info.get("role"), "rounds": len(b.stats.data),
                "median_s": median, "mean_s": mean,
                "paired_ratio": paired, "paired_ratio_quartiles": b.extra_info.get("paired_ratio_quartiles"),
                "ratio_to_baseline": median / base.stats.median, "ratio_of_means": mean / base.stats.mean,
                "tokens_per_s": tokens / median if tokens else None,
                **{k: v for k, v in b.extra_info.items()
                   if k not in ("role", "tokens", "paired_ratio", "paired_ratio_quartiles")},
            }
            rows.append(row)
            shown = f"paired x{paired:.2f}" if paired is not None else "baseline" if b is base else "unpaired"
            write(f"  {b.name:<48} {median:8.3f} s  {shown:<14} (medians x{row['ratio_to_baseline']:.2f})  "
                  f"{row['tokens_per_s'] or 0:8.1f} tok/s")
        device = device_type(str(base.extra_info.get("device", "cpu")).split(" ")[0])
        folder = RESULTS if device == "cpu" else RESULTS / device
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{group}.json").write_text(json.dumps(rows, indent=2) + "\n")
