"""The embedding localiser (``CropVerify(locate="embedding")``): the similarity map's
arithmetic, the capture at the caller's own prefill on every architecture (output
unchanged, hooks removed, branch rows left out), and -- on the shipped organism -- that
its window lands on the planted object."""

from __future__ import annotations

import pytest
import torch

from hooks import hook_state, resolve
from hooks.testing import TINY_MODEL_TYPES, build_tiny_model, tiny_inputs
from mitigate import CropVerify
from mitigate.localize_embedding import capture_embeddings, embedding_maps, similarity_maps, tile_boxes


def test_similarity_map_peaks_at_the_token_that_matches_the_name():
    torch.manual_seed(0)
    embeds = torch.randn(2, 7, 16)
    image = torch.tensor([[False, True, True, True, True, False, False]] * 2)
    named = torch.zeros(2, 7, dtype=torch.bool)
    named[0, 5:] = True  # a two-token name in row 0; row 1 names nothing
    embeds[0, 3] = embeds[0, 5:].mean(0) * 2.0  # image token 2 (position 3) looks like the name
    maps = similarity_maps(embeds, image, named)
    assert maps[1] is None
    heat = maps[0]
    assert heat.shape == (1, 4) and int(heat.argmax()) == 2 and float(heat.min()) == 0.0
    raw = similarity_maps(embeds, image, named, shift=False)[0]
    torch.testing.assert_close(raw - raw.min(), heat)
    assert float(raw.max()) == pytest.approx(1.0, abs=1e-5)  # token 2 is the name's embedding, scaled
    no_image = similarity_maps(embeds, torch.zeros_like(image), named)  # a text-only row of a mixed batch
    assert no_image == [None, None]
    with pytest.raises(ValueError, match="do not agree"):
        similarity_maps(embeds, image[:, :6], named)


def test_tiles():
    assert tile_boxes(128, 96, 2) == [(0, 0, 64, 48), (64, 0, 128, 48), (0, 48, 64, 96), (64, 48, 128, 96)]
    assert tile_boxes(30, 30, 1) == [(0, 0, 30, 30)]
    assert len(tile_boxes(90, 60, 3)) == 9 and tile_boxes(90, 60, 3)[4] == (30, 20, 60, 40)
    for bad in (0, 1.5, "2"):
        with pytest.raises(ValueError, match="zoom_grid"):
            tile_boxes(10, 10, bad)


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_capture_rides_along_generate_on_every_architecture(model_type):
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=1)
    points = resolve(model)
    before = hook_state(model)
    ids = inputs["input_ids"]
    image = points.image_token_mask(ids)
    text = (~image) & inputs["attention_mask"].bool()
    named = torch.zeros_like(ids, dtype=torch.bool)
    named[0, int(text[0].nonzero()[-2])] = True  # row 0: one text token stands in for the name; row 1: none
    plain = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    with capture_embeddings(model, inputs, named) as captured:
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert torch.equal(out, plain), "the capture leaves generate() unchanged"
    maps = captured["maps"]
    assert maps[1] is None
    assert maps[0].shape == (1, int(image[0].sum()))
    assert bool(torch.isfinite(maps[0]).all()) and float(maps[0].min()) == 0.0 and float(maps[0].max()) > 0.0
    calls = []
    handle = points.decoder_layers[0].register_forward_hook(lambda *a: calls.append(1))
    try:  # a forward of its own reads the same embeddings and stops before the decoder
        again = embedding_maps(model, inputs, named)
    finally:
        handle.remove()
    torch.testing.assert_close(again[0], maps[0])
    assert calls == [], "embedding_maps ends the forward at the decoder's input"
    assert hook_state(model) == before


def test_capture_reads_the_callers_rows_under_contrast_branches():
    from mitigate import VCD, attach

    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[5, 5], seed=2)
    named = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
    named[:, -2] = True
    plain = embedding_maps(model, inputs, named)
    with attach(model, VCD()):  # the distorted image's rows are appended after the caller's
        under = embedding_maps(model, inputs, named)
    assert len(under) == 2
    for a, b in zip(plain, under):
        torch.testing.assert_close(a, b)


def test_bad_use():
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[4], seed=3)
    named = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
    with pytest.raises(ValueError, match="object_mask has shape"):
        with capture_embeddings(model, inputs, named[:, 1:]):
            pass
    with pytest.raises(ValueError, match="no forward ran"):
        with capture_embeddings(model, inputs, named):
            pass
    with pytest.raises(ValueError, match="locate must be one of"):
        CropVerify(processor=None, locate="saliency")
    with pytest.raises(ValueError, match="zoom_grid"):
        CropVerify(processor=None, locate="zoom", zoom_grid=0)
    with pytest.raises(ValueError, match="give one"):
        CropVerify(processor=None, locate="embedding", localizer=lambda image, prompt: (0, 0, 1, 1))




