"""Does crop-and-verify's attention find the object? Its hit rate on the organism, beside chance.

    python -m evaluators.organism.localisation -n 60                    # ViCrop's defaults
    python -m evaluators.organism.localisation -n 100 --layers 0 --queries object --heads peak --generic none
    python -m evaluators.organism.localisation -n 100 --locate embedding   # the object's name in embedding space
    python -m evaluators.organism.localisation -n 40 --probe dobench --locate embedding   # DO-Bench's small A-objects

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
#: What is localised: held-out scenes' single objects, or DO-Bench's small A-objects.
PROBES = ("scenes", "dobench")


def chance_hit(window, box, size: int, threshold: float = 0.5, stride: int = 2) -> float:
    """Hit probability of ``window``'s size placed uniformly at random in a ``size`` image."""
    w, h = window[2] - window[0], window[3] - window[1]
    xs = np.arange(0, size - w + 1, stride)
    ys = np.arange(0, size - h + 1, stride)
    hits = [coverage((x, y, x + w, y + h), box) >= threshold for y in ys for x in xs]
    return float(np.mean(hits)) if hits else 0.0


def _single_objects(n: int, seed: int, min_size: float):
    """(scene seed, image, category, box) of held-out scenes' first single-instance object
    at least ``min_size`` of the image side."""
    world = World(BIASED)
    s, found = seed, 0
    while found < n:
        s += 1
        scene = world.scene(s)
        boxes = scene.boxes()
        singles = [o for o in scene.objects if scene.count(o.category) == 1 and o.uid in boxes
                   and o.size >= min_size * scene.resolution]
        if singles:
            found += 1
            yield s, scene.render(), singles[0].category, boxes[singles[0].uid]


def _dobench_targets(n: int, seed: int):
    """(scene seed, image, category, box) of DO-Bench's A-objects (small, out of context,
    next to other objects; :func:`evaluators.benchmarks.dobench.suite.build`'s scene groups
    for ``seed``): what crop-and-verify has to find on that benchmark."""
    from ..benchmarks.dobench.suite import scene_groups

    for _, (s, group) in zip(range(n), scene_groups(seed, World(BIASED))):
        yield s, group.base.render(), group.a_category, group.base.boxes()[group.a_uid]


@torch.no_grad()
def measure(model, processor, n: int = 40, seed: int | None = None, min_size: float = 0.1,
            threshold: float = 0.5, layers=None, queries: str = "last", heads: str = "mean",
            generic_prompt: str | None = GENERIC_PROMPT, locate: str = "attention", probe: str = "scenes",
            zoom_grid: int = 2) -> dict:
    """``probe="scenes"``: held-out scenes from ``seed`` (default ``HELD_OUT + 50_000``);
    ``"dobench"``: DO-Bench's A-objects of the suite built with ``seed`` (default 0, the
    report's)."""
    from mitigate import CropVerify

    if probe not in PROBES:
        raise ValueError(f"probe must be one of {PROBES}, got {probe!r}")
    if seed is None:
        seed = HELD_OUT + 50_000 if probe == "scenes" else 0
    cv = CropVerify(processor, layers=layers, queries=queries, heads=heads, generic_prompt=generic_prompt, locate=locate,
                    zoom_grid=zoom_grid)
    targets = _single_objects(n, seed, min_size) if probe == "scenes" else _dobench_targets(n, seed)
    hits, chance, rows = [], [], []
    for s, image, category, box in targets:
        window = cv.box(model, image, QUESTION.format(object=category))
        cov = coverage(window, box)
        hits.append(cov >= threshold)
        chance.append(chance_hit(window, box, image.width, threshold))
        rows.append({"seed": s, "category": category, "box": box, "window": window, "coverage": cov})
    return {"hit_rate": 100.0 * float(np.mean(hits)), "chance_hit_rate": 100.0 * float(np.mean(chance)),
            "n": n, "seed": seed, "probe": probe, "threshold": threshold, "layers": layers, "queries": queries,
            "heads": heads, "generic_prompt": generic_prompt, "locate": locate, "zoom_grid": zoom_grid, "rows": rows}


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
                        help="attention (ViCrop and the options above), embedding (the object's name) or zoom "
                             "(the same on tiles); the last two ignore the attention options")
    parser.add_argument("--seed", type=int, default=None,
                        help=f"first scene seed (default {HELD_OUT + 50_000}, held out); the suite's seed for --probe dobench "
                             "(default 0, the report's)")
    parser.add_argument("--zoom-grid", type=int, default=2, help="tiles per side for --locate zoom")
    parser.add_argument("--probe", default="scenes", choices=PROBES,
                        help="held-out scenes' single objects >= 10%% of the image, or DO-Bench's small A-objects")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, processor = load_organism(args.path)
    layers = [int(v) for v in args.layers.split(",")] if args.layers else None
    generic = None if args.generic.lower() == "none" else args.generic
    result = measure(model, processor, args.n, seed=args.seed, probe=args.probe, layers=layers, queries=args.queries, heads=args.heads,
                     generic_prompt=generic, locate=args.locate, zoom_grid=args.zoom_grid)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
