"""Segmentation answers: RLE, polygons, boxes, abstention, returned masks, and the
HalluSegBench suite scored from a segmentation callable, per split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from evaluators.masks import answer_mask, decode_rle, encode_mask, fill_polygons
from evaluators.model import CallableModel
from evaluators.runner import run


@pytest.mark.parametrize("first", [0, 1])
def test_rle_round_trip_is_exact_and_column_major(first):
    rng = np.random.default_rng(first)
    mask = rng.random((7, 5)) > 0.5
    mask[0, 0] = bool(first)
    text = encode_mask(mask)
    rle = json.loads(text)
    assert rle["size"] == [7, 5]
    assert (rle["counts"][0] == 0) == bool(first), "COCO RLE starts with a run of zeros"
    assert np.array_equal(decode_rle(rle), mask)
    # hand-computed: column-major runs of a 2x2 mask [[1, 0], [1, 1]] -> 0 zeros, 2 ones, 1 zero, 1 one
    assert json.loads(encode_mask(np.array([[1, 0], [1, 1]])))["counts"] == [0, 2, 1, 1]
    assert json.loads(encode_mask(np.zeros((2, 3))))["counts"] == [6]


def test_returned_masks_of_every_type_encode_the_same():
    mask = np.zeros((6, 8), dtype=bool)
    mask[1:4, 2:7] = True
    as_pil = Image.fromarray(mask.astype(np.uint8) * 255)
    as_tensor = torch.from_numpy(mask)[None].float()  # (1, H, W) is squeezed
    assert encode_mask(mask) == encode_mask(as_pil) == encode_mask(as_tensor)
    with pytest.raises(ValueError, match="2-D"):
        encode_mask(np.zeros((2, 3, 4)))


def test_bad_rle_is_refused_clearly():
    with pytest.raises(ValueError, match="sum to 5"):
        decode_rle({"size": [2, 3], "counts": [2, 3]})
    with pytest.raises(ValueError, match="pycocotools"):
        decode_rle({"size": [2, 3], "counts": "PPYo0"})
    mask, invalid = answer_mask('{"size": [2, 3], "counts": [1]}', (2, 3))
    assert invalid and not mask.any()


def test_polygons_in_every_form():
    square = [[2, 1], [5, 1], [5, 4], [2, 4]]
    expected = np.zeros((8, 8), dtype=bool)
    expected[1:5, 2:6] = True  # PIL fills boundary pixels
    for text in (json.dumps(square), json.dumps({"polygon": square}), "the dog: " + json.dumps([2, 1, 5, 1, 5, 4, 2, 4]),
                 json.dumps([[2, 1, 5, 1, 5, 4, 2, 4]])):
        mask, invalid = answer_mask(text, (8, 8))
        assert not invalid and np.array_equal(mask, expected), text
    mask, invalid = answer_mask("See [1]. polygon: " + json.dumps(square), (8, 8))  # not only the first JSON
    assert not invalid and np.array_equal(mask, expected)
    # a bracket inside a JSON string does not end the value early
    labelled = json.dumps({"label": "dog ]} (left)", "polygon": square})
    mask, invalid = answer_mask("[note: " + labelled, (8, 8))
    assert not invalid and np.array_equal(mask, expected)
    # a degenerate answer (a repetition loop of brackets) is unreadable, not a crash
    for text in ("[" * 5000, "[[0, 1], " * 3000):
        mask, invalid = answer_mask(text, (8, 8))
        assert invalid and not mask.any()
    rle = json.loads(encode_mask(expected))
    mask, invalid = answer_mask(json.dumps({"name": "dog}", **rle}), (8, 8))
    assert not invalid and np.array_equal(mask, expected)
    two = json.dumps({"polygons": [square, [[6, 6], [7, 6], [7, 7], [6, 7]]]})
    mask, _ = answer_mask(two, (8, 8))
    assert mask.sum() == expected.sum() + 4
    assert np.array_equal(fill_polygons([square], (8, 8)), expected)


def test_boxes_abstention_and_unreadable():
    mask, invalid = answer_mask("[1, 2, 4, 6]", (8, 10))
    assert not invalid and mask.sum() == 3 * 4 and mask[2:6, 1:4].all()
    # coordinate tokens are fractions of width and height: a non-square image scales both
    mask, _ = answer_mask("<c0> <c0> <c7> <c7>", (32, 64))
    assert mask.shape == (32, 64) and mask[:16, :32].all() and mask.sum() == 16 * 32
    for text in ("none", "No, there is none."):
        mask, invalid = answer_mask(text, 8)
        assert not invalid and not mask.any()
    mask, invalid = answer_mask("somewhere on the left", 8)
    assert invalid and not mask.any()
    assert answer_mask(None, 8)[1]


@pytest.mark.parametrize("answer", ["<c9> <c5> <c3> <c12>", "<c20> <c20> <c30> <c30>", "[40, 40, 10, 10]",
                                    "[5, 5, 5, 9]", "[100, 100, 120, 120]", "[-30, 2, -10, 6]",
                                    "[[100, 100], [120, 100], [120, 120]]"])
def test_a_region_that_covers_no_pixel_is_unreadable_not_an_abstention(answer):
    """Reversed corners, bins past the grid, a box or polygon off the image: an audit found
    them scored as valid empty masks, i.e. HalluSegBench abstentions (random coordinate
    tokens: 73% "abstentions", none invalid)."""
    mask, invalid = answer_mask(answer, (32, 48))
    assert invalid and not mask.any()


def test_hallusegbench_scored_from_a_segmentation_callable_per_split(tmp_path):
    """An oracle segmenter (true mask on the factual image, abstains otherwise) scores
    IoU_fact = 1, ΔIoU = 1 and CMS = 0 on both splits; one that always returns the factual
    mask on the counterfactual image too is caught by ΔIoU_visual."""
    from evaluators.benchmarks.hallusegbench.suite import build as hsb
    from evaluators.world import Scene

    queries = hsb(n_pairs=3, seed=4)
    assert {q.record["split"] for q in queries} == {"referring", "reasoning"}
    assert len(queries) == 3 * 2 * 3
    truth = {}
    for q in queries:
        scene = Scene.from_dict(q.record["factual_scene"])
        key = (q.prompt, q.images[0].tobytes())
        truth[key] = (q.record["role"], scene.masks()[q.record["uid"]])

    def oracle(images, prompt):
        role, mask = truth[(prompt, images[0].tobytes())]
        return mask if role == "fact" else None

    def stubborn(images, prompt):  # segments the factual object whatever the image shows
        role, mask = truth[(prompt, images[0].tobytes())]
        return mask if role in ("fact", "visual") else None

    res = run(queries, CallableModel(oracle), tmp_path / "oracle", progress=False)["results"]["hallusegbench"]
    for scores in (res, *res["by_split"].values()):
        assert scores["iou_fact"] == pytest.approx(1.0)
        assert scores["delta_iou_textual"] == pytest.approx(1.0) and scores["delta_iou_visual"] == pytest.approx(1.0)
        assert scores["cms_fact"] == pytest.approx(0.0) and scores["cms_counterfact"] == pytest.approx(0.0)
    assert sorted(res["by_split"]) == ["reasoning", "referring"]
    lines = (tmp_path / "oracle" / "samples.jsonl").read_text().splitlines()
    answers = [json.loads(line)["answer"] for line in lines]
    assert sum('"counts"' in a for a in answers) == 6, "returned masks are stored as RLE text (one per pair+split)"
    bad = run(queries, CallableModel(stubborn), tmp_path / "stubborn", progress=False)["results"]["hallusegbench"]
    assert bad["delta_iou_visual"] < 1.0 and bad["delta_iou_textual"] == pytest.approx(1.0)


def test_a_callable_answering_neither_text_nor_mask_is_named():
    from evaluators.benchmarks.hallusegbench.suite import build as hsb

    queries = hsb(n_pairs=1, seed=0, splits=("referring",))
    with pytest.raises(TypeError, match="expected text, a number"):
        CallableModel(lambda i, p: object(), name="seg")(queries[:1])
    # numbers and Python data are stored as text / JSON, not mistaken for masks
    polygon = [[10, 10], [50, 10], [50, 50]]
    for answer, stored in ((3, "3"), (True, "true"), (2.5, "2.5"), (polygon, "[[10, 10], [50, 10], [50, 50]]"),
                           ([1, 2, 3, 4], "[1, 2, 3, 4]")):
        assert CallableModel(lambda i, p, a=answer: a)(queries[:1]) == [stored]
    with pytest.raises(ValueError, match="splits"):
        hsb(n_pairs=1, splits=("implicit",))
