"""What the organism does with what it was trained on: a held-out score per task of the mix.

    python -m evaluators.organism.skills -n 64

The signatures (:mod:`.signatures`) test the planted failures against matched controls.
This asks the plainer question a user asks first: on held-out seeds of each training task's
own template (:data:`tasks.GENERATORS`, the biased world of instruction tuning, seeds from
:data:`SEED`, which no training stage draws), how often is the greedy answer right? Beside
each task, its **constant baseline**: the score of the best constant answer among the
probes' own true answers (for exact-match tasks, the most frequent one). A task counts as learned when the paired-bootstrap
95% interval of score minus that baseline, over probes, lies above 0; one that does not
is a template the organism was shown but did not learn, and the card says so.

Scoring (our choices; no paper defines these tasks):

* exact match of the answer's words, for every task but these two:
* ``grounding``: a present object's box is right at IoU >= 0.5 with the true box (the
  signature's and HalluSegBench's usual threshold), an absent object's answer must be
  ``none``;
* ``caption``: the F1 of the categories the caption names against those the true list
  names (order and colours aside; exact match beside it), since an object list that misses
  one of six objects is not the same failure as an unrelated one.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np
import torch

from evaluators.world import BIASED, CATEGORIES, World

from ..answers import box_iou, parse_box, words
from ..report.stats import paired_bootstrap
from . import tasks
from .signatures import HELD_OUT, Probe, answer

#: First probe seed: 500 000 past the signatures' probes, far beyond every training seed
#: (stage 3 draws ``seed * 7_000_003 + step * batch + i``, under 10^8 for any recipe here).
SEED = HELD_OUT + 500_000
#: New tokens per answer: a caption lists up to eight "colour category ," items.
MAX_NEW_TOKENS = {"caption": 40}
DEFAULT_NEW_TOKENS = 8
#: What the source scenes are drawn at (``parse_box`` reads bins of this many pixels).
SOURCE_SIZE = 128


def probes(task: str, n: int, seed: int = SEED, world: World | None = None) -> list[Probe]:
    """``n`` held-out examples of ``task`` as probes (truth: the training answer)."""
    if task not in tasks.GENERATORS:
        raise ValueError(f"task must be one of {sorted(tasks.GENERATORS)}, got {task!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    world = world or World(BIASED)
    out = []
    for k in range(n):
        ex = tasks.sample(world, seed + k, task)
        out.append(Probe(ex.images, ex.question, ex.answer, ex.task, dict(ex.meta)))
    return out


def _categories(text: str) -> set[str]:
    return {w for w in words(text) if w in CATEGORIES}


def correct(task: str, truth: str, given: str) -> bool:
    """Whether ``given`` answers a ``task`` probe whose training answer is ``truth``."""
    if task == "grounding":
        box = parse_box(given, SOURCE_SIZE)
        if truth == "none":
            return box == "none"
        return isinstance(box, tuple) and box_iou(box, parse_box(truth, SOURCE_SIZE)) >= 0.5
    return words(given) == words(truth)


def caption_f1(truth: str, given: str) -> float:
    """F1 of the categories ``given`` names against those ``truth`` lists (1.0 when both name none)."""
    want, got = _categories(truth), _categories(given)
    if not want and not got:
        return 1.0
    hit = len(want & got)
    return 0.0 if not hit else 2 * hit / (len(want) + len(got))


def value(task: str, truth: str, given: str) -> float:
    """One probe's score in [0, 1]: :func:`caption_f1` for captions, else :func:`correct`."""
    return caption_f1(truth, given) if task == "caption" else float(correct(task, truth, given))


def score(task: str, rows: list[Probe], answers: list[str]) -> dict:
    """One task's score (percent; exact match, or F1 for captions), its constant-answer
    baseline, and the paired-bootstrap 95% interval of their difference over probes
    (``low``, ``high``): ``learned`` when the interval lies above 0.

    The baseline answer is the best constant among the probes' own true answers (for an
    exact-match task, the most frequent one): what a model that ignores the image and the
    question's details could reach by always saying it."""
    if len(rows) != len(answers):
        raise ValueError(f"{len(rows)} probes but {len(answers)} answers")
    if not rows:
        raise ValueError("no probes to score")
    candidates = sorted(Counter(" ".join(words(p.truth)) if task != "grounding" else p.truth for p in rows).items(),
                        key=lambda kv: -kv[1])
    constant = max((c for c, _ in candidates), key=lambda c: sum(value(task, p.truth, c) for p in rows))
    model_rows = [{"id": k, "v": value(task, p.truth, a)} for k, (p, a) in enumerate(zip(rows, answers))]
    constant_rows = [{"id": k, "v": value(task, p.truth, constant)} for k, p in enumerate(rows)]
    diff = paired_bootstrap(constant_rows, model_rows, lambda rs: 100.0 * float(np.mean([r["v"] for r in rs])))
    result = {"n": len(rows), "metric": "category F1" if task == "caption" else "exact match",
              "score": diff["mitigated"], "baseline": diff["baseline"], "baseline_answer": constant,
              "low": diff["low"], "high": diff["high"], "learned": bool(diff["low"] > 0)}
    if task == "caption":
        result["exact_match"] = 100.0 * float(np.mean([correct(task, p.truth, a) for p, a in zip(rows, answers)]))
    return result


@torch.no_grad()
def measure(model, processor, n: int = 64, seed: int = SEED, only: list[str] | None = None) -> dict[str, dict]:
    """:func:`score` for every task of :data:`tasks.GENERATORS` (or ``only`` these)."""
    names = list(tasks.GENERATORS) if only is None else list(only)
    world = World(BIASED)
    out = {}
    for task in names:
        rows = probes(task, n, seed, world)
        answers = answer(model, processor, rows, max_new_tokens=MAX_NEW_TOKENS.get(task, DEFAULT_NEW_TOKENS))
        out[task] = score(task, rows, answers)
    return out


def table(skills: dict[str, dict]) -> str:
    """The model card's skills table (markdown)."""
    lines = ["| task | held-out score | best constant answer | difference [95% CI] | learned |",
             "|---|---|---|---|---|"]
    for task, r in skills.items():
        metric = "" if r["metric"] == "exact match" else f" ({r['metric']}; exact match {r['exact_match']:.1f})"
        lines.append(f"| {task} | {r['score']:.1f}{metric} | {r['baseline']:.1f} (\"{r['baseline_answer']}\") "
                     f"| {r['score'] - r['baseline']:+.1f} [{r['low']:+.1f}, {r['high']:+.1f}] "
                     f"| {'yes' if r['learned'] else '**no**'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default=None)
    parser.add_argument("-n", type=int, default=64, help="probes per task")
    parser.add_argument("--tasks", default=None, help="comma-separated tasks (default: all of tasks.GENERATORS)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, processor = load_organism(args.path)
    result = measure(model, processor, args.n, only=args.tasks.split(",") if args.tasks else None)
    print(json.dumps(result, indent=2))
    print(table(result))


if __name__ == "__main__":
    main()
