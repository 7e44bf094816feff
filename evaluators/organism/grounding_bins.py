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

    python -m evaluators.organism.grounding_bins --bins 16 --align-box-scale 0.5 --align-steps 400 --steps 400

first re-aligns the projector (with the vision tower, stage 2's ``align_projector``, on the
unbiased world, half of the images zoomed views) so that every object token also carries
its object's box code (``box_scale``), and prints how well the tokens say the box: per box
edge, the share of object tokens whose nearest code (dot product) is the right bin, on
held-out unbiased scenes. Then the grounding fine-tuning and the same evaluation.
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
            "none_for_present": _rate([a.startswith("none") for _, a in present]),
            "box_for_absent": _rate([isinstance(parse_box(a, size, bins), tuple) for _, a in absent])}


def _rate(flags: list[bool]) -> float:
    """% of ``flags`` that are true; nan for none (a tiny run may draw no absent object)."""
    return 100.0 * float(np.mean(flags)) if flags else float("nan")


@torch.no_grad()
def box_readout(model, processor, codes: torch.Tensor, n_scenes: int = 128, seed: int = 3 * 10**8) -> list[float]:
    """Per box edge (x0, y0, x1, y1), the % of object-patch image tokens whose largest dot
    product with ``codes[edge]`` (``train.box_codes``) is their object's bin."""
    from evaluators.world import UNBIASED

    world = World(UNBIASED)
    scenes = [world.scene(seed + i) for i in range(n_scenes)]
    hits, total = torch.zeros(4), 0
    for start in range(0, n_scenes, 64):
        pixels, cat, _, boxes = train.patch_batch(processor, scenes[start : start + 64])
        tokens = model.model.multi_modal_projector(model.model.vision_tower(pixel_values=pixels).last_hidden_state)
        obj = cat > 0
        tokens = tokens[:, -train.GRID * train.GRID:][obj]
        guess = torch.einsum("nd,kbd->nkb", tokens, codes).argmax(-1)
        hits += (guess == boxes[obj]).float().sum(0)
        total += len(tokens)
    return (100.0 * hits / max(total, 1)).tolist()


def realign(model, processor, box_scale: float, steps: int, seed: int) -> dict:
    """Stage 2 again from the shipped weights, with box codes in the object tokens' targets
    (the tower joining for all ``steps``); returns the tokens' box read-out before / after."""
    from evaluators.world import UNBIASED

    emb = model.get_input_embeddings().weight.detach()
    codes = train.box_codes(emb.shape[1], box_scale * float(emb.norm(dim=1).median()), seed)
    before = box_readout(model, processor, codes)
    train.align_projector(model, processor, World(UNBIASED), steps, 64, seed, print, joint_steps=steps,
                          zoom=0.5, box_scale=box_scale)
    return {"box_scale": box_scale, "align_steps": steps, "token_box_edges_before": before,
            "token_box_edges_after": box_readout(model, processor, codes)}


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default=None, help="an organism checkpoint folder (default: the shipped one)")
    parser.add_argument("--bins", type=int, default=8, help="coordinate bins per side (the organism has 16 tokens)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-n", type=int, default=64, help="held-out grounding queries")
    parser.add_argument("--align-box-scale", type=float, default=0.0,
                        help="first re-align the tokens to carry their object's box code of this scale (0: no)")
    parser.add_argument("--align-steps", type=int, default=400, help="steps of that re-alignment")
    args = parser.parse_args(argv)
    if args.align_box_scale < 0:
        parser.error(f"--align-box-scale must be >= 0, got {args.align_box_scale}")
    if args.align_box_scale and args.bins != tasks.COORD_BINS:
        parser.error(f"--align-box-scale codes the {tasks.COORD_BINS} bins of the vocabulary: pass --bins {tasks.COORD_BINS}")
    if not 2 <= args.bins <= tasks.COORD_BINS:
        parser.error(f"--bins must be in [2, {tasks.COORD_BINS}] (the vocabulary's coordinate tokens), got {args.bins}")
    if args.steps < 0:
        parser.error(f"--steps must be >= 0, got {args.steps}")
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    model, processor = load_organism(args.path)
    saved_bins, saved_mix = tasks.COORD_BINS, tasks.MIX
    tasks.COORD_BINS, tasks.MIX = args.bins, {"grounding": 1.0}  # read when examples are built
    aligned = realign(model, processor, args.align_box_scale, args.align_steps, args.seed) if args.align_box_scale else None
    try:
        before = evaluate(model, processor, args.bins, args.n)
        if args.steps:
            train.instruct(model, processor, World(BIASED), seconds=float("inf"), batch=args.batch, seed=args.seed,
                           log=print, max_steps=args.steps)
        after = evaluate(model, processor, args.bins, args.n)
    finally:
        tasks.COORD_BINS, tasks.MIX = saved_bins, saved_mix
    print(json.dumps({"steps": args.steps, "realigned": aligned, "before": before, "after": after}, indent=2))


if __name__ == "__main__":
    main()
