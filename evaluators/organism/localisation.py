"""Does crop-and-verify's attention find the object? Its hit rate on the organism, beside chance.

    python -m evaluators.organism.localisation -n 60                    # ViCrop's defaults
    python -m evaluators.organism.localisation -n 100 --layers 0 --queries object --heads peak --generic none
    python -m evaluators.organism.localisation -n 100 --locate embedding   # the object's name in embedding space

For held-out scenes with one instance of a category, :meth:`mitigate.CropVerify.box` (no
ground truth: by default last-token attention over a generic prompt's, ViCrop; with
``--locate embedding`` the image tokens nearest the object's name) gives a window; a
*hit* is a window covering at least half of the object's true box. The control is the
hit rate of the same window size placed uniformly at random (every position, stride 2 px),
so a localiser that only guesses large windows gets no credit for it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from mitigate.crop_verify import LOCATE
from mitigate.localize import GENERIC_PROMPT, HEADS, QUERIES

from ..world import BIASED, World, coverage
from .signatures import HELD_OUT

QUESTION = "is there a {object} in the image ? answer yes or no ."


def chance_hit(window, box, size: int, threshold: float = 0.5, stride: int = 2) -> float:
    """Hit probability of ``window``'s size placed uniformly at random in a ``size`` image."""
    w, h = window[2] - window[0], window[3] - window[1]
    xs = np.arange(0, size - w + 1, stride)
    ys = np.arange(0, size - h + 1, stride)
    hits = [coverage((x, y, x + w, y + h), box) >= threshold for y in ys for x in xs]
    return float(np.mean(hits)) if hits else 0.0


@torch.no_grad()
def measure(model, processor, n: int = 40, seed: int = HELD_OUT + 50_000, min_size: float = 0.1,
            threshold: float = 0.5, layers=None, queries: str = "last", heads: str = "mean",
            generic_prompt: str | None = GENERIC_PROMPT, locate: str = "attention") -> dict:
    from mitigate import CropVerify

    world = World(BIASED)
    cv = CropVerify(processor, layers=layers, queries=queries, heads=heads, generic_prompt=generic_prompt, locate=locate)
    hits, chance, rows = [], [], []
    s = seed
    while len(hits) < n:
        s += 1
        scene = world.scene(s)
        boxes = scene.boxes()
        singles = [o for o in scene.objects if scene.count(o.category) == 1 and o.uid in boxes
                   and o.size >= min_size * scene.resolution]
        if not singles:
            continue
        obj = singles[0]
        window = cv.box(model, scene.render(), QUESTION.format(object=obj.category))
        cov = coverage(window, boxes[obj.uid])
        hits.append(cov >= threshold)
        chance.append(chance_hit(window, boxes[obj.uid], scene.resolution, threshold))
        rows.append({"seed": s, "category": obj.category, "box": boxes[obj.uid], "window": window, "coverage": cov})
    return {"hit_rate": 100.0 * float(np.mean(hits)), "chance_hit_rate": 100.0 * float(np.mean(chance)),
            "n": n, "seed": seed, "threshold": threshold, "layers": layers, "queries": queries, "heads": heads,
            "generic_prompt": generic_prompt, "locate": locate, "rows": rows}


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default=None)
    parser.add_argument("-n", type=int, default=60)
    parser.add_argument("--layers", default=None, help="comma-separated decoder layers (default: CropVerify's)")
    parser.add_argument("--queries", default="last", choices=QUERIES,
                        help="whose attention: the last token (ViCrop), the text after the image, the object's tokens")
    parser.add_argument("--heads", default="mean", choices=HEADS, help="head mean (ViCrop) or the most concentrated head")
    parser.add_argument("--generic", default=GENERIC_PROMPT,
                        help=f"ViCrop's normalising prompt (default {GENERIC_PROMPT!r}); 'none' reads the raw map")
    parser.add_argument("--locate", default="attention", choices=LOCATE,
                        help="attention (ViCrop and the options above) or embedding (the object's name; ignores them)")
    parser.add_argument("--seed", type=int, default=HELD_OUT + 50_000, help="first scene seed (held out)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, processor = load_organism(args.path)
    layers = [int(v) for v in args.layers.split(",")] if args.layers else None
    generic = None if args.generic.lower() == "none" else args.generic
    result = measure(model, processor, args.n, seed=args.seed, layers=layers, queries=args.queries, heads=args.heads,
                     generic_prompt=generic, locate=args.locate)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
