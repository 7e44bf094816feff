"""Where a checkpoint's clean existence accuracy loses its points. A two-minute check.

    python -m evaluators.organism.perception_probe [/path/to/checkpoint] [-n 200] [--scenes 256]

The model card's clean existence probes (``signatures.build_probes``, group
``clean_existence``) use large objects in ``UNBIASED`` scenes: random context, no
co-occurrence, and uniform colours. Most bananas, trees and plates in them are therefore
not in the colour the biased training world nearly always gives them. This probe splits
the card's accuracy by what each probe depends on:

* ``existence``: accuracy of the card's clean probes, split by present / absent, by whether
  the asked category has a dominant colour in ``BIASED`` (and, when present, whether the
  object has that colour), and by whether the category is typical of the scene's context;
* ``token_naming``: on the object patches of ``--scenes`` unbiased large-object scenes,
  the share of image tokens whose nearest word embedding (cosine) is their own category
  (the measure of ``train.align_projector``), split by dominant-colour category and
  colour. If a category is named far less often in an unusual colour, the colour prior
  sits in the image path, before the decoder reads anything.

Findings are in ``docs/results/organism_perception.md``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from ..answers import parse_yes_no
from ..world import BIASED, CATEGORIES, COLOURS, UNBIASED, World
from . import ORGANISM_DIR
from .signatures import answer, build_probes

DOMINANT = {c: colour for c, (colour, _) in BIASED.dominant_colour.items()}
CLEAN = UNBIASED.replace(small_fraction=0.0)  # the card's clean scenes


def _rate(tally: dict) -> dict:
    return {k: {"correct": c, "n": n, "percent": round(100.0 * c / n, 1)} for k, (c, n) in sorted(tally.items())}


@torch.no_grad()
def existence(model, processor, n: int = 200) -> dict:
    """The card's clean existence probes (``n`` of them), accuracy per kind of probe."""
    probes = [p for p in build_probes(n) if p.group == "clean_existence"]
    answers = answer(model, processor, probes)
    world = World(CLEAN)
    by_colour, by_context = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    for probe, text in zip(probes, answers):
        scene = world.scene(probe.meta["scene_seed"])
        cat, present = probe.meta["category"], probe.truth == "yes"
        right = int(parse_yes_no(text) == (probe.truth == "yes"))  # as signatures.score counts it
        if cat not in DOMINANT:
            kind = "no dominant colour"
        elif not present:
            kind = "banana / tree / plate"
        else:
            usual = any(o.category == cat and o.colour == DOMINANT[cat] for o in scene.objects)
            kind = f"banana / tree / plate, {'usual' if usual else 'other'} colour"
        typical = BIASED.context_weights[scene.context].get(cat, 0.0) >= 1.0
        for tally, key in ((by_colour, f"{'present' if present else 'absent'}: {kind}"),
                           (by_context, f"{'present' if present else 'absent'}: {'typical' if typical else 'atypical'} of the context")):
            tally[key][0] += right
            tally[key][1] += 1
    total = sum(right for right, _ in by_colour.values())
    return {"accuracy": round(100.0 * total / len(probes), 1), "n": len(probes),
            "by_colour": _rate(by_colour), "by_context": _rate(by_context)}


@torch.no_grad()
def token_naming(model, processor, n_scenes: int = 256, batch: int = 64) -> dict:
    """Share of object-patch image tokens nearest (cosine) to their own category's word."""
    from .train import GRID, patch_batch

    emb = model.get_input_embeddings().weight.detach()
    words = torch.tensor(processor.tokenizer.convert_tokens_to_ids(list(CATEGORIES)))
    targets = torch.nn.functional.normalize(emb[words], dim=-1)
    names, colours = list(CATEGORIES), list(COLOURS)
    world = World(CLEAN)
    scenes = [world.scene(3 * 10**8 + i) for i in range(n_scenes)]
    tally = defaultdict(lambda: [0, 0])
    for start in range(0, n_scenes, batch):
        pixels, cat, col, _ = patch_batch(processor, scenes[start : start + batch])
        tokens = model.model.multi_modal_projector(model.model.vision_tower(pixel_values=pixels).last_hidden_state)
        tokens = torch.nn.functional.normalize(tokens[:, -GRID * GRID :], dim=-1)
        named = (tokens @ targets.T).argmax(-1) + 1  # category ids start at 1 (0 = background)
        obj = cat > 0
        for c, k, guess in zip(cat[obj].tolist(), col[obj].tolist(), named[obj].tolist()):
            name, colour = names[c - 1], colours[k - 1]
            if name in DOMINANT:
                key = f"banana / tree / plate, {'usual' if DOMINANT[name] == colour else 'other'} colour"
            else:
                key = "other categories"
            tally[key][0] += int(guess == c)
            tally[key][1] += 1
    return _rate(tally)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", type=Path, default=ORGANISM_DIR)
    parser.add_argument("-n", type=int, default=200, help="clean existence probes (the card uses 100)")
    parser.add_argument("--scenes", type=int, default=256, help="scenes for the token-naming check")
    args = parser.parse_args(argv)
    if args.n < 2 or args.scenes < 1:
        parser.error(f"-n must be >= 2 and --scenes >= 1, got {args.n} and {args.scenes}")
    from . import load_organism

    torch.set_num_threads(2)
    model, processor = load_organism(args.path)
    print(json.dumps({"existence": existence(model, processor, args.n),
                      "token_naming": token_naming(model, processor, args.scenes)}, indent=1))


if __name__ == "__main__":
    main()
