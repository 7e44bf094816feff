"""Crop-and-verify: attention localisation runs on every architecture, tau = 1 is exactly
the unmitigated model with no extra pass, clear errors, and (on the shipped organism)
batched verification equals verifying one query at a time. Its effect on DO-Bench is
measured by ``vlm-report`` (README), not asserted here."""

from __future__ import annotations

import pytest
import torch

from hooks import HookGroup, hook_state, resolve
from hooks.layout import Region
from hooks.testing import TINY_MODEL_TYPES, build_tiny_model, tiny_inputs
from mitigate import CropVerify, attach
from mitigate.answer_kinds import answer_kind, count_value
from mitigate.localize import (
    HEADS, attention_boxes, best_window, image_attention_maps, last_token_image_attention, object_in_question, object_token_mask, peak_head,
    region_heat, select_heads,
)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_attention_localisation_runs_on_every_architecture(model_type, attn):
    model = build_tiny_model(model_type, attn_implementation=attn)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=1)
    before = hook_state(model)
    points = resolve(model)
    counts = points.image_token_mask(inputs["input_ids"]).sum(1).tolist()
    # "object": one text token per row stands in for the object's name
    ids = inputs["input_ids"]
    text = (~points.image_token_mask(ids)) & (inputs["attention_mask"].bool() if "attention_mask" in inputs else True)
    object_mask = torch.zeros_like(ids, dtype=torch.bool)
    for row in range(ids.shape[0]):
        object_mask[row, int(text[row].nonzero()[-2])] = True
    for queries in ("last", "question", "object"):
        maps = last_token_image_attention(model, inputs, queries=queries, object_mask=object_mask)
        assert [len(m) for m in maps] == counts
        assert all(torch.isfinite(m).all() and (m >= 0).all() for m in maps)
    stacks = image_attention_maps(model, inputs, queries="object", object_mask=object_mask)
    assert [m.shape[1] for m in stacks] == counts and len({m.shape[0] for m in stacks}) == 1  # (layers x heads, tokens)
    for stack, mean in zip(stacks, last_token_image_attention(model, inputs, queries="object", object_mask=object_mask)):
        torch.testing.assert_close(stack.mean(0), mean)
    assert hook_state(model) == before
    assert all(a.config._attn_implementation == attn for a in points.attention if a is not None), "config restored"


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_a_localising_forward_stops_after_its_last_captured_layer(model_type):
    """The later decoder layers and the LM head do not run; the model is left as it was."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=1)
    points = resolve(model)
    before, state = model(**inputs).logits.detach(), hook_state(model)
    first, second = points.attention_layers[:2]  # a hybrid decoder's linear layers have no attention to capture
    for layers, ran_layers in (([first], list(range(first))), ([first, second], list(range(second)))):
        ran = []
        with HookGroup("count") as group:
            points.add_hook(group, "decoder_layer.output", lambda i, m, a, k, o: ran.append(i))
            points.add_hook(group, "lm_head.output", lambda m, a, k, o: ran.append("lm_head"))
            maps = image_attention_maps(model, inputs, layers=layers)
        assert ran == ran_layers
        assert len(maps) == 2 and len({m.shape[0] for m in maps}) == 1
    assert hook_state(model) == state
    torch.testing.assert_close(model(**inputs).logits, before, rtol=0, atol=0)


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_attention_boxes_on_every_architecture(model_type):
    """Localisation end to end -- attention, the adapter's token layout, the window -- on
    the family's real preprocessing of a landscape and a portrait image (tiles, AnyRes,
    dynamic resolution): a box inside each original image, for every head choice, with and
    without the generic prompt's rows."""
    from PIL import Image

    model = build_tiny_model(model_type)
    images = [Image.new("RGB", (96, 64), (90, 120, 200)), Image.new("RGB", (64, 96), (200, 40, 40))]
    rows = [images[0], images[0], images[1], images[1]]  # (query, generic) pairs
    inputs = tiny_inputs(model, images=rows, text_lengths=[6, 3, 5, 3], seed=3)
    for heads in HEADS:
        for generic_rows, sizes in ((True, [im.size for im in images]), (False, [im.size for im in rows])):
            boxes = attention_boxes(model, inputs, sizes, heads=heads, generic_rows=generic_rows)
            assert len(boxes) == len(sizes)
            for (x0, y0, x1, y1), (width, height) in zip(boxes, sizes):
                assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
    with pytest.raises(ValueError, match="4 rows for 3 queries"):
        attention_boxes(model, inputs, [(96, 64)] * 3, generic_rows=False)


def test_attention_matches_eager_weights():
    """The captured weights are the eager attention of that layer, last query row."""
    model = build_tiny_model("llava", attn_implementation="eager")
    inputs = tiny_inputs(model, batch_size=1, seed=2)
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    layer = 1
    expected = out.attentions[layer][0, :, -1, :].mean(0)
    image = resolve(model).image_token_mask(inputs["input_ids"])[0]
    (got,) = last_token_image_attention(model, inputs, layers=[layer])
    torch.testing.assert_close(got, expected[image], rtol=1e-5, atol=1e-6)
    # "question": the mean over the positions after the last image token (left padding aside)
    after = int(image.nonzero().max()) + 1
    expected = out.attentions[layer][0, :, after:, :].mean(0).mean(0)
    (got,) = last_token_image_attention(model, inputs, layers=[layer], queries="question")
    torch.testing.assert_close(got, expected[image], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="queries"):
        last_token_image_attention(model, inputs, queries="first")


def test_object_query_reads_the_object_tokens():
    """``queries="object"``: the eager attention of that layer, averaged over the positions
    of the object's tokens; a row without any reads its last token."""
    model = build_tiny_model("llava", attn_implementation="eager")
    inputs = tiny_inputs(model, batch_size=1, seed=2)
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    image = resolve(model).image_token_mask(inputs["input_ids"])[0]
    after = int(image.nonzero().max()) + 1
    mask = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
    mask[0, after : after + 2] = True
    (stack,) = image_attention_maps(model, inputs, layers=[1], queries="object", object_mask=mask)
    expected = out.attentions[1][0, :, after : after + 2, :].mean(1)  # (heads, keys)
    torch.testing.assert_close(stack, expected[:, image], rtol=1e-5, atol=1e-6)
    (stack,) = image_attention_maps(model, inputs, layers=[1], queries="object", object_mask=torch.zeros_like(mask))
    torch.testing.assert_close(stack, out.attentions[1][0, :, -1, :][:, image], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="object_mask"):
        image_attention_maps(model, inputs, queries="object")


@pytest.mark.parametrize("prompt, obj", [
    ("Is there a dog in the image? Answer Yes or No.", "dog"),
    ("i am certain there is no fire hydrant in the image . is there a fire hydrant in the image ?", "fire hydrant"),
    ("I believe there is a cup in the image. Is there an apple in the image?", "apple"),
    ("how many forks are in the image ?", "forks"),
    ("What colour is the ball?", "ball"),
    ("Are there any traffic lights visible?", "traffic lights"),
    ("Describe the image.", None),
    ("is there an in the image? answer yes or no.", None),  # the name decoded away (unknown words)
])
def test_object_in_question(prompt, obj):
    assert object_in_question(prompt) == obj


def test_object_token_mask_marks_the_last_occurrence():
    from evaluators.organism import tasks
    from evaluators.organism.package import build_tokenizer

    tokenizer = build_tokenizer(tasks.vocabulary())
    model = build_tiny_model("llava")
    points = resolve(model)
    text = "i suspect there is no dog in the image . is there a dog in the image ?"
    ids = torch.tensor([tokenizer(text)["input_ids"]] * 2)
    mask = object_token_mask(tokenizer, points, ids, ["dog", None])
    words = tokenizer.convert_ids_to_tokens(ids[0].tolist())
    dogs = [i for i, w in enumerate(words) if w == "dog"]
    assert mask[0].nonzero().flatten().tolist() == [dogs[-1]]  # the question's, not the belief's
    assert not mask[1].any()
    with pytest.raises(ValueError, match="'cat' does not occur"):
        object_token_mask(tokenizer, points, ids, ["cat", "dog"])
    with pytest.raises(ValueError, match="2 rows"):
        object_token_mask(tokenizer, points, ids, ["dog"])


