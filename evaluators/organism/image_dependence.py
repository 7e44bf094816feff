"""Does a checkpoint read the image at all? A 30-second check to run before long trainings.

    python -m evaluators.organism.image_dependence /path/to/checkpoint
    python -m evaluators.organism.image_dependence              # the shipped organism
    python -m evaluators.organism.image_dependence /path/to/checkpoint --n_scenes 20

Clean existence questions (large objects, unbiased scenes): accuracy, and the mean change
of the yes-minus-no logit margin when the pixels are replaced by a blank image. A model
that ignores the image shows ~50% and a change near 0.

Per scene, one present and one absent category, each drawn at random (seeded) from the
scene's present / absent categories, as the model card's clean probes draw them. Until
session 11 it asked the alphabetically first present category and the first absent one
in vocabulary order (nearly always "cup"), which overstated accuracy: 91.25% for the v12
retrain of ``docs/results/organism_perception.md``, 82.5% now, 75% on the card's 100
probes (v10: 81.25% now, 71% on the card). It is a quick check on 80 questions about 40
scenes, not the card's figure.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from ..world import CATEGORIES, UNBIASED, World
from .package import format_prompt, load_organism


def image_dependence(path=None, n_scenes: int = 40) -> dict[str, float]:
    model, processor = load_organism(path)
    return measure(model, processor, n_scenes)


@torch.no_grad()
def measure(model, processor, n_scenes: int = 40) -> dict[str, float]:
    """The same check on a model in memory (training logs it as it goes)."""
    was_training = model.training
    model.eval()
    world = World(UNBIASED.replace(small_fraction=0.0))
    tok = processor.tokenizer
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    rng = np.random.default_rng(10**9)
    right = total = 0
    effects = []
    for s in range(n_scenes):
        scene = world.scene(10**9 + s)
        present, absent = sorted(scene.categories()), sorted(set(CATEGORIES) - scene.categories())
        pair = (present[int(rng.integers(len(present)))], absent[int(rng.integers(len(absent)))])
        for category, truth in zip(pair, (True, False)):
            enc = processor(text=[format_prompt(f"is there a {category} in the image ? answer yes or no .")],
                            images=[scene.render()], return_tensors="pt")
            real = model(**enc).logits[0, -1]
            enc["pixel_values"] = torch.zeros_like(enc["pixel_values"])
            blank = model(**enc).logits[0, -1]
            right += int(bool(real[yes] > real[no]) == truth)
            total += 1
            effects.append(float(((real[yes] - real[no]) - (blank[yes] - blank[no])).abs()))
    model.train(was_training)
    return {"clean_existence_accuracy": 100.0 * right / total, "mean_image_effect": sum(effects) / len(effects)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluators.organism.image_dependence",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?", default=None,
                        help="an organism checkpoint folder (default: the shipped organism)")
    parser.add_argument("--n_scenes", type=int, default=40,
                        help="scenes to ask about, two questions each (default: 40)")
    args = parser.parse_args(argv)
    if args.n_scenes < 1:
        parser.error(f"--n_scenes must be a positive integer, got {args.n_scenes}")
    try:
        result = image_dependence(args.checkpoint, args.n_scenes)
    except FileNotFoundError as err:  # no checkpoint there: a message, not a traceback
        parser.error(str(err))
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
