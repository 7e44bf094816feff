"""The tiled ViCrop localiser (a documented negative result, docs/results/crop_verify_locate.md)
gives a box inside the image, from both box rules, and plugs into CropVerify as a localizer."""

import pytest


def test_boxes_lie_inside_the_image_and_differ_by_rule(organism):
    from evaluators.benchmarks.dobench.suite import build
    from evaluators.organism.tiled_vicrop import PEAK_SIDE, tiled_vicrop_localizer

    model, processor = organism
    query = next(q for q in build(n_scenes=1, seed=0) if q.record["view"] == "Full")
    image = query.images[0]
    boxes = {}
    for rule in ("window", "peak"):
        x0, y0, x1, y1 = boxes[rule] = tiled_vicrop_localizer(model, processor, 2, rule)(image, query.prompt)
        assert 0 <= x0 < x1 <= image.width and 0 <= y0 < y1 <= image.height
    side = PEAK_SIDE * min(image.size)
    assert boxes["peak"][2] - boxes["peak"][0] == pytest.approx(side)
    assert boxes["window"] != boxes["peak"]


def test_bad_rule_is_refused(organism):
    from evaluators.organism.tiled_vicrop import tiled_vicrop_localizer

    model, processor = organism
    with pytest.raises(ValueError, match="box must be one of"):
        tiled_vicrop_localizer(model, processor, 2, "centre")


def test_collect_runs_the_default_policy_with_it(organism):
    from evaluators.organism.tiled_vicrop import collect

    model, processor = organism
    records = collect(model, processor, scenes=1, seed=0, grid=2, box="peak")
    assert any(r["verified"] for r in records)
    assert records and all(set(r["views"]) == {"crop", "cluster"} for r in records if r["verified"])
