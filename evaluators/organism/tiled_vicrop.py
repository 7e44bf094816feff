"""ViCrop's attention ratio computed tile by tile (session 41, a negative result).

    python -m evaluators.organism.tiled_vicrop --seed 0 [--grid 2] [--box window|peak]

ViCrop (ICLR 2025) localises with the ratio of the question's attention to a generic
prompt's; for images larger than the model's input it cuts the image into blocks, computes
the map on each block and stitches them. Crop-and-verify's default reads the ratio once,
over the whole image. The zoomed *embedding* search (``CropVerify(locate="zoom")``) showed
that reading 2x2 tiles at the model's resolution finds small objects the whole-image map
misses; this asks whether the same holds for attention, the localiser issue 6 names.

Each tile is cut from the original and resized to the image's size, as a view is
(:func:`mitigate.crop_verify.view_image`), asked the query and ViCrop's generic prompt
(2 x grid^2 rows in one forward that stops after the last captured layer); each tile's ratio
is painted through the token layout and pasted into its place, and the box is the densest
window (``--box window``: :func:`mitigate.localize.best_window` with sides 1/8, 1/4 and 0.4
of the short side, smaller than the default's because a tile's object is small in the
image) or a square of a quarter of the short side around the stitched map's peak
(``--box peak``, the zoomed search's rule). It plugs into :class:`mitigate.CropVerify` as a
``localizer`` callable, so gate, views and policy are the default's, and prints
:func:`evaluators.organism.crop_policy.table` for the same DO-Bench Full-view queries.
"""

from __future__ import annotations

import argparse

import torch

from hooks import resolve
from hooks.layout import content_indices

BOXES = ("window", "peak")
WINDOW_SIDES = (0.125, 0.25, 0.4)
PEAK_SIDE = 0.25


def tiled_vicrop_localizer(model, processor, grid: int = 2, box: str = "window"):
    """A ``localizer(image, prompt) -> (x0, y0, x1, y1)`` for :class:`mitigate.CropVerify`:
    ViCrop's ratio map read on ``grid`` x ``grid`` tiles and stitched (module docstring)."""
    from mitigate import CropVerify
    from mitigate.crop_verify import view_image
    from mitigate.localize import GENERIC_PROMPT, best_window, image_attention_maps, region_heat, select_heads
    from mitigate.localize_embedding import tile_boxes

    if box not in BOXES:
        raise ValueError(f"box must be one of {BOXES}, got {box!r}")
    points = resolve(model)
    encoder = CropVerify(processor)  # its chat-template encoding and default layers

    @torch.no_grad()
    def localizer(image, prompt: str) -> tuple[float, float, float, float]:
        width, height = image.size
        tiles = tile_boxes(width, height, grid)
        shown = encoder.shown(points, [image])[0]  # framed for a centre-cropping processor
        views = [view_image(image, t, shown) for t in tiles]
        enc = dict(encoder._inputs(views + views, [prompt] * len(views) + [GENERIC_PROMPT] * len(views), model))
        maps = image_attention_maps(model, enc, encoder.layers, "last")
        canvas = torch.zeros(height, width)
        for i, (x0, y0, x1, y1) in enumerate(tiles):
            regions = points.token_regions(maps[i].shape[-1], enc, i, (width, height))
            query, generic = select_heads(maps[i], content_indices(regions), "mean", maps[len(views) + i])
            heat = region_heat(query, generic, regions, width, height)
            left, top = round(x0), round(y0)
            w, h = round(x1) - left, round(y1) - top
            canvas[top : top + h, left : left + w] = torch.nn.functional.interpolate(
                heat[None, None], size=(h, w), mode="bilinear")[0, 0]
        if box == "window":
            return best_window(canvas, width, height, sizes=WINDOW_SIDES)
        ys, xs = (canvas == canvas.max()).nonzero(as_tuple=True)
        side = PEAK_SIDE * min(width, height)
        left = min(max(0.0, float(xs.float().mean()) - side / 2), width - side)
        top = min(max(0.0, float(ys.float().mean()) - side / 2), height - side)
        return (left, top, left + side, top + side)

    return localizer


def collect(model, processor, scenes: int, seed: int, grid: int, box: str, batch: int = 16) -> list[dict]:
    """:func:`evaluators.organism.crop_policy.collect`'s records, with this localiser."""
    from mitigate import CropVerify

    from .crop_policy import full_view_records

    cv = CropVerify(processor, tau=0.0, localizer=tiled_vicrop_localizer(model, processor, grid, box))
    return full_view_records(cv, model, scenes, seed, batch)


def main(argv=None) -> None:
    from .crop_policy import table
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default=None)
    parser.add_argument("--scenes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grid", type=int, default=2)
    parser.add_argument("--box", choices=BOXES, default="window")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, processor = load_organism(args.path)
    records = collect(model, processor, args.scenes, args.seed, args.grid, args.box)
    print(table({f"ViCrop on {args.grid}x{args.grid} tiles ({args.box})": records}))


if __name__ == "__main__":
    main()