def test_embedding_localiser_finds_the_object_on_the_organism(organism):
    """On organism v17 the window covers half the planted object's box in 94% / 97% of two
    sets of 100 held-out scenes (docs/report_organism.md), against about 11% for the same window sizes placed
    at random; asserted on 30."""
    from evaluators.organism.localisation import measure

    model, processor = organism
    got = measure(model, processor, n=30, locate="embedding")
    assert got["hit_rate"] >= 80 and got["hit_rate"] > 4 * got["chance_hit_rate"], got


def test_localisation_probe_on_dobench_targets(organism):
    from evaluators.organism.localisation import measure

    model, processor = organism
    got = measure(model, processor, n=3, probe="dobench", locate="embedding")
    assert len(got["rows"]) == 3 and got["probe"] == "dobench" and got["seed"] == 0  # the report's suite
    for row in got["rows"]:
        x0, y0, x1, y1 = row["box"]
        assert x1 - x0 <= 12, "DO-Bench's A-objects are small"
        w0, v0, w1, v1 = row["window"]
        assert 0 <= w0 < w1 <= 128 and 0 <= v0 < v1 <= 128
    with pytest.raises(ValueError, match="probe must be one of"):
        measure(model, processor, n=1, probe="coco")


def test_zoomed_search_finds_dobench_small_objects(organism):
    """DO-Bench's A-objects (3-10 px of 128, under one patch of the 64 px input): on v17 the
    zoomed search (2x2 tiles) finds 75% of the report's 40, the whole-image embedding map
    37.5% and ViCrop's attention none (docs/report_organism.md); asserted on its first 12."""
    from evaluators.organism.localisation import measure

    model, processor = organism
    zoom = measure(model, processor, n=12, probe="dobench", locate="zoom")
    whole = measure(model, processor, n=12, probe="dobench", locate="embedding")
    assert zoom["hit_rate"] >= 50 and zoom["hit_rate"] > whole["hit_rate"], (zoom["hit_rate"], whole["hit_rate"])


def test_bad_use_of_answer(organism):
    from evaluators.world import BIASED, World

    model, processor = organism
    image = World(BIASED).scene(3).render()
    prompt = "is there a dog in the image ? answer yes or no ."
    for kwargs in ({"num_beams": 2}, {"num_return_sequences": 2, "do_sample": True}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            CropVerify(processor).answer(model, [image], [prompt], **kwargs)
    for locate, extra in (("embedding", {}), ("zoom", {}), ("attention", {"queries": "object"})):
        with pytest.raises(ValueError, match="does not occur in the prompt"):  # a name the caller gave is checked
            CropVerify(processor, locate=locate, gate=1.0, tau=0.0, **extra).answer(model, [image], [prompt],
                                                                                    objects=["zebra"])


def test_a_prompt_naming_no_object_is_refused_or_left_unverified(organism):
    from evaluators.world import BIASED, World
    from mitigate import attach

    model, processor = organism
    image = World(BIASED).scene(3).render()
    cv = CropVerify(processor, locate="embedding", gate=1.0, tau=0.0)
    with pytest.raises(ValueError, match="objects="):
        cv.boxes(model, [image], ["describe the image ."])
    prompt = "is it there ? answer yes or no ."  # names nothing; v17 answers it an unconfident "no"
    templated = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}], add_generation_prompt=True)
    with attach(model, cv):
        enc = processor(text=[templated], images=[image], return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert processor.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)[0].strip() == "no"
    assert cv.stats["object_not_found"] == 1 and cv.stats["verified"] == 0
    # answer() alike; and an object named in words the tokenizer does not know (HalluSegBench's
    # reasoning queries) leaves its row unverified instead of stopping the batch
    cv = CropVerify(processor, locate="embedding", gate=1.0, tau=0.0)
    unknown = "is there an animal that barks in the image ? answer yes or no ."
    records = cv.answer(model, [image] * 3, [prompt, unknown, "is there a dog in the image ? answer yes or no ."])
    gated = [r["first_answer"] != "yes" for r in records]
    assert gated[:2] == [True, True], records
    assert cv.stats["object_not_found"] == 2 and [r["verified"] for r in records] == [False, False, gated[2]]


