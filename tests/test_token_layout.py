"""hooks.layout: each family's image tokens map back to the right place of the original image.

The end-to-end check runs the family's own transformers image processor (resizing, AnyRes
tiling and unpadding, Idefics3 / InternVL splitting, Qwen's patch packing) on a real PIL
image, takes the rows the decoder receives (the model's ``get_image_features``) with the
vision tower's self-attention silenced -- so a token's features depend on its own patches
only, as the layout claims, and random attention cannot carry the change elsewhere --,
paints a white square into the image and asks: in every region of the layout that holds most of the
square, does the token whose features changed most lie, by the layout, on the square? A
transposed grid, a wrong tile order or a wrong unpadding puts it cells away.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from hooks import HookGroup, get_adapter, register_adapter, resolve
from hooks.layout import FULL, LAYOUTS, Region, _tile_grid, content_indices, token_regions, visible_box, within
from hooks.testing import (
    TINY_MODEL_TYPES, build_tiny_model, tiny_adapter, tiny_config, tiny_image_features, tiny_image_processor,
    tiny_preprocess,
)

SQUARE = 16  # pixels


def _most_changed_cell(region: Region, changed: torch.Tensor, size: tuple[int, int]) -> tuple[float, ...]:
    """The pixel box the layout gives the token of ``region`` whose features changed most."""
    width, height = size
    k = int(changed[region.indices().flatten()].argmax())
    i, j = divmod(k, region.cols)
    x0, y0, x1, y1 = region.box
    cell_w, cell_h = (x1 - x0) * width / region.cols, (y1 - y0) * height / region.rows
    return x0 * width + j * cell_w, y0 * height + i * cell_h, x0 * width + (j + 1) * cell_w, y0 * height + (i + 1) * cell_h


def _silence_tower_attention(model, group: HookGroup) -> None:
    """Every attention module of the vision tower outputs zeros (its residual keeps the token)."""
    def zero(module, args, kwargs, output):
        if isinstance(output, tuple):
            return (torch.zeros_like(output[0]), *output[1:])
        return torch.zeros_like(output)

    for name, module in resolve(model).vision_encoder.named_modules():
        if type(module).__name__.endswith("Attention"):
            group.add_forward_hook(module, zero)


def _overlap(a, b) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


@pytest.mark.parametrize("size", [(96, 64), (64, 96)], ids=["landscape", "portrait"])
@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_tokens_map_to_where_the_image_changed(model_type, size):
    model = build_tiny_model(model_type)
    with HookGroup("silence") as group:
        _silence_tower_attention(model, group)
        _check_layout(model_type, model, size)


def _check_layout(model_type, model, size, processor=None) -> None:
    processor = processor or tiny_image_processor(model_type)
    points = resolve(model)
    width, height = size
    # where the processor's output lies in the image: all of it, or a CLIP processor's centre
    # crop (Video-LLaVA's): the squares go inside it, and the regions are placed in it
    sx0, sy0, sx1, sy1 = visible_box(processor, size, points.adapter.token_layout)
    left, top, right, bottom = round(sx0 * width), round(sy0 * height), round(sx1 * width), round(sy1 * height)
    w, h = right - left, bottom - top
    blank = Image.new("RGB", size, (128, 128, 128))
    before = tiny_image_features(model, tiny_preprocess(model_type, [blank], processor))
    checked = 0
    for x, y in [(left + 6, top + 6), (right - 20, bottom - 20), (left + int(0.42 * w), top + int(0.38 * h)),
                 (right - 20, top + 6)]:
        image = blank.copy()
        image.paste((255, 255, 255), (x, y, x + SQUARE, y + SQUARE))
        enc = dict(tiny_preprocess(model_type, [image], processor))
        changed = (tiny_image_features(model, enc) - before).norm(dim=-1)
        regions = within(points.token_regions(len(changed), enc, 0, size), (sx0, sy0, sx1, sy1))
        square = (x, y, x + SQUARE, y + SQUARE)
        for region in regions:
            x0, y0, x1, y1 = region.box
            if _overlap(square, (x0 * width, y0 * height, x1 * width, y1 * height)) >= SQUARE * SQUARE / 2:
                cell = _most_changed_cell(region, changed, size)
                assert _overlap(cell, square) > 0, f"{model_type} {size}: square {square}, region {region}: cell {cell}"
                checked += 1
    assert checked >= 4  # every square was in some region


def test_onevision_images_of_more_than_nine_tiles_are_pooled_and_still_mapped():
    """LLaVA-OneVision's checkpoints tile up to 6 x 6 (``anyres_max_9``): past nine tiles the
    model pools the high-resolution tokens down (bilinear) before adding the newlines, a
    branch the tiny spec's 2 x 2 pinpoints never reach. With the checkpoints' grid of
    pinpoints scaled to the tiny tile, a 190 x 170 image takes 6 x 6 tiles, the layout's
    token count equals the model's and a painted square lands on the tokens that changed."""
    pins = [[32 * i, 32 * j] for i in range(1, 7) for j in range(1, 7)]
    model = build_tiny_model("llava_onevision")
    model.config.image_grid_pinpoints = pins
    processor = tiny_image_processor("llava_onevision")
    processor.image_grid_pinpoints = pins
    size = (190, 170)
    enc = dict(tiny_preprocess("llava_onevision", [Image.new("RGB", size, (120, 30, 200))], processor))
    assert enc["pixel_values"].shape[1] == 1 + 36  # the base image and 6 x 6 tiles
    n_tokens = len(tiny_image_features(model, enc))
    regions = resolve(model).token_regions(n_tokens, enc, 0, size)
    assert max(r.end for r in regions) == n_tokens
    per_tile = (model.config.vision_config.image_size // model.config.vision_config.patch_size) ** 2
    assert n_tokens < (1 + 36) * per_tile  # fewer than the base image's and the tiles' patches: pooled
    with HookGroup("silence") as group:
        _silence_tower_attention(model, group)
        _check_layout("llava_onevision", model, size, processor)


@pytest.mark.parametrize("size", [(20, 1000), (1000, 20), (21, 1000)], ids=["tall", "wide", "tall-odd"])
@pytest.mark.parametrize("model_type", ["llava_next", "llava_onevision"])
def test_anyres_images_that_unpad_to_nothing_keep_their_base_image(model_type, size):
    """An image so thin that unpadding leaves no column of high-resolution tokens (20 x 1000
    on the tiny tiles) gives the model only the base image and a newline per row: the layout
    maps that (it built a Region with cols=0, a ValueError) from the family's own processor's
    output and the model's own token count."""
    model = build_tiny_model(model_type)
    enc = dict(tiny_preprocess(model_type, [Image.new("RGB", size, (120, 30, 200))]))
    n_tokens = len(tiny_image_features(model, enc))
    regions = resolve(model).token_regions(n_tokens, enc, 0, size)
    assert max(r.end for r in regions) == n_tokens and all(r.rows > 0 and r.cols > 0 for r in regions)
    side = model.config.vision_config.image_size // model.config.vision_config.patch_size
    assert regions[0] == Region(0, side, side, side, trailing=regions[0].trailing)


def test_region_indices_skip_newlines_and_cls():
    region = Region(start=1, rows=2, cols=3, stride=4)
    assert region.indices().tolist() == [[1, 2, 3], [5, 6, 7]]
    assert region.end == 9
    assert content_indices([Region(0, 2, 2, 2), region]).tolist() == [0, 1, 2, 3, 5, 6, 7]
    with pytest.raises(ValueError, match="invalid region"):
        Region(start=0, rows=2, cols=3, stride=2)


def test_grid_layout():
    assert token_regions("grid", None, 65) == [Region(1, 8, 8, 8)]  # LLaVA "full": CLS + 8 x 8
    assert token_regions("grid", None, 64) == [Region(0, 8, 8, 8)]
    with pytest.raises(ValueError, match="detector"):
        token_regions("grid", None, 70)


def test_tile_grid_follows_the_aspect_ratio():
    # Idefics3 resizes the long side to 4 tiles and rounds the short side up to whole tiles
    assert _tile_grid(12, (1000, 600)) == (3, 4)
    assert _tile_grid(8, (1560, 400)) == (2, 4)
    assert _tile_grid(4, (1000, 200)) == (1, 4)
    assert _tile_grid(4, (200, 1000)) == (4, 1)
    assert _tile_grid(16, (1050, 1000)) == (4, 4)
    assert _tile_grid(9, None) == (3, 3)
    with pytest.raises(ValueError, match="size"):
        _tile_grid(6, None)


def test_layouts_say_what_they_expected():
    with pytest.raises(ValueError, match="unknown token layout"):
        token_regions("hexagons", None, 16)
    with pytest.raises(ValueError, match="no image tokens"):
        token_regions("grid", None, 0)
    with pytest.raises(ValueError, match="whole tiles of 16"):
        token_regions("tiles", tiny_config("idefics3"), 20)
    with pytest.raises(ValueError, match="image_grid_thw"):
        token_regions("qwen_thw", tiny_config("qwen2_vl"), 6, {})
    with pytest.raises(ValueError, match="regions account for 6 image tokens, the row has 8"):
        token_regions("qwen_thw", tiny_config("qwen2_vl"), 8, {"image_grid_thw": torch.tensor([[1, 4, 6]])})
    with pytest.raises(ValueError, match="video"):
        token_regions("qwen_thw", tiny_config("qwen2_vl"), 6, {"image_grid_thw": torch.tensor([[2, 4, 6]])})
    config = tiny_config("llava_next")
    # one tile: the base image and its single newline (a trailing token with no place)
    assert token_regions("anyres", config, 17) == [Region(0, 4, 4, 4, trailing=1)]
    with pytest.raises(ValueError, match="account for 16 image tokens, the row has 15"):
        token_regions("anyres", config, 15)
    with pytest.raises(ValueError, match="anyres layout: expected 16 base tokens"):
        token_regions("anyres", config, 16 + 50, {"image_sizes": torch.tensor([[40, 64]])})


def test_every_table_adapter_names_a_known_layout():
    for model_type in TINY_MODEL_TYPES:
        assert tiny_adapter(model_type).token_layout in LAYOUTS
    data = {**get_adapter("llava").to_dict(), "model_type": "llava_hex", "token_layout": "hexagons"}
    data.pop("source")
    with pytest.raises(ValueError, match="token_layout 'hexagons'"):
        register_adapter(data)


@pytest.mark.parametrize("size", [(160, 64), (64, 160)], ids=["wide", "tall"])
@pytest.mark.parametrize("model_type", ["llava", "vipllava", "video_llava"])
def test_a_centre_cropping_processor_shows_the_grid_the_middle_of_the_image(model_type, size):
    """LLaVA-1.5's, ViP-LLaVA's and Video-LLaVA's real processors resize the short side and
    cut the centre: a 160 x 64 image reaches the tower as its middle 64 x 64, and the grid
    covers that square. ``visible_box`` says where it lies; mapped through it, a square near
    the crop's right (or bottom) edge lands on the tokens that changed -- mapped over the
    whole image it lands a cell away (checked when this test was written)."""
    from transformers import CLIPImageProcessor

    model = build_tiny_model(model_type)
    points = resolve(model)
    side = model.config.vision_config.image_size
    if model_type == "video_llava":
        processor = tiny_image_processor(model_type)
    else:
        processor = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    width, height = size
    box = visible_box(processor, size, points.adapter.token_layout)
    short = min(size)
    assert box == ((width - short) / 2 / width, (height - short) / 2 / height,
                   (width + short) / 2 / width, (height + short) / 2 / height)
    right, bottom = box[2] * width, box[3] * height
    x, y = (right - 4 - SQUARE, 24) if width > height else (24, bottom - 4 - SQUARE)
    with HookGroup("silence") as group:
        _silence_tower_attention(model, group)
        blank = Image.new("RGB", size, (128, 128, 128))
        before = tiny_image_features(model, tiny_preprocess(model_type, [blank], processor))
        image = blank.copy()
        image.paste((255, 255, 255), (int(x), int(y), int(x) + SQUARE, int(y) + SQUARE))
        enc = dict(tiny_preprocess(model_type, [image], processor))
        changed = (tiny_image_features(model, enc) - before).norm(dim=-1)
    regions = within(points.token_regions(len(changed), enc, 0, size), box)
    square = (x, y, x + SQUARE, y + SQUARE)
    assert _overlap(_most_changed_cell(regions[0], changed, size), square) > 0


@pytest.mark.parametrize("size", [(160, 64), (64, 160)], ids=["wide", "tall"])
def test_a_padding_processor_shows_the_grid_the_whole_image_in_its_square(size):
    """LLaVA-1.5's original "pad" preprocessing (``LlavaImageProcessor(do_pad=True)``) pads
    the image to the square of its long side before the resize and crop: the grid covers
    that square, the image a band across its middle. A square near the image's far edge
    lands on the tokens that changed when mapped through ``visible_box``; read as the
    processor's centre crop (as before the pad was modelled) it lands elsewhere."""
    from transformers import LlavaImageProcessorPil

    model = build_tiny_model("llava")
    points = resolve(model)
    side = model.config.vision_config.image_size
    processor = LlavaImageProcessorPil(do_pad=True, size={"shortest_edge": side}, crop_size={"height": side, "width": side},
                                       image_mean=[0.5] * 3, image_std=[0.5] * 3)
    width, height = size
    long, short = max(size), min(size)
    band = (long - short) / 2 / short
    box = visible_box(processor, size, points.adapter.token_layout)
    assert box == ((0.0, -band, 1.0, 1.0 + band) if width > height else (-band, 0.0, 1.0 + band, 1.0))
    x, y = (width - 4 - SQUARE, 40) if width > height else (40, height - 4 - SQUARE)
    with HookGroup("silence") as group:
        _silence_tower_attention(model, group)
        blank = Image.new("RGB", size, (128, 128, 128))
        before = tiny_image_features(model, processor(images=[blank], return_tensors="pt"))
        image = blank.copy()
        image.paste((255, 255, 255), (int(x), int(y), int(x) + SQUARE, int(y) + SQUARE))
        enc = dict(processor(images=[image], return_tensors="pt"))
        changed = (tiny_image_features(model, enc) - before).norm(dim=-1)
    square = (x, y, x + SQUARE, y + SQUARE)
    regions = points.token_regions(len(changed), enc, 0, size)
    assert _overlap(_most_changed_cell(within(regions, box)[0], changed, size), square) > 0
    centre = (0.3, 0.0, 0.7, 1.0) if width > height else (0.0, 0.3, 1.0, 0.7)  # the crop alone
    assert _overlap(_most_changed_cell(within(regions, centre)[0], changed, size), square) == 0


def test_visible_box_follows_the_processors_resize_and_crop():
    from transformers import CLIPImageProcessor, SiglipImageProcessor

    clip = CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    assert visible_box(clip, (640, 480)) == (0.125, 0.0, 0.875, 1.0)
    assert visible_box(clip, (480, 640)) == (0.0, 0.125, 1.0, 0.875)
    assert visible_box(clip, (500, 500)) == FULL
    assert visible_box(clip, (640, 480), "anyres") == FULL  # LLaVA-NeXT's tiles cover the whole image
    # a crop larger than the resized image pads: the grid reaches past the image
    padded = CLIPImageProcessor(size={"height": 100, "width": 100}, crop_size={"height": 120, "width": 100})
    assert visible_box(padded, (300, 300)) == (0.0, -0.1, 1.0, 1.1)
    assert visible_box(CLIPImageProcessor(do_center_crop=False), (640, 480)) == FULL
    assert visible_box(SiglipImageProcessor(), (640, 480)) == FULL
    assert visible_box(None, (640, 480)) == FULL
    with pytest.raises(ValueError, match="token layout"):
        visible_box(clip, (640, 480), "gird")
    with pytest.raises(ValueError, match="image_size"):
        visible_box(clip, (0, 480))
