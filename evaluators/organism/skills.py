"""What the organism does with what it was trained on: a held-out score per task of the mix.

    python -m evaluators.organism.skills -n 64

The signatures (:mod:`.signatures`) test the planted failures against matched controls.
This asks the plainer question a user asks first: on held-out seeds of each training task's
own template (:data:`tasks.GENERATORS` on the biased world, seeds from :data:`SEED`, which
no training stage draws; the module's default shares, so without stage 3's
``--context-breaking`` and ``--unbiased-existence`` scenes: harder existence questions
than the card's clean ones), how often is the greedy answer right? Beside each task, its
**baseline without the image**: the better of the best constant answer and, for questions
with a belief sentence, that sentence's own answer (:func:`score`). A task counts as
learned when the paired-bootstrap 95% interval of score minus baseline, over probes, lies
above 0. One that does not is "not shown": at this sample size the organism does not beat
an answer that ignores the image, so benchmarks resting on it say little about a
mitigation on this organism.

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
    out, k = [], 0
    while len(out) < n:  # a template that falls back to another task (relation without two single objects) is skipped
        ex = tasks.sample(world, seed + k, task)
        k += 1
        if ex.task == task:
            out.append(Probe(ex.images, ex.question, ex.answer, ex.task, dict(ex.meta)))
    return out


def belief_answer(probe: Probe) -> str | None:
    """What a prior-existence probe's belief sentence says ("yes"/"no"), None for other probes:
    the answer of a model that reads the sentence and not the image."""
    if "belief_right" not in probe.meta:
        return None
    truth = words(probe.truth) == ["yes"]
    return "yes" if truth == bool(probe.meta["belief_right"]) else "no"


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


def _constants(task: str, rows: list[Probe]) -> list[str]:
    """Constant answers to try: every true answer among the probes and, for captions, the
    k most frequent categories for every k (a list that names many categories can beat any
    single true caption on F1)."""
    found = Counter(" ".join(words(p.truth)) if task != "grounding" else p.truth for p in rows)
    out = [c for c, _ in found.most_common()]
    if task == "caption":
        frequency = Counter(c for p in rows for c in sorted(_categories(p.truth)))
        ranked = [c for c, _ in frequency.most_common()]
        out += [" ".join(ranked[:k]) for k in range(1, len(ranked) + 1)]
    return out


def score(task: str, rows: list[Probe], answers: list[str]) -> dict:
    """One task's score (percent; exact match, or F1 for captions), its baseline, and the
    paired-bootstrap 95% interval of their difference over probes (``low``, ``high``):
    ``learned`` when the interval lies above 0.

    The baseline is the better of two answers that need no image: the best constant answer
    (:func:`_constants`; for an exact-match task, the most frequent true answer), and, for
    prior-existence probes, the belief sentence's own answer (:func:`belief_answer`), since
    the belief is right most of the time in training and a model may just follow it."""
    if len(rows) != len(answers):
        raise ValueError(f"{len(rows)} probes but {len(answers)} answers")
    if not rows:
        raise ValueError("no probes to score")
    candidates = {f'constant "{c}"': [c] * len(rows) for c in _constants(task, rows)}
    beliefs = [belief_answer(p) for p in rows]
    if all(b is not None for b in beliefs):
        candidates["the belief sentence's answer"] = beliefs
    totals = {name: sum(value(task, p.truth, a) for p, a in zip(rows, given)) for name, given in candidates.items()}
    baseline = max(candidates, key=lambda name: totals[name])  # ties: the first (most frequent constant)
    model_rows = [{"id": k, "v": value(task, p.truth, a)} for k, (p, a) in enumerate(zip(rows, answers))]
    base_rows = [{"id": k, "v": value(task, p.truth, a)} for k, (p, a) in enumerate(zip(rows, candidates[baseline]))]
    diff = paired_bootstrap(base_rows, model_rows, lambda rs: 100.0 * float(np.mean([r["v"] for r in rs])))
    result = {"n": len(rows), "metric": "category F1" if task == "caption" else "exact match",
              "score": diff["mitigated"], "baseline": diff["baseline"], "baseline_answer": baseline,
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
    lines = ["| task | held-out score | baseline without the image (its answer) | difference [95% CI] | learned |",
             "|---|---|---|---|---|"]
    for task, r in skills.items():
        metric = "" if r["metric"] == "exact match" else f" ({r['metric']}; exact match {r['exact_match']:.1f})"
        lines.append(f"| {task} | {r['score']:.1f}{metric} | {r['baseline']:.1f} ({r['baseline_answer']}) "
                     f"| {r['score'] - r['baseline']:+.1f} [{r['low']:+.1f}, {r['high']:+.1f}] "
                     f"| {'yes' if r['learned'] else '**not shown**'} |")
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
