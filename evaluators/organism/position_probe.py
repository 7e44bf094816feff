"""Do a checkpoint's image tokens say *where* they are? A one-minute check behind grounding.

    python -m evaluators.organism.position_probe [/path/to/checkpoint] [-n 200]

A box answer needs the position of the patches the question's object covers, and the
decoder can only copy into its output what the image tokens' *values* carry: rotary
positions shape which tokens attend to which, not what an attended token contributes.
This probe fits a ridge-regularised linear read-out of each patch's grid column and row
(one-hot, 8 classes each for the organism's 8x8 grid) on three quarters of the images and
reports its held-out accuracy at each stage of the image path -- the vision tower's
embedding output, its last hidden layer (what LLaVA feeds the projector here,
``vision_feature_layer=-1``), and the projected image tokens the decoder sees -- over all
patches and over the patches an object covers (the ones a box answer must read). Chance is
``1 / grid``.

What it found on organism v10 (the default 200 scenes), column / row accuracy:

=============  ===========  ===========
stage          all patches  object patches
=============  ===========  ===========
embeddings     97.4 / 98.6  87.7 / 93.8
tower, last    75.0 / 78.5  19.5 / 22.9
projected      15.0 / 20.9  13.4 / 19.0
=============  ===========  ===========

Stage 1 (:func:`evaluators.organism.train.pretrain_vision`) trains the tower on each
patch's category and colour only, and on the patches an object covers its last layer
trades position for those labels; stage 2's target (``emb(category) + emb(colour)``,
:func:`~evaluators.organism.train.align_projector`) has no position either, so the
background patches' position is dropped too. The decoder has nothing to copy into a box
(grounding IoU >= 0.5: 0% in the model card): position-free patch tokens are this
organism's limitation, not a property of real VLMs, whose CLIP tokens keep position. A
re-alignment of v10's stage 2 with a per-patch position code added to its target (session
9, 400 joint steps) left the residual at the code's energy, as the object row predicts. The recipe's
``--vision-position-weight`` and ``--align-position-scale`` keep position from stage 1
on: the projected object-patch tokens then read 99.7 / 99.5%, yet that retrain still
answered "none" to every grounding probe (``docs/results/organism_position.md``).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from ..world import BIASED, World
from .package import load_organism
from .train import patch_labels


def _readout_accuracy(features: torch.Tensor, labels: torch.Tensor, n_train: int, ridge: float = 1e-2) -> float:
    """Held-out accuracy of a ridge-regression one-hot read-out (closed form, float64)."""
    x = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], 1)
    y = torch.nn.functional.one_hot(labels, int(labels.max()) + 1).double()
    a, b = x[:n_train], y[:n_train]
    w = torch.linalg.solve(a.T @ a + ridge * torch.eye(x.shape[1], dtype=x.dtype), a.T @ b)
    return float(((x[n_train:] @ w).argmax(1) == labels[n_train:]).double().mean())


@torch.no_grad()
def measure(model, processor, n_images: int = 200, seed: int = 10**9 + 5_000) -> dict:
    """Per stage (``embeddings``, ``tower_last``, ``projected``) and patch set (``all``
    patches; ``object``: those an object covers, :func:`evaluators.organism.train.patch_labels`),
    the held-out accuracy (%) of a linear read-out of each patch's grid ``column`` and
    ``row``; ``chance`` too. Read-outs are fitted per patch set."""
    if n_images < 8:
        raise ValueError(f"n_images must be >= 8 (a quarter is held out), got {n_images}")
    vision_config = model.config.vision_config
    grid = vision_config.image_size // vision_config.patch_size
    patches = grid * grid
    world = World(BIASED)
    scenes = [world.scene(seed + i) for i in range(n_images)]
    pixels = processor.image_processor([s.render() for s in scenes], return_tensors="pt")["pixel_values"]
    tower = model.model.vision_tower(pixel_values=pixels, output_hidden_states=True)
    projected = model.model.multi_modal_projector(tower.hidden_states[model.config.vision_feature_layer])
    stages = {"embeddings": tower.hidden_states[0], "tower_last": tower.hidden_states[-1], "projected": projected}
    index = torch.arange(patches).repeat(n_images)
    covered = torch.from_numpy(np.concatenate([patch_labels(s)[0] for s in scenes]) > 0)
    # the first three quarters of the images train the read-out, the last quarter tests it
    in_train = torch.arange(n_images).repeat_interleave(patches) < 3 * n_images // 4
    result: dict = {}
    for name, feats in stages.items():
        feats = feats[:, -patches:].reshape(-1, feats.shape[-1])  # the patch tokens (CLS, if any, first)
        result[name] = {}
        for subset, keep in (("all", torch.ones_like(covered)), ("object", covered)):
            order = torch.cat([torch.nonzero(keep & in_train)[:, 0], torch.nonzero(keep & ~in_train)[:, 0]])
            n_train = int((keep & in_train).sum())
            result[name][subset] = {
                axis: round(100.0 * _readout_accuracy(feats[order], lab[order], n_train), 1)
                for axis, lab in (("column", index % grid), ("row", index // grid))}
    result["chance"] = round(100.0 / grid, 1)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default=None, help="checkpoint directory (default: the shipped organism)")
    parser.add_argument("-n", type=int, default=200, help="number of scenes (a quarter held out)")
    args = parser.parse_args(argv)
    model, processor = load_organism(args.path)
    print(measure(model.eval(), processor, args.n))


if __name__ == "__main__":
    main()
