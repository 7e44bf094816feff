"""Does a coarser coordinate grid let the organism ground? (issue 3, the grounding target)

    python -m evaluators.organism.grounding_bins --bins 8 --steps 400

The shipped organism answers "none" to every grounding query ("where is the dog ?" ->
``<c3> <c5> <c9> <c12>`` or "none"; ``docs/results/organism_position.md``). Its 16 bins
split the 64 px input into 4 px steps, finer than its 8 x 8 patch grid can say, so a box's
first token spreads over 16 values and never beats the one-token "none". This fine-tunes a
copy of the shipped checkpoint on grounding examples only (``train.instruct`` with a
grounding-only mix, the decoder trained, vision tower, projector and embeddings frozen, as
in stage 3), with boxes quantised to ``--bins`` bins, then asks held-out scenes (seeds from
10^8, never trained on) and prints, for present objects: the share of greedy answers with
IoU >= 0.5 against the true box, the mean IoU, and the share answered "none"; for absent
ones: the share that got a box. The weights are not saved.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from evaluators.answers import box_iou, parse_box
from evaluators.world import BIASED, World

from . import tasks, train
from .signatures import Probe, answer


def evaluate(model, processor, bins: int, n: int = 64, seed: int = 10**8) -> dict:
    """Greedy grounding answers on ``n`` held-out scenes, scored with ``bins`` bins."""
    world, rng = World(BIASED), np.random.default_rng([seed, 5])
    examples = [tasks.grounding(world, rng, seed + i) for i in range(n)]
    answers = answer(model, processor, [Probe(e.images, e.question, e.answer, "grounding") for e in examples])
    present = [(e, a) for e, a in zip(examples, answers) if e.answer != "none"]
    absent = [(e, a) for e, a in zip(examples, answers) if e.answer == "none"]
    size = examples[0].images[0].width
    ious = []
    for e, a in present:
        got, want = parse_box(a, size, bins), parse_box(e.answer, size, bins)
        ious.append(box_iou(got, want) if isinstance(got, tuple) and isinstance(want, tuple) else 0.0)
    return {"bins": bins, "present": len(present), "absent": len(absent),
            "iou50_rate": 100.0 * float(np.mean([v >= 0.5 for v in ious])) if ious else float("nan"),
            "mean_iou": float(np.mean(ious)) if ious else float("nan"),
            "none_for_present": 100.0 * float(np.mean([a.startswith("none") for _, a in present])),
            "box_for_absent": 100.0 * float(np.mean([isinstance(parse_box(a, size, bins), tuple) for _, a in absent]))}


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bins", type=int, default=8, help="coordinate bins per side (the organism has 16 tokens)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-n", type=int, default=64, help="held-out grounding queries")
    args = parser.parse_args(argv)
    if not 2 <= args.bins <= tasks.COORD_BINS:
        parser.error(f"--bins must be in [2, {tasks.COORD_BINS}] (the vocabulary's coordinate tokens), got {args.bins}")
    if args.steps < 0:
        parser.error(f"--steps must be >= 0, got {args.steps}")
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    model, processor = load_organism()
    saved_bins, saved_mix = tasks.COORD_BINS, tasks.MIX
    tasks.COORD_BINS, tasks.MIX = args.bins, {"grounding": 1.0}  # read when examples are built
    try:
        before = evaluate(model, processor, args.bins, args.n)
        if args.steps:
            train.instruct(model, processor, World(BIASED), seconds=float("inf"), batch=args.batch, seed=args.seed,
                           log=print, max_steps=args.steps)
        after = evaluate(model, processor, args.bins, args.n)
    finally:
        tasks.COORD_BINS, tasks.MIX = saved_bins, saved_mix
    print(json.dumps({"steps": args.steps, "before": before, "after": after}, indent=2))


if __name__ == "__main__":
    main()
