"""Does a checkpoint read the image at all? A 30-second check to run before long trainings.

    python -m evaluators.organism.image_dependence /path/to/checkpoint

Clean existence questions (large objects, unbiased scenes): accuracy, and the mean change
of the yes-minus-no logit margin when the pixels are replaced by a blank image. A model
that ignores the image shows ~50% and a change near 0.
"""

from __future__ import annotations

import sys

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
    right = total = 0
    effects = []
    for s in range(n_scenes):
        scene = world.scene(10**9 + s)
        absent = next(c for c in CATEGORIES if c not in scene.categories())
        for category, truth in ((sorted(scene.categories())[0], True), (absent, False)):
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


if __name__ == "__main__":
    print(image_dependence(sys.argv[1] if len(sys.argv) > 1 else None))
