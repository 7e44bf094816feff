"""Decoding configurations side by side on the organism's signature probes.

    python -m evaluators.organism.compare -n 60 --out docs/results/vcd_controls.md

The controls contrastive decoding needs (arXiv 2504.10020): greedy and sampling
baselines, the plausibility constraint alone, and the yes-ratio beside every row. Each
configuration answers the *same* probes. This is the interim effect table; the paired
report with confidence intervals is the evaluators' job (issue 8).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

import torch

from mitigate import VCD, Plausibility, PriorSuppression, attach

from ..report.attribution import SAMPLING
from .signatures import answer, build_probes, score


ROWS = (
    ("yes-ratio (all yes/no probes)", "yes_ratio"),
    ("clean existence accuracy", "clean_existence_accuracy"),
    ("co-occurrence false yes: cue / control", ("cooccurrence_false_yes_cue", "cooccurrence_false_yes_control")),
    ("contextual prior false no, level 0 / 3", ("prior_false_no_by_level", 0, 3)),
    ("small objects false no: Full / Crop", ("small_false_no_full", "small_false_no_crop")),
    ("colour accuracy: consistent / recoloured", ("colour_accuracy_consistent", "colour_accuracy_counterfactual")),
    ("grounding IoU>=0.5 / boxes for absent", ("grounding_iou50_rate", "grounding_boxes_for_absent_expected")),
)


def configurations(tokenizer) -> dict[str, tuple[Callable[[], list], dict]]:
    return {
        "greedy": (lambda: [], {}),
        "sampling": (lambda: [], SAMPLING),
        "plausibility only, sampling": (lambda: [Plausibility(0.1)], SAMPLING),
        "VCD, greedy": (lambda: [VCD()], {}),
        "VCD, sampling": (lambda: [VCD()], SAMPLING),
        "prior suppression (context), greedy": (lambda: [PriorSuppression(tokenizer, mode="context")], {}),
        "prior suppression (output), greedy": (lambda: [PriorSuppression(mode="output")], {}),
    }


def _cell(result: dict, key) -> str:
    if isinstance(key, str):
        return f"{result[key]:.1f}"
    if isinstance(key[1], int):
        values = result[key[0]]
        return " / ".join(f"{values[i]:.1f}" for i in key[1:])
    return " / ".join(f"{result[k]:.1f}" for k in key)


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=60, help="probes per group")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, processor = load_organism()
    probes = build_probes(args.n)
    results, seconds = {}, {}
    for name, (make, kwargs) in configurations(processor.tokenizer).items():
        torch.manual_seed(args.seed)
        start = time.perf_counter()
        mitigations = make()
        if mitigations:
            with attach(model, *mitigations):
                answers = answer(model, processor, probes, batch_size=32, **kwargs)
        else:
            answers = answer(model, processor, probes, batch_size=32, **kwargs)
        seconds[name] = time.perf_counter() - start
        results[name] = score(probes, answers)
        print(f"{name}: {seconds[name]:.0f}s", flush=True)
    names = list(results)
    lines = [f"| metric (%) | {' | '.join(names)} |", "|---" * (len(names) + 1) + "|"]
    for label, key in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(results[n], key) for n in names) + " |")
    base = seconds["greedy"]
    lines.append("| wall-clock vs greedy | " + " | ".join(f"{seconds[n] / base:.2f}x" for n in names) + " |")
    table = "\n".join(lines)
    header = (f"Organism signature probes, {args.n} per group (held-out seeds), same probes for every column; "
              f"sampling: temperature 1, no top-k/top-p, seed {args.seed}. "
              f"Command: `python -m evaluators.organism.compare -n {args.n}`.\n\n")
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(header + table + "\n")


if __name__ == "__main__":
    main()