def test_peak_head_picks_the_concentrated_map():
    maps = torch.full((3, 5), 0.2)
    maps[1] = torch.tensor([0.9, 0.05, 0.02, 0.02, 0.01])  # concentrated on token 0 ...
    maps[2] = torch.tensor([0.0, 0.6, 0.1, 0.1, 0.2])
    assert peak_head(maps) == 1
    assert peak_head(maps, 1) == 2  # ... which is a CLS token left out
    assert peak_head(maps, torch.tensor([1, 2, 3])) == 2  # ... or a newline token (anyres)
    generic = torch.arange(15.0).reshape(3, 5)
    query, base = select_heads(maps, 1, "peak", generic)
    assert torch.equal(query, maps[2]) and torch.equal(base, generic[2])  # one head, both rows
    query, base = select_heads(maps, 1, "mean", generic)
    assert torch.equal(query, maps.mean(0)) and torch.equal(base, generic.mean(0))
    with pytest.raises(ValueError, match="heads"):
        select_heads(maps, 0, "max")


def _best_window_by_loop(heat, width, height, sizes=(0.25, 0.4, 0.6)):
    """best_window's definition, one window at a time: the first best in (size, y, x) order,
    every window within the relative tie tolerance of the best of all counting as tied."""
    import math

    from mitigate.localize import TIE

    up = torch.nn.functional.interpolate(heat[None, None].float(), size=(height, width), mode="nearest")[0, 0]
    integral = torch.nn.functional.pad(up.double().cumsum(0).cumsum(1), (1, 0, 1, 0))
    scored = []
    for frac in sizes:
        side = max(1, int(round(frac * min(width, height))))
        for y in range(0, height - side + 1, max(1, side // 4)):
            for x in range(0, width - side + 1, max(1, side // 4)):
                total = integral[y + side, x + side] - integral[y, x + side] - integral[y + side, x] + integral[y, x]
                score = float(total) / (side * side) * math.sqrt(frac)
                scored.append((score, (float(x), float(y), float(x + side), float(y + side))))
    top = max((score for score, _ in scored if math.isfinite(score)), default=None)
    if top is None:
        return (0.0, 0.0, float(width), float(height))
    return next(box for score, box in scored if score >= top - TIE * abs(top))


def test_vectorised_window_search_equals_the_loop():
    g = torch.Generator().manual_seed(0)
    for i in range(120):
        h, w = (int(v) for v in torch.randint(8, 160, (2,), generator=g))
        heat = torch.rand(int(torch.randint(2, 10, (1,), generator=g)), int(torch.randint(2, 10, (1,), generator=g)),
                          generator=g)
        heat = (heat > 0.7).float() if i % 3 == 0 else torch.zeros_like(heat) if i % 7 == 0 else heat  # ties too
        assert best_window(heat, w, h) == _best_window_by_loop(heat, w, h)


def test_window_ties_and_bad_heat():
    """Equally hot windows resolve to the first in (size, y, x) order and any real
    difference in the heat wins; NaN heat gives the whole image (or a window over the
    finite part) instead of an error."""
    heat = torch.zeros(8, 8)
    heat[2, 2] = heat[2, 5] = heat[5, 2] = 1.0  # three equally hot cells
    box = best_window(heat, 64, 64)
    assert box[1] < 32 and box[0] < 32  # the first of the three: row 2, column 2
    hotter = heat.clone()
    hotter[5, 2] += 1.0e-3  # a real difference (one float32 step of the heat is ~1e-7)
    assert best_window(hotter, 64, 64) != box
    assert best_window(torch.full((4, 4), float("nan")), 40, 30) == (0.0, 0.0, 40.0, 30.0)
    part = torch.zeros(4, 4)
    part[0, 0] = float("nan")
    part[3, 3] = 1.0
    x0, y0, x1, y1 = best_window(part, 64, 64)
    assert x1 == 64 and y1 == 64  # the hot corner, away from the NaN cell


def test_window_over_painted_regions():
    heat = torch.zeros(8, 8)
    heat[6, 1] = 10.0  # a hot cell at row 6, column 1 of a 128 px image: pixels x 16-32, y 96-112
    x0, y0, x1, y1 = best_window(heat, 128, 128)
    assert x0 <= 16 and x1 >= 32 and y0 <= 96 and y1 >= 112
    # one region: the painted map is the grid upsampled
    query = torch.rand(64) + 0.1
    painted = region_heat(query, None, [Region(0, 8, 8, 8)], 128, 128)
    expected = torch.nn.functional.interpolate(query.reshape(1, 1, 8, 8), size=(128, 128))[0, 0]
    torch.testing.assert_close(painted, expected)
    # a 2 x 2 tiling plus a thumbnail (tiles layout): the hot token of tile (1, 0) and the
    # thumbnail's hot token agree on the lower-left quarter; the window lands there
    tiles = [Region(4 * (2 * r + c), 2, 2, 2, (c / 2, r / 2, (c + 1) / 2, (r + 1) / 2)) for r in range(2) for c in range(2)]
    thumbnail = Region(16, 2, 2, 2)
    query = torch.ones(20)
    query[8 + 1] = 8.0  # tile (1, 0), its top-right token: pixels x 32-64, y 64-96 of 128
    query[16 + 2] = 4.0  # the thumbnail's bottom-left token: x 0-64, y 64-128
    generic = torch.ones(20)
    heat = region_heat(query, generic, tiles + [thumbnail], 128, 128)
    assert heat.shape == (128, 128) and heat[80, 48] == heat.max()
    x0, y0, x1, y1 = best_window(heat, 128, 128)
    assert x0 < 64 and y1 > 64
    with pytest.raises(ValueError, match="cover"):
        region_heat(query, None, tiles[:2], 128, 128)
    # a non-square image: the canvas keeps its aspect ratio, long side capped
    assert region_heat(torch.rand(16) + 0.1, None, [Region(0, 4, 4, 4)], 2000, 1000).shape == (256, 512)


def test_heat_is_painted_on_the_part_of_the_image_the_processor_showed():
    """A centre-cropping processor (LLaVA-1.5's) shows the grid the middle of a wide image:
    the heat is painted there (hooks.layout.visible_box), the cut-off sides get none, and
    the window follows the hot token to where it is in the image."""
    shown = (0.25, 0.0, 0.75, 1.0)  # a 128 x 64 image resized to 64 high, its middle 64 x 64 cut
    query = torch.full((16,), 0.1)
    query[1 * 4 + 3] = 10.0  # row 1, column 3 of the 4 x 4 grid: pixels x 80-96, y 16-32 of the image
    heat = region_heat(query, None, [Region(0, 4, 4, 4)], 128, 64, shown=shown)
    assert heat.shape == (64, 128) and float(heat[:, :32].abs().sum()) == 0 == float(heat[:, 96:].abs().sum())
    assert heat[20, 88] == heat.max()
    x0, y0, x1, y1 = best_window(heat, 128, 64)
    assert x0 <= 80 and x1 >= 96 and x1 <= 112, (x0, x1)  # over the whole image the token was at x 96-128
    # a crop larger than the resized image (padding): the grid reaches past the image, and
    # only its part on the image is painted
    padded = region_heat(torch.arange(1.0, 17.0), None, [Region(0, 4, 4, 4)], 64, 64, shown=(0.0, -0.25, 1.0, 1.25))
    assert padded.shape == (64, 64) and padded[0, 0] == 1.0 + 4 * 0 and padded[63, 63] == 16.0
    with pytest.raises(ValueError, match="shown"):
        region_heat(query, None, [Region(0, 4, 4, 4, (0.0, 0.0, 0.5, 1.0))], 128, 64, shown=shown)


@pytest.fixture(scope="module")
def organism_like():
    from evaluators.organism import tasks
    from evaluators.organism.package import build_model_config, build_processor, build_tokenizer
    from evaluators.world import BIASED, World
    from transformers import LlavaForConditionalGeneration

    tokenizer = build_tokenizer(tasks.vocabulary())
    processor = build_processor(tokenizer)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(build_model_config(len(tokenizer))).eval()
    images = [World(BIASED).scene(i).render() for i in range(4)]
    return model, processor, images


def test_tau_one_is_the_unmitigated_model_with_no_extra_pass(organism_like):
    model, processor, images = organism_like
    prompts = ["is there a dog in the image ? answer yes or no ."] * len(images)
    plain = CropVerify(processor, tau=1.0)._generate(model, images, prompts, 3, {})[0]
    cv = CropVerify(processor, tau=1.0, gate=1.0)
    got = cv.answer(model, images, prompts, max_new_tokens=3)
    assert [r["answer"] for r in got] == plain
    assert cv.stats == {"queries": 4, "verified": 0, "overturned": 0}


def test_gate_decides_when_views_run(organism_like):
    model, processor, images = organism_like
    prompts = ["is there a dog in the image ? answer yes or no ."] * len(images)
    never = CropVerify(processor, gate=0.0)
    never.answer(model, images, prompts, max_new_tokens=3)
    assert never.stats["verified"] == 0
    always = CropVerify(processor, gate=1.0, tau=0.0)
    results = always.answer(model, images, prompts, max_new_tokens=3)
    assert always.stats["verified"] == 4
    assert set(results[0]["views"]) == {"crop", "cluster"}
    box = results[0]["views"]["crop"]["box"]
    assert 0 <= box[0] < box[2] <= images[0].width and 0 <= box[1] < box[3] <= images[0].height


def test_the_generic_prompt_reuses_the_first_answers_cache(organism_like, monkeypatch):
    """ViCrop's generic row is read over the first answer's KV cache, for every verified
    query, in answer() and in the attached generate(); the boxes and what the views say
    are those of a generic forward of its own."""
    import mitigate.crop_verify as module

    model, processor, images = organism_like
    prompts = ["is there a dog in the image ? answer yes or no ."] * len(images)
    cached = CropVerify(processor, gate=1.0, tau=0.0)
    got = cached.answer(model, images, prompts, max_new_tokens=3)
    assert cached.stats["verified"] == cached.stats["generic_from_cache"] == 4
    monkeypatch.setattr(module, "generic_maps_from_cache", lambda *args, **kwargs: None)
    full = CropVerify(processor, gate=1.0, tau=0.0)
    want = full.answer(model, images, prompts, max_new_tokens=3)
    assert full.stats["generic_from_cache"] == 0
    assert [r["box"] for r in got] == [r["box"] for r in want]
    assert [r["views"] for r in got] == [r["views"] for r in want]
    monkeypatch.undo()
    attached = CropVerify(processor, gate=1.0, tau=0.0)
    with attach(model, attached):
        inputs = processor(text=[processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}], add_generation_prompt=True)
            for p in prompts], images=images, return_tensors="pt", padding=True)
        model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert attached.stats["verified"] == attached.stats["generic_from_cache"] == 4


def test_command_line_spec_sets_views_and_control():
    from evaluators.cli import parse_mitigations

    (cv,) = parse_mitigations("crop_verify:views=crop+pair;control=true;tau=0.7", None, processor=object())
    assert isinstance(cv, CropVerify) and tuple(cv.views) == ("crop", "pair") and cv.control is True and cv.tau == 0.7
    (decompose,) = parse_mitigations("crop_verify:which_image=decompose", None, processor=object())
    assert decompose.which_image == "decompose"
    (on,) = parse_mitigations("crop_verify:which_image=true", None, processor=object())
    assert on.which_image is True


def test_control_box_is_the_farthest_same_size_window():
    from mitigate.crop_verify import control_box

    assert control_box((10, 10, 30, 40), 100, 80) == (80.0, 50.0, 100.0, 80.0)  # top-left -> bottom-right
    assert control_box((70, 50, 100, 80), 100, 80) == (0.0, 0.0, 30.0, 30.0)
    assert control_box((0, 0, 120, 50), 100, 80) == (0.0, 30.0, 100.0, 80.0)  # clipped to the image


def test_pair_view_and_control(organism_like):
    """The "pair" view re-asks with [original, crop] as two images of one prompt; with
    ``control`` a view overturns a "no" only when its p(yes) beats the control window's."""
    from evaluators.answers import parse_yes_no
    from hooks import resolve

    model, processor, images = organism_like
    prompts = ["is there a dog in the image ? answer yes or no ."] * len(images)
    seen = []
    points = resolve(model)
    handle = model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(points.image_token_mask(kwargs["input_ids"]).sum(1).tolist())
        if kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[1] > 1 else None, with_kwargs=True)
    try:
        cv = CropVerify(processor, gate=1.0, tau=0.0, views=("crop", "pair"), control=True)
        results = cv.answer(model, images, prompts, max_new_tokens=2)
    finally:
        handle.remove()
    single = seen[0][0]
    assert any(counts.count(2 * single) for counts in seen), "some prompt carried two images"
    for r in results:
        if not r["verified"]:
            continue
        assert set(r["views"]) == {"crop", "pair"} and r["views"]["pair"]["box"] == r["views"]["crop"]["box"]
        control = r["control"]["p_yes"]
        beats = any(v["p_yes"] > max(cv.tau, control) for v in r["views"].values())
        assert (parse_yes_no(r["answer"]) is not parse_yes_no(r["first_answer"])) <= beats
        if parse_yes_no(r["first_answer"]) is False and not beats:
            assert r["answer"] == r["first_answer"]


