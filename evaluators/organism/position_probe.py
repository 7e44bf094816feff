"""Do a checkpoint's image tokens say *where* they are? A one-minute check behind grounding.

    python -m evaluators.organism.position_probe [/path/to/checkpoint] [-n 200]

A box answer needs the position of the patches the question's object covers, and the
decoder can only copy into its output what the image tokens' *values* carry: rotary
positions shape which tokens attend to which, not what an attended token contributes.
This probe fits a ridge-regularised linear read-out of each patch's grid column and row
(one-hot, 8 classes each for the organism's 8x8 grid) on three quarters of the images and
reports its held-out accuracy at each stage of the image path: the vision tower's embedding
output, its last hidden layer (what LLaVA feeds the projector here,
``vision_feature_layer=-1``), and the projected image tokens the decoder sees. Chance is
``1 / grid``.

What it found on organism v10 (the default 200 scenes): column / row accuracy 97.4 / 98.6% at
the embeddings, 75.0 / 78.5% at the tower's last layer, 15.0 / 20.9% after the projector
-- the projector's alignment target (``emb(category) + emb(colour)`` per patch, see
:func:`evaluators.organism.train.align_projector`) holds no position, so stage 2 erases
it, and the decoder cannot learn boxes (grounding IoU >= 0.5: 0% in the model card).
Position-free patch tokens are this organism's limitation, not a property of real
VLMs, whose projected CLIP tokens keep position information.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from ..world import BIASED, World
from .package import load_organism


def _readout_accuracy(features: torch.Tensor, labels: torch.Tensor, n_train: int, ridge: float = 1e-2) -> float:
    """Held-out accuracy of a ridge-regression one-hot read-out (closed form, float64)."""
    x = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], 1)
    y = torch.nn.functional.one_hot(labels, int(labels.max()) + 1).double()
    a, b = x[:n_train], y[:n_train]
    w = torch.linalg.solve(a.T @ a + ridge * torch.eye(x.shape[1], dtype=x.dtype), a.T @ b)
    return float(((x[n_train:] @ w).argmax(1) == labels[n_train:]).double().mean())


@torch.no_grad()
def measure(model, processor, n_images: int = 200, seed: int = 10**9 + 5_000) -> dict[str, dict[str, float]]:
    """Per stage (``embeddings``, ``tower_last``, ``projected``), the held-out accuracy (%)
    of a linear read-out of each patch's grid ``column`` and ``row``; ``chance`` too."""
    if n_images < 8:
        raise ValueError(f"n_images must be >= 8 (a quarter is held out), got {n_images}")
    vision_config = model.config.vision_config
    grid = vision_config.image_size // vision_config.patch_size
    patches = grid * grid
    world = World(BIASED)
    images = [world.scene(seed + i).render() for i in range(n_images)]
    pixels = processor.image_processor(images, return_tensors="pt")["pixel_values"]
    tower = model.model.vision_tower(pixel_values=pixels, output_hidden_states=True)
    projected = model.model.multi_modal_projector(tower.hidden_states[model.config.vision_feature_layer])
    stages = {"embeddings": tower.hidden_states[0], "tower_last": tower.hidden_states[-1], "projected": projected}
    index = torch.arange(patches).repeat(n_images)
    labels = {"column": index % grid, "row": index // grid}
    n_train = (3 * n_images // 4) * patches
    result = {}
    for name, feats in stages.items():
        feats = feats[:, -patches:].reshape(-1, feats.shape[-1])  # the patch tokens (CLS, if any, first)
        result[name] = {axis: round(100.0 * _readout_accuracy(feats, lab, n_train), 1) for axis, lab in labels.items()}
    result["chance"] = round(100.0 / grid, 1)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default=None, help="checkpoint directory (default: the shipped organism)")
    parser.add_argument("-n", type=int, default=200, help="number of scenes (a quarter held out)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    np.random.seed(0)
    model, processor = load_organism(args.path)
    print(measure(model.eval(), processor, args.n))


if __name__ == "__main__":
    main()