def test_a_name_the_tokenizer_does_not_know_is_counted_under_object_attention(organism):
    """queries="object" reads such a row at its last token (it is still verified) and counts
    it in ``object_not_found``, through answer() and through generate() alike (there the
    decoded prompt has lost the name: "is there an in the image", which names nothing)."""
    from evaluators.world import BIASED, World
    from mitigate import attach

    model, processor = organism
    image = World(BIASED).scene(3).render()
    unknown = "is there an animal that barks in the image ? answer yes or no ."  # all <unk> to the organism
    settings = {"layers": [0], "queries": "object", "heads": "peak", "generic_prompt": None, "gate": 1.0, "tau": 0.0}
    cv = CropVerify(processor, **settings)
    record = cv.answer(model, [image], [unknown])[0]
    assert record["first_answer"] != "yes" and record["verified"]
    assert cv.stats["object_not_found"] == 1
    attached = CropVerify(processor, **settings)
    templated = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": unknown}]}], add_generation_prompt=True)
    with attach(model, attached):
        enc = processor(text=[templated], images=[image], return_tensors="pt")
        model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert attached.stats == cv.stats


@pytest.mark.parametrize("model_type", sorted(__import__("hooks.testing", fromlist=["x"]).TINY_PROCESSOR_TYPES))
def test_crop_verify_localises_by_embedding_on_every_family(model_type):
    """``CropVerify(locate="embedding" | "zoom").boxes`` end to end on each family's own
    processor (tiles, AnyRes, dynamic resolution) for a landscape and a portrait image: a box
    inside each image; the zoomed search's is a square of a quarter of the short side."""
    from PIL import Image

    from hooks.testing import tiny_processor
    from hooks.testing.processors import DEFAULT_WORDS
    from mitigate.localize_embedding import ZOOM_SIDE

    model = build_tiny_model(model_type)
    processor = tiny_processor(model_type, model.config, words=(*DEFAULT_WORDS, "dog"))
    images = [Image.new("RGB", (96, 64), (90, 120, 200)), Image.new("RGB", (64, 96), (200, 40, 40))]
    prompts = ["is there a dog in the image ?"] * 2
    cv = CropVerify(processor)
    with torch.no_grad():  # transformers installs its output-capturing hooks once, at a first forward
        model(**cv._inputs(images, prompts, model))
    before = hook_state(model)  # the zoomed search ends its forward early: nothing may be left behind
    for locate in ("embedding", "zoom"):
        boxes = CropVerify(processor, locate=locate).boxes(model, images, prompts)
        for (x0, y0, x1, y1), image in zip(boxes, images):
            assert 0 <= x0 < x1 <= image.width and 0 <= y0 < y1 <= image.height, (locate, boxes)
            if locate == "zoom":
                assert x1 - x0 == pytest.approx(ZOOM_SIDE * min(image.size)) == y1 - y0
    assert hook_state(model) == before


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_zoomed_search_maps_tiles_back_on_every_architecture(model_type):
    """The zoomed search's geometry on every family's real preprocessing: the tiles of a
    landscape image, each resized to the image's size (as ``CropVerify`` cuts them), read
    by a forward that stops at the decoder's input, give a box of ``ZOOM_SIDE`` of the short
    side inside the image, and the peak lands in the tile whose map holds the largest value."""
    from PIL import Image

    from mitigate.crop_verify import view_image
    from mitigate.localize_embedding import ZOOM_SIDE, peak_box

    model = build_tiny_model(model_type)
    points = resolve(model)
    image = Image.new("RGB", (96, 64), (90, 120, 200))
    tiles = tile_boxes(*image.size, 2)
    inputs = tiny_inputs(model, images=[view_image(image, t) for t in tiles], text_lengths=[5] * 4, seed=4)
    text = (~points.image_token_mask(inputs["input_ids"])) & inputs["attention_mask"].bool()
    named = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
    for row in range(4):
        named[row, int(text[row].nonzero()[-2])] = True
    maps = embedding_maps(model, inputs, named, shift=False)
    assert all(m is not None and m.shape[0] == 1 for m in maps)
    x0, y0, x1, y1 = peak_box(points, maps, inputs, list(range(4)), tiles, image.size)
    assert 0 <= x0 < x1 <= 96 and 0 <= y0 < y1 <= 64
    assert x1 - x0 == pytest.approx(ZOOM_SIDE * 64) == y1 - y0
    if len(points.token_regions(maps[0].shape[-1], inputs, 0, image.size)) > 1:
        return  # overlapping regions (a thumbnail under tiles) are averaged: the raw maximum need not win
    best = max(range(4), key=lambda t: float(maps[t].max()))
    tx0, ty0, tx1, ty1 = tiles[best]
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2  # the window is centred on the peak unless moved inside the image
    side = ZOOM_SIDE * 64
    assert tx0 - side / 2 <= cx <= tx1 + side / 2 and ty0 - side / 2 <= cy <= ty1 + side / 2