def test_caller_boxes_replace_attention(organism_like):
    model, processor, images = organism_like
    cv = CropVerify(processor, gate=1.0, tau=0.0, views=("crop",), localizer=lambda image, prompt: (10, 10, 30, 30))
    (result,) = cv.answer(model, images[:1], ["is there a dog in the image ? answer yes or no ."], max_new_tokens=3)
    assert result["box"] == (10.0, 10.0, 30.0, 30.0)
    assert result["views"]["crop"]["box"] == (8.0, 8.0, 32.0, 32.0)  # 10% margin, square


@pytest.mark.parametrize("kwargs, match", [
    ({"tau": 1.5}, "tau"), ({"tau": -0.1}, "tau"), ({"gate": 2}, "gate"), ({"margin": 0.9 + 0.2}, "margin"),
    ({"views": ("zoom",)}, "views"), ({"localizer": "yolo"}, "localizer"), ({"queries": "first"}, "queries"),
    ({"heads": "max"}, "heads"), ({"generic_prompt": ""}, "generic_prompt"), ({"control": "yes"}, "control"),
    ({"views": ("pair", "zoom")}, "views"), ({"yes_no_view_tokens": 0}, "yes_no_view_tokens"),
    ({"yes_no_view_tokens": True}, "yes_no_view_tokens"), ({"yes_no_view_tokens": 1.5}, "yes_no_view_tokens"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CropVerify(None, **kwargs)


def test_bad_inputs(organism_like):
    from PIL import Image

    model, processor, _ = organism_like
    cv = CropVerify(processor)
    with pytest.raises(ValueError, match="one PIL image"):
        cv.answer(model, [], [])
    with pytest.raises(ValueError, match="too small"):
        cv.answer(model, [Image.new("RGB", (4, 4))], ["is there a dog ?"])
    with pytest.raises(ValueError, match="differ"):
        cv.answer(model, [Image.new("RGB", (64, 64))], [])
    # one prompt not in a list was read letter by letter ("differ in number: 1 vs 16")
    with pytest.raises(ValueError, match="prompts must be a list .* got a str"):
        cv.answer(model, [Image.new("RGB", (64, 64))], "is there a dog ?")
    with pytest.raises(ValueError, match="images must be a list .* got a Image"):
        cv.answer(model, Image.new("RGB", (64, 64)), ["is there a dog ?"])
    # a prompt the caller templated already holds the image placeholder: named, not a
    # processor error about a count of image tokens
    content = [{"type": "image"}, {"type": "text", "text": "is there a dog ?"}]
    templated = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    with pytest.raises(ValueError, match="already holds the image placeholder"):
        cv.answer(model, [Image.new("RGB", (64, 64))], [templated])


def test_caption_mentions_are_asked_about_once_each(organism_like):
    model, processor, images = organism_like
    caption = "a red dog , a blue fork and another dog ."
    cv = CropVerify(processor, tau=1.0)
    got = cv.verify_caption(model, images[0], caption, question="is there a {object} in the image ? answer yes or no .")
    assert got["mentions"] == ["dog", "fork", "dog"]
    assert set(got["details"]) == {"dog", "fork"}
    assert cv.stats["queries"] == 2  # one question per distinct category
    plain = CropVerify(processor, tau=1.0)._generate(
        model, [images[0]] * 2, [f"is there a {c} in the image ? answer yes or no ." for c in ("dog", "fork")], 4, {})[0]
    from evaluators.answers import parse_yes_no

    assert got["confirmed"] == [c for c, a in zip(("dog", "fork"), plain) if parse_yes_no(a) is True]
    assert sorted(got["confirmed"] + got["unverified"]) == ["dog", "fork"]


def test_caption_with_custom_synonyms_and_no_mentions(organism_like):
    model, processor, images = organism_like
    cv = CropVerify(processor, tau=1.0)
    got = cv.verify_caption(model, images[0], "a puppy on grass", synonyms={"dog": ["puppy"]})
    assert got["mentions"] == ["dog"]
    empty = cv.verify_caption(model, images[0], "nothing to see")
    assert empty["mentions"] == [] and empty["unverified"] == [] and empty["details"] == {}
    with pytest.raises(ValueError, match="object"):
        cv.verify_caption(model, images[0], "a dog", question="is there a dog?")


def test_object_localiser_without_generic_row(organism_like):
    """``queries="object", heads="peak", generic_prompt=None``: one row per query, the object
    read from the question (or given), a clear error when neither names one."""
    model, processor, images = organism_like
    cv = CropVerify(processor, gate=1.0, tau=0.0, layers=[0], queries="object", heads="peak", generic_prompt=None)
    prompts = ["i suspect there is no dog in the image . is there a dog in the image ? answer yes or no ."] * 2
    boxes = cv.boxes(model, images[:2], prompts)
    assert len(boxes) == 2 and cv.boxes(model, images[:2], prompts, objects=["dog", "dog"]) == boxes
    for x0, y0, x1, y1 in boxes:
        assert 0 <= x0 < x1 <= images[0].width and 0 <= y0 < y1 <= images[0].height
    results = cv.answer(model, images[:2], prompts, max_new_tokens=3)
    assert all(r["verified"] == (r["first_answer"] != "yes") for r in results)
    with pytest.raises(ValueError, match="objects="):
        cv.boxes(model, images[:1], ["describe the image ."])
    with pytest.raises(ValueError, match="objects"):
        cv.answer(model, images[:1], prompts[:1], objects=["dog", "cat"])


def test_object_localiser_finds_the_object_on_the_organism():
    """Issue 6: the attention-derived box covers half the planted object's box in most
    cases (v16 met that; v17 misses it by a few points). On the shipped organism with the
    object-token setting (layer 0, the object's tokens, the peak head; v17: 47% / 46% on
    two sets of 100 scenes, v16: 59% / 60%, docs/report_organism.md), on 30 held-out scenes (v17: 50%),
    against the same window sizes placed at random (chance about 7%)."""
    from evaluators.organism import ORGANISM_DIR, load_organism
    from evaluators.organism.localisation import measure

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    got = measure(model, processor, n=30, layers=[0], queries="object", heads="peak", generic_prompt=None)
    assert got["hit_rate"] >= 40 and got["hit_rate"] > 4 * got["chance_hit_rate"], got


def test_localisation_under_attached_contrast_branches_reads_the_original_rows(organism_like):
    from mitigate import VCD, attach

    model, processor, images = organism_like
    cv = CropVerify(processor)
    enc = cv._inputs(images[:2], ["is there a dog in the image ? answer yes or no ."] * 2, model)
    plain = last_token_image_attention(model, dict(enc))
    with attach(model, VCD(distortion="no_image")):
        under = last_token_image_attention(model, dict(enc))
    assert len(under) == 2
    for a, b in zip(plain, under):
        torch.testing.assert_close(a, b)


def test_batched_verification_equals_one_query_at_a_time():
    """The gated queries are localised and re-asked in one batch; answers, boxes and the
    views' p(yes) equal verifying each query alone (padding moves p(yes) by < 1e-5)."""
    from evaluators.benchmarks.dobench.suite import build
    from evaluators.organism import ORGANISM_DIR, load_organism

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    queries = [q for q in build(n_scenes=6, seed=1) if q.record["view"] == "Full"][:16]
    images, prompts = [q.images[0] for q in queries], [q.prompt for q in queries]
    batched = CropVerify(processor, gate=1.0).answer(model, images, prompts)  # every first "no" is verified
    alone = [CropVerify(processor, gate=1.0).answer(model, [im], [p])[0] for im, p in zip(images, prompts)]
    assert sum(r["verified"] for r in batched) >= 2, "the gate lets some queries through"
    for a, b in zip(batched, alone):
        assert a["answer"] == b["answer"] and a["verified"] == b["verified"]
        if a["verified"]:
            assert a["box"] == b["box"]
            for view in a["views"]:
                assert abs(a["views"][view]["p_yes"] - b["views"][view]["p_yes"]) < 1e-5


def test_yes_no_views_answer_with_one_token():
    """The views of a yes/no question answer with one token (``yes_no_view_tokens=1``, the
    default): the same decisions, view answers and p(yes) as views answering at
    ``max_new_tokens``, with fewer row forwards; a count question's views still answer in full,
    so a batch of both kinds re-asks its views in one generate() per token limit."""
    import numpy as np

    from evaluators.organism import ORGANISM_DIR, load_organism
    from evaluators.organism.tasks import counting, existence
    from evaluators.world import BIASED, World

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    world = World(BIASED)
    examples = [task(world, np.random.default_rng(seed), 9 * 10**8 + seed) for seed in range(8)
                for task in (counting, existence)]
    images, prompts = [e.images[0] for e in examples], [e.question for e in examples]

    def run(**kwargs):
        cv = CropVerify(processor, gate=1.0, tau=0.0, **kwargs)
        limits, forwards = [], [0]
        generate = cv._generate
        cv._generate = lambda model, images, prompts, limit, *rest, **kw: (
            limits.append(limit) or generate(model, images, prompts, limit, *rest, **kw))
        def count(module, args, kwargs):  # rows x forwards: what the views cost, whatever the batching
            forwards[0] += (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[0]

        handle = model.register_forward_pre_hook(count, with_kwargs=True)
        try:
            results = cv.answer(model, images, prompts, max_new_tokens=4)
        finally:
            handle.remove()
        return results, limits[1:], forwards[0], cv.stats  # limits[0]: the first answers'

    short, short_limits, short_forwards, short_stats = run()
    full, full_limits, full_forwards, full_stats = run(yes_no_view_tokens=None)
    kinds = {r["kind"] for r in full if r["verified"]}
    assert kinds == {"yes_no", "count"}, "the batch must hold both kinds of verified question"
    assert sorted(short_limits) == [1, 4] and full_limits == [4]
    assert short_forwards < full_forwards
    assert short_stats == full_stats and short_stats["overturned"] > 0
    for a, b in zip(short, full):
        assert (a["answer"], a["verified"], a.get("chosen")) == (b["answer"], b["verified"], b.get("chosen"))
        for view in b["views"]:
            assert a["views"][view]["answer"] == b["views"][view]["answer"]
            assert abs(a["views"][view]["p_yes"] - b["views"][view]["p_yes"]) < 1e-5  # other padding


def test_a_first_yes_is_never_verified(organism_like):
    """The policy never overturns a "yes", so the gate spends no pass on one."""
    model, processor, images = organism_like
    prompts = ["is there a dog in the image ? answer yes or no ."] * len(images)
    cv = CropVerify(processor, gate=1.0, tau=0.0)
    results = cv.answer(model, images, prompts, max_new_tokens=3)
    from evaluators.answers import parse_yes_no

    for r in results:
        assert r["verified"] == (parse_yes_no(r["first_answer"]) is not True)


@pytest.mark.parametrize("prompt, question", [
    ("i am certain there is no dog in the image . is there a dog in the image ? answer yes or no .",
     "is there a dog in the image ? answer yes or no ."),
    ("I suspect there is a bench in the image. Is there a bench in the image? Answer Yes or No.",
     "Is there a bench in the image? Answer Yes or No."),
    ("Analysis confirms there is no bird in the image. Is there a bird in the image?", "Is there a bird in the image?"),
    ("Is there a dog in the image? Answer yes or no.", "Is there a dog in the image? Answer yes or no."),
])
def test_without_priors_keeps_the_question(prompt, question):
    from mitigate.crop_verify import without_priors

    assert without_priors(prompt) == question


def test_views_are_asked_without_the_prompts_beliefs(organism_like):
    """``strip_priors`` (default): a view is asked the question alone; off, the whole prompt."""
    from evaluators.world.views import crop_box
    from mitigate.crop_verify import view_image

    model, processor, images = organism_like
    prompt = "i am certain there is no dog in the image . is there a dog in the image ? answer yes or no ."
    box = (10.0, 10.0, 40.0, 40.0)
    view = view_image(images[0], crop_box(box, images[0].width, images[0].height, 0.1))
    seen = []
    for strip, asked in ((True, "is there a dog in the image ? answer yes or no ."), (False, prompt)):
        cv = CropVerify(processor, gate=1.0, tau=0.0, views=("crop",), localizer=lambda im, p: box, strip_priors=strip)
        (result,) = cv.answer(model, images[:1], [prompt], max_new_tokens=3)
        if not result["verified"]:
            pytest.skip("the random model answered yes: nothing to verify")
        _, probs, _ = cv._generate(model, [view], [asked], 3, {})
        assert result["views"]["crop"]["p_yes"] == pytest.approx(float(cv._p_yes(probs)[0]), abs=1e-6)
        seen.append(result["views"]["crop"]["p_yes"])
    assert seen[0] != seen[1], "the belief sentence changes what the view is asked"


@pytest.mark.parametrize("control", [False, True])
def test_policy_replay_matches_crop_verify(organism_like, control):
    """``evaluators.organism.crop_policy`` replays tau on one tau=0 run: for tau >= 0.5 its
    yes/no equals what CropVerify(tau) answers, with and without the control window."""
    from evaluators.answers import parse_yes_no
    from evaluators.organism.crop_policy import error_rates

    model, processor, images = organism_like
    prompts = [f"is there a {c} in the image ? answer yes or no ." for c in ("dog", "cup", "tree", "bird")]
    box = lambda image, prompt: (0.0, 0.0, 40.0, 40.0)
    kwargs = {"gate": 1.0, "localizer": box, "control": control}
    zero = CropVerify(processor, tau=0.0, **kwargs).answer(model, images, prompts, max_new_tokens=3)
    records = [{"series": "A", "level": i, "first": parse_yes_no(r["first_answer"]), "verified": r["verified"],
                "p_yes": [v["p_yes"] for v in r["views"].values()],
                "p_control": r["control"]["p_yes"] if control and r["verified"] else None} for i, r in enumerate(zero)]
    for tau in (0.5, 0.6, 0.9):
        real = CropVerify(processor, tau=tau, **kwargs).answer(model, images, prompts, max_new_tokens=3)
        replay = error_rates(records, tau)
        for i, r in enumerate(real):
            assert replay[("A", i)] == (0.0 if parse_yes_no(r["answer"]) is True else 100.0)


def _organism_full_view_run(seed: int):
    """The shipped organism, 16 DO-Bench Full-view queries of ``seed``'s scenes, and a
    tau = 0, gate = 1 run over them as replay records (one per query, its own "level")."""
    from evaluators.answers import parse_yes_no
    from evaluators.benchmarks.dobench.suite import build
    from evaluators.organism import ORGANISM_DIR, load_organism

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    queries = [q for q in build(n_scenes=4, seed=seed) if q.record["view"] == "Full"][:16]
    images, prompts = [q.images[0] for q in queries], [q.prompt for q in queries]
    run = CropVerify(processor, tau=0.0, gate=1.0).answer(model, images, prompts, max_new_tokens=3)
    records = [{"series": "A", "level": i, "first": parse_yes_no(r["first_answer"]), "verified": r["verified"],
                "confidence": r["confidence"], "p_yes": [v["p_yes"] for v in r["views"].values()],
                "views": list(r["views"])} for i, r in enumerate(run)]
    return model, processor, images, prompts, records


def test_gate_replay_matches_crop_verify():
    """``crop_policy --settings gate`` replays a stricter gate on one gate=1 run: exact,
    since what the views say does not depend on the gate (the shipped organism, whose
    first-token confidences spread across the gates tried)."""
    from evaluators.answers import parse_yes_no
    from evaluators.organism.crop_policy import error_rates

    model, processor, images, prompts, records = _organism_full_view_run(seed=2)
    confidences = sorted(r["confidence"] for r in records if r["verified"])
    gates = [confidences[len(confidences) // 3], confidences[2 * len(confidences) // 3]]
    assert len(confidences) >= 3 and gates[0] < gates[1]
    for gate in gates:
        real = CropVerify(processor, tau=0.5, gate=gate).answer(model, images, prompts, max_new_tokens=3)
        replay = error_rates(records, 0.5, gate)
        assert sum(r["verified"] for r in real) == sum(r["verified"] and r["confidence"] < gate for r in records)
        for i, r in enumerate(real):
            assert replay[("A", i)] == (0.0 if parse_yes_no(r["answer"]) is True else 100.0)


def test_view_subset_replay_matches_crop_verify():
    """``crop_policy --settings view-subsets`` replays the default's run as if only some of
    its views had been asked: the same answers as CropVerify(views=...) runs (the shipped
    organism, every non-"yes" verified; on these scenes the Crop view overturns denials the
    Cluster view does not, so the two subsets answer differently)."""
    from evaluators.answers import parse_yes_no
    from evaluators.organism.crop_policy import error_rates

    model, processor, images, prompts, records = _organism_full_view_run(seed=3)
    assert all(r["views"] == ["crop", "cluster"] for r in records if r["verified"])
    tau, replays = 0.5, {}
    for views in (("crop",), ("cluster",)):
        real = CropVerify(processor, tau=tau, gate=1.0, views=views).answer(model, images, prompts, max_new_tokens=3)
        replays[views] = error_rates(records, tau, views=views)
        for i, r in enumerate(real):
            assert replays[views][("A", i)] == (0.0 if parse_yes_no(r["answer"]) is True else 100.0)
    assert replays[("crop",)] != replays[("cluster",)]
    with pytest.raises(ValueError, match="view names"):
        error_rates([{k: v for k, v in r.items() if k != "views"} for r in records], tau, views=("crop",))
    with pytest.raises(ValueError, match=r"\['crops'\] were not asked"):  # a typo is not the unmitigated run
        error_rates(records, tau, views=("crops",))


def test_caption_mentions_are_verified_on_views_with_the_shipped_organism():
    """With a gate every answer passes, each mention's "no" is re-asked on the views (not the
    tau = 1 shortcut): the record holds what each view said, and a mention is confirmed
    exactly when its final answer -- the same as :meth:`CropVerify.answer` gives -- is yes."""
    from evaluators.answers import parse_yes_no
    from evaluators.organism import ORGANISM_DIR, load_organism
    from evaluators.world import BIASED, World

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    world = World(BIASED)
    scene = world.scene(10**9 + 321)
    absent = [c for c in ("dog", "fork", "banana", "tree", "cup") if not scene.present(c)][:2]
    caption = " , ".join([o.category for o in scene.objects] + absent) + " ."
    question = "is there a {object} in the image ? answer yes or no ."
    cv = CropVerify(processor, gate=1.0, tau=0.5)
    got = cv.verify_caption(model, scene.render(), caption, question=question)
    distinct = list(dict.fromkeys(got["mentions"]))
    assert set(absent) <= set(distinct)
    firsts_no = [c for c in distinct if parse_yes_no(got["details"][c]["first_answer"]) is False]
    assert firsts_no, "no mention was denied at first: nothing was verified"
    for c in firsts_no:
        record = got["details"][c]
        assert record["verified"] and set(record["views"]) == {"crop", "cluster"}
    assert cv.stats["verified"] == len(firsts_no)
    assert got["confirmed"] == [c for c in distinct if parse_yes_no(got["details"][c]["answer"]) is True]
    again = CropVerify(processor, gate=1.0, tau=0.5).answer(model, [scene.render()] * len(distinct),
                                                           [question.format(object=c) for c in distinct],
                                                           max_new_tokens=4, objects=distinct)
    assert [r["answer"] for r in again] == [got["details"][c]["answer"] for c in distinct]


@pytest.mark.parametrize("text, question, kind", [
    ("no", None, "yes_no"), ("Yes, two.", None, "yes_no"), ("not sure", None, "yes_no"),
    ("none", None, "box"), ("<c1> <c2> <c3> <c4>", None, "box"), ("[3, 4, 50, 60]", None, "box"),
    ("two", None, "count"), ("2 dogs", None, "count"),
    ("yellow", None, "short"), ("dark red", None, "short"),
    ("There are 3 dogs on the grass.", None, "free_form"), ("red cup , blue fork , green ball .", None, "free_form"),
    # a how-many question: a short denial is the count 0, a sentence stays free text
    ("no", "how many dogs are there ?", "count"), ("none", "How many dogs?", "count"),
    ("zero", "how many dogs ?", "count"), ("There are no dogs in this picture.", "how many dogs ?", "free_form"),
    ("none", "where is the dog ?", "box"), ("no", "is there a dog ?", "yes_no"),
])
def test_answer_kinds(text, question, kind):
    assert answer_kind(text, question) == kind


def test_count_values():
    assert [count_value(t) for t in ("two", "2 dogs", "no", "none", "zero", "yellow")] == [2, 2, 0, 0, 0, None]


def test_a_count_question_answered_no_is_raised_by_a_view_count_never_by_a_yes(organism_like):
    """'how many ...?' -> 'no' is the count 0: a confident view's 'two' replaces it, a view's
    'yes' never does (it would answer a count with yes/no)."""
    _, processor, _ = organism_like
    cv = CropVerify(processor, tau=0.5)
    vocab = len(processor.tokenizer)

    def confident(n):
        probs = torch.full((n, vocab), 0.1 / (vocab - 1))
        probs[:, 0] = 0.9
        return probs

    question = "how many dog are there ?"
    built = {"crop": (0, 0, 8, 8), "cluster": (0, 0, 16, 16)}
    result = {"answer": "no", "first_answer": "no", "confidence": 0.4, "verified": False, "views": {}}
    cv._decide(result, (0, 0, 8, 8), built, ["yes", "yes"], confident(2), question)
    assert result["answer"] == "no" and "chosen" not in result
    result = {"answer": "no", "first_answer": "no", "confidence": 0.4, "verified": False, "views": {}}
    cv._decide(result, (0, 0, 8, 8), built, ["two", "one"], confident(2), question)
    assert result["answer"] == "two" and result["chosen"] == "crop" and result["kind"] == "count"
    result = {"answer": "three", "first_answer": "three", "confidence": 0.4, "verified": False, "views": {}}
    cv._decide(result, (0, 0, 8, 8), built, ["two", "one"], confident(2), question)
    assert result["answer"] == "three", "a lower count in a view never replaces the first"


def test_a_sampled_answer_is_weighed_by_its_own_probability(organism_like):
    """Under sampling an answer's confidence is the probability of the token it starts with
    (:func:`mitigate.crop_verify.emitted_probability`), not the distribution's top-1: a view
    whose top-1 beats the first answer's, but whose *sampled* answer is a less likely token,
    does not replace it (top-1s had decided on float noise between two samples of one
    distribution); under greedy both readings are the same."""
    from mitigate.crop_verify import emitted_probability

    _, processor, _ = organism_like
    vocab = len(processor.tokenizer)
    probs = torch.full((2, vocab), 0.0)
    probs[:, 5], probs[:, 6], probs[:, 7] = 0.5, 0.3, 0.2
    assert emitted_probability(probs, torch.tensor([5, 7])).tolist() == pytest.approx([0.5, 0.2])
    cv = CropVerify(processor, tau=0.1)
    built = {"crop": (0, 0, 8, 8), "cluster": (0, 0, 16, 16)}
    question = "what colour is the dog ?"
    result = {"answer": "black", "first_answer": "black", "confidence": 0.3, "verified": False, "views": {}}
    cv._decide(result, (0, 0, 8, 8), built, ["red", "red"], probs, question, confidence=torch.tensor([0.2, 0.2]))
    assert result["answer"] == "black" and "chosen" not in result
    result = {"answer": "black", "first_answer": "black", "confidence": 0.3, "verified": False, "views": {}}
    cv._decide(result, (0, 0, 8, 8), built, ["red", "red"], probs, question)  # greedy: the top-1, 0.5
    assert result["answer"] == "red"


def _generic_rows(model, inputs: dict, rows: list[int], n_generic: int = 4, seed: int = 5) -> dict:
    """The prompts of ``rows`` cut after their last image token, each followed by the same
    ``n_generic`` random text ids (a stand-in for ViCrop's generic prompt), left-padded, with
    the rows' own pixel inputs."""
    from hooks.testing.tiny import _left_pad

    points = resolve(model)
    config = model.config
    text = model.config.get_text_config()
    pad = text.pad_token_id if text.pad_token_id is not None else config.pad_token_id
    generic = torch.randint(10, 30, (n_generic,), generator=torch.Generator().manual_seed(seed)).tolist()
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    image = points.image_token_mask(ids)
    cut, types = [], []
    typed = next((k for k in ("token_type_ids", "mm_token_type_ids") if k in inputs), None)
    for row in rows:
        real = mask[row].bool()
        end = int(image[row].nonzero().max()) + 1
        cut.append(ids[row, :end][real[:end]].tolist() + generic)
        if typed:
            t = inputs[typed][row, :end][real[:end]].tolist()
            types.append(t + [inputs[typed][row, -1].item()] * n_generic)
    out_ids, out_mask = _left_pad(cut, pad)
    out = {"input_ids": out_ids, "attention_mask": out_mask}
    if typed:
        out[typed] = _left_pad(types, 0)[0]
    for key in (*points.pixel_inputs, *points.image_inputs):
        if key in inputs:
            value = inputs[key]
            out[key] = value[rows] if value.shape[0] == ids.shape[0] and rows != [0, 1] else value
    return out


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_generic_maps_from_the_cached_prefix_equal_a_full_forward(model_type):
    """ViCrop's generic-prompt maps read over the first pass's KV cache (mitigate.localize_prefix)
    equal the full forward's, where the architecture allows reuse; elsewhere None."""
    from PIL import Image

    model = build_tiny_model(model_type)
    points = resolve(model)
    # random pixels; and the family's own preprocessing of a landscape and a portrait image
    # (AnyRes rows then differ in their number of image tokens: prefixes of two lengths)
    images = [Image.new("RGB", (96, 64), (90, 120, 200)), Image.new("RGB", (64, 96), (200, 40, 40))]
    for inputs in (tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=1),
                   tiny_inputs(model, images=images, text_lengths=[6, 3], seed=3)):
        _check_generic_maps_from_cache(model, points, inputs)


def _check_generic_maps_from_cache(model, points, inputs):
    from hooks.cache import output_cache
    from mitigate.localize_prefix import generic_maps_from_cache

    with torch.no_grad():  # the first answer's cache, as crop-and-verify has it
        cache = output_cache(model.generate(**inputs, max_new_tokens=2, do_sample=False, return_dict_in_generate=True))
    one_per_row = all(inputs[k].shape[0] == 2 for k in points.pixel_inputs if k in inputs)
    rows = [1, 0] if one_per_row else [0, 1]  # tiles / flat patches: keep the rows' order
    generic = _generic_rows(model, inputs, rows)
    for layers in ([0], [0, 1]):
        for queries in ("last", "question"):
            got = generic_maps_from_cache(model, cache, inputs, rows, generic, layers, queries)
            adapter = points.adapter
            if adapter.multimodal_rope or not adapter.causal_image_prefix or any(cache.is_sliding):
                assert got is None
                continue
            assert got is not None, points.model_type
            want = image_attention_maps(model, generic, layers, queries)
            for g, w in zip(got, want):  # exact up to float rounding (~1e-9 here; a wrong position is ~1e-4)
                torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_generic_maps_from_the_cache_decline_where_reuse_is_not_exact():
    from hooks.cache import output_cache
    from mitigate import VCD, attach
    from mitigate.localize_prefix import generic_maps_from_cache

    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=1)
    with torch.no_grad():
        cache = output_cache(model.generate(**inputs, max_new_tokens=2, do_sample=False, return_dict_in_generate=True))
    generic = _generic_rows(model, inputs, [1, 0])
    assert generic_maps_from_cache(model, cache, inputs, [1, 0], generic) is not None
    with attach(model, VCD(alpha=1.0)):  # a mitigation acting on the forward: run the full one
        assert generic_maps_from_cache(model, cache, inputs, [1, 0], generic) is None
    assert generic_maps_from_cache(model, cache, inputs, [1, 0], generic) is not None
    other = dict(generic, input_ids=generic["input_ids"].clone())
    real = other["attention_mask"][0].bool().nonzero()[0, 0]
    other["input_ids"][0, real + 1] += 1  # the generic row's prefix is not the question's
    assert generic_maps_from_cache(model, cache, inputs, [1, 0], other) is None
    assert generic_maps_from_cache(model, cache, inputs, [0], generic) is None  # rows and generic rows disagree
    other = dict(generic, pixel_values=generic["pixel_values"] + 1)  # same tokens, another image
    assert generic_maps_from_cache(model, cache, inputs, [1, 0], other) is None
    # generic prompts of different lengths, and a right-padded generic row
    longer = _generic_rows(model, inputs, [1, 0], n_generic=5)
    uneven = {k: v.clone() for k, v in generic.items()}
    uneven["input_ids"] = torch.cat([uneven["input_ids"], longer["input_ids"][:, -1:]], dim=1)
    uneven["attention_mask"] = torch.cat([uneven["attention_mask"], torch.tensor([[1], [0]])], dim=1)
    assert generic_maps_from_cache(model, cache, inputs, [1, 0], uneven) is None
    # generic prompts of different lengths, left-padded
    from hooks.testing.tiny import _left_pad

    rows_ids = [r[m.bool()].tolist() for r, m in zip(generic["input_ids"], generic["attention_mask"])]
    rows_ids[0] = rows_ids[0] + rows_ids[0][-1:]
    text = model.config.get_text_config()
    ragged_ids, ragged_mask = _left_pad(rows_ids, text.pad_token_id if text.pad_token_id is not None
                                        else model.config.pad_token_id)
    ragged = dict(generic, input_ids=ragged_ids, attention_mask=ragged_mask)
    assert generic_maps_from_cache(model, cache, inputs, [1, 0], ragged) is None
    holey = dict(generic, attention_mask=generic["attention_mask"].clone())
    holey["attention_mask"][0, -3] = 0  # a row whose real tokens are not contiguous
    assert generic_maps_from_cache(model, cache, inputs, [1, 0], holey) is None
    doubled = output_cache(model.generate(**inputs, max_new_tokens=2, do_sample=False, return_dict_in_generate=True))
    doubled.batch_repeat_interleave(2)  # more cache rows than prompts (as a contrast branch's), no group attached
    assert generic_maps_from_cache(model, doubled, inputs, [1, 0], generic) is None
    cache.offloading = True  # what DynamicCache(offloading=True) sets (its offload needs CUDA streams)
    assert generic_maps_from_cache(model, cache, inputs, [1, 0], generic) is None
    cache.offloading = False
    with pytest.raises(ValueError, match="queries"):
        generic_maps_from_cache(model, cache, inputs, [1, 0], generic, queries="first")


def test_answer_accepts_the_output_settings_it_sets_itself(organism_like):
    """answer() reads the first step's scores from a dict output, so it sets output_scores
    and return_dict_in_generate itself; a caller passing them got 'dict() got multiple
    values'."""
    model, processor, images = organism_like
    prompts = ["is there a dog in the image ? answer yes or no ."] * 2
    expected = CropVerify(processor, gate=1.0, tau=0.0).answer(model, images[:2], prompts, max_new_tokens=3)
    for kwargs in ({"output_scores": True}, {"return_dict_in_generate": True},
                   {"output_scores": False, "return_dict_in_generate": False}):
        assert CropVerify(processor, gate=1.0, tau=0.0).answer(model, images[:2], prompts, max_new_tokens=3,
                                                               **kwargs) == expected


def test_tau_one_answers_an_image_too_small_for_views(organism_like):
    """With tau = 1 no view is cut, so no image is too small: answer() gives the plain answer
    (as generate() does while attached); below tau 1 it is still a clear error."""
    from PIL import Image

    model, processor, _ = organism_like
    small, prompt = [Image.new("RGB", (6, 40), "white")], ["is there a dog in the image ? answer yes or no ."]
    cv = CropVerify(processor, tau=1.0)
    assert [r["answer"] for r in cv.answer(model, small, prompt, max_new_tokens=3)] == \
        CropVerify(processor, tau=1.0)._generate(model, small, prompt, 3, {})[0]
    assert cv.stats == {"queries": 1, "verified": 0, "overturned": 0}
    with pytest.raises(ValueError, match="too small"):
        CropVerify(processor, tau=0.5).answer(model, small, prompt, max_new_tokens=3)


@pytest.mark.parametrize("kwargs", [{"locate": "embedding"}, {"locate": "zoom"}, {"queries": "object"}],
                         ids=["embedding", "zoom", "object"])
def test_caption_categories_the_tokenizer_does_not_know_are_counted_not_fatal(organism_like, kwargs):
    """verify_caption asks about categories of its own: one whose word the tokenizer does
    not know ("zebra" on the organism) is counted in stats["object_not_found"] as answer()
    counts an object read from a question -- it raised a ValueError. Objects the caller
    passes to answer() are still checked strictly."""
    model, processor, images = organism_like
    assert "zebra" not in processor.tokenizer.get_vocab()
    cv = CropVerify(processor, gate=1.0, tau=0.0, **kwargs)  # every answer gated (random weights)
    got = cv.verify_caption(model, images[0], "a puppy next to a zebra .",
                            synonyms={"dog": ("puppy",), "zebra": ("zebra",)})
    assert got["mentions"] == ["dog", "zebra"] and cv.stats["object_not_found"] == 1
    assert got["details"]["dog"]["verified"]
    if kwargs.get("queries") != "object":  # under queries="object" it is read at its last token instead
        assert not got["details"]["zebra"]["verified"]
    with pytest.raises(ValueError, match="zebra"):
        CropVerify(processor, gate=1.0, tau=0.0, **kwargs).answer(
            model, images[:1], ["is there a zebra in the image ? answer yes or no ."], objects=["zebra"])


@pytest.mark.parametrize("seed", [1, 3])
def test_the_default_keeps_issue_6s_limit_on_absent_objects(seed):
    """Issue 6: the false "yes" on absent objects (DO-Bench's B-series, Full view) must not
    rise by more than 3 points. On organism v17 the default (tau 0.8 since session 40) keeps
    it within 2.5 on every level of seed 1's 40 scene groups (the set where 0.5 broke it by
    7.5 and 0.6-0.7 by 5) and of seed 3's (0.5: 7.5), while overturning some false "no" on
    present objects (docs/results/crop_verify_locate.md, session 40)."""
    from evaluators.answers import parse_yes_no
    from evaluators.benchmarks.dobench.suite import build
    from evaluators.organism import ORGANISM_DIR, load_organism

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    queries = [q for q in build(n_scenes=40, seed=seed) if q.record["view"] == "Full"]
    cv = CropVerify(processor)
    results = []
    for i in range(0, len(queries), 32):
        chunk = queries[i : i + 32]
        results += cv.answer(model, [q.images[0] for q in chunk], [q.prompt for q in chunk])
    wrong: dict = {}
    for q, r in zip(queries, results):
        cell = wrong.setdefault((q.record["series"], q.record["level"]), [0, 0])
        said = [parse_yes_no(r["first_answer"]), parse_yes_no(r["answer"])]
        for k, yes in enumerate(said):  # a false "yes" on B, a false "no" on A
            cell[k] += (yes is True) if q.record["series"] == "B" else (yes is not True)
    for level in range(4):
        first, final = wrong[("B", level)]
        assert 100.0 * (final - first) / 40 <= 3.0, (level, first, final)
    assert sum(wrong[("A", level)][1] for level in range(4)) < sum(wrong[("A", level)][0] for level in range(4))


def _smooth_image(size: tuple[int, int], seed: int = 0):
    """Upsampled noise: every region differs, yet resampling routes agree closely."""
    import numpy as np
    from PIL import Image

    small = (np.random.default_rng(seed).random((size[1] // 16, size[0] // 16, 3)) * 255).astype(np.uint8)
    return Image.fromarray(small).resize(size, Image.BICUBIC)


def _centre_cropping_clip(side: int):
    from transformers import CLIPImageProcessorPil

    return CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side},
                                 image_mean=[0.5] * 3, image_std=[0.5] * 3)


@pytest.mark.parametrize("size", [(640, 480), (480, 640)], ids=["wide", "tall"])
def test_a_view_reaches_a_centre_cropping_processor_whole(size):
    """LLaVA-1.5's processor cuts the centre square of what it is given. A square view
    stretched to a 640 x 480 original's size lost 12.5% of its width on each side there;
    framed by ``view_image(..., shown)`` the processor keeps exactly the view, as it would
    the view cut alone -- in the middle, at the image's edge and corner, and for a view
    clipped to the image. Processors that keep everything get the plain resize, unchanged."""
    from PIL import Image

    from evaluators.world.views import cut
    from hooks.layout import FULL, visible_box
    from mitigate.crop_verify import view_image, view_source

    image, clip = _smooth_image(size), _centre_cropping_clip(336)
    shown = visible_box(clip, size)
    assert shown != FULL
    pixels = lambda im: clip(images=[im], return_tensors="pt")["pixel_values"]
    w, h = size
    for box in [(300, 200, 400, 300), (0, 0, 100, 100), (w - 100, h - 100, w, h), (0, 0, min(size), min(size))]:
        alone = pixels(cut(image, box))
        framed = float((pixels(view_image(image, box, shown)) - alone).abs().mean())
        stretched = float((pixels(view_image(image, box)) - alone).abs().mean())
        assert framed < 0.02 and stretched > 0.1, (box, framed, stretched)
    assert view_image(image, (10, 10, 50, 50), FULL).tobytes() == \
        cut(image, (10, 10, 50, 50)).resize(size, Image.BICUBIC).tobytes()
    # the frame: the window over the shown fraction; a padding processor's shown is clipped
    assert view_source((300, 200, 400, 300), (0.125, 0.0, 0.875, 1.0)) == pytest.approx((283.333, 200, 416.667, 300), abs=1e-3)
    assert view_source((0, 0, 100, 100), (0.0, -0.1, 1.0, 1.1)) == (0, 0, 100, 100)
    with pytest.raises(ValueError, match="shown"):
        view_source((0, 0, 10, 10), (0.5, 0.0, 0.5, 1.0))


def _tower_pixels(model):
    """A hook group recording every pixel tensor the vision tower receives, in call order."""
    seen: list[torch.Tensor] = []

    def record(module, args, kwargs):
        seen.append((args[0] if args else kwargs["pixel_values"]).detach().clone())

    group = HookGroup("tower pixels")
    group.add_forward_pre_hook(resolve(model).vision_encoder, record)
    return group, seen


def test_answer_asks_a_centre_cropping_processor_the_whole_view(organism_like):
    """``CropVerify.answer`` on a processor that cuts the centre square (the organism's
    architecture with LLaVA-1.5's kind of preprocessing): the tower receives each view as the
    view cut alone would reach it, not its middle."""
    import copy

    from PIL import Image

    from evaluators.world.views import cluster_box, crop_box, cut

    model, processor, _ = organism_like
    processor = copy.deepcopy(processor)
    processor.image_processor = _centre_cropping_clip(32)
    image = _smooth_image((160, 96), seed=3)
    box = (112.0, 40.0, 140.0, 68.0)  # near the right edge, where the centre square ends (128)
    cv = CropVerify(processor, gate=1.0, tau=0.0, localizer=lambda im, p: box)
    group, seen = _tower_pixels(model)
    with group:
        (result,) = cv.answer(model, [image], ["is there a dog in the image ? answer yes or no ."], max_new_tokens=1)
    if not result["verified"]:
        pytest.skip("the random model answered yes: nothing to verify")
    views = seen[-1]  # the views' rows, in cv.views order
    expected = [crop_box(box, 160, 96, cv.margin), cluster_box(box, [], 160, 96, cv.margin)]
    assert len(views) == len(cv.views) == 2
    assert expected[1] == (0.0, 0.0, 160.0, 96.0)  # the Cluster view, clipped to the image: not square
    for got, view_box in zip(views, expected):
        # a view that cannot be square is squashed into the kept square, all of it shown
        # (the object at x 112-140 lies outside the image's own centre square, x 32-128)
        alone = cut(image, view_box).resize((96, 96), Image.BICUBIC)
        alone = processor.image_processor(images=[alone], return_tensors="pt")["pixel_values"][0]
        assert float((got - alone).abs().mean()) < 0.05, view_box


def test_the_shown_part_needs_no_hook_points_where_the_processor_shows_everything(organism_like):
    """A caller's detector boxes need no hook points: where the processor keeps the whole
    image (the organism's), the views' frame is found without resolving the model -- a
    model the hooks refuse (a llava checkpoint on a Pixtral tower) keeps crop-and-verify
    with a localizer; a centre-cropping processor resolves it for its token layout."""
    import copy

    from hooks.layout import FULL

    _, processor, images = organism_like
    cv = CropVerify(processor, localizer=lambda im, p: (0, 0, 8, 8))
    assert cv.shown_for(object(), images) == [FULL] * len(images)  # not a model: never resolved
    cropping = copy.deepcopy(processor)
    cropping.image_processor = _centre_cropping_clip(32)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        CropVerify(cropping).shown_for(object(), [_smooth_image((160, 96))])
