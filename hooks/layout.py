"""Where each image token sits in the image: token layouts, one per family, as a registry.

A VLM's image tokens are not always one square grid. This module maps the image tokens of
one batch row (in ``input_ids`` order, as :meth:`hooks.ModelPoints.image_token_mask`
finds them) back to the image, as a list of :class:`Region`: a block of tokens laid out as
a ``rows x cols`` raster covering a box of the *original* image (fractions of its width and
height). Tokens in no region (a CLS token, LLaVA-NeXT's newline column) carry no place.

The adapter names its family's layout (``token_layout`` in ``hooks/adapters/*.json``);
each layout is a function in :data:`LAYOUTS` reading only the model config and the
processor's per-image inputs:

* ``grid`` -- a square of ``g x g`` tokens, after a leading CLS token when there is one
  (LLaVA 1.5 with the "full" feature strategy, PaliGemma, Gemma 3 without pan-and-scan).
* ``qwen_thw`` -- Qwen2/2.5/3-VL's dynamic resolution: ``image_grid_thw`` (t, h, w) patches
  over ``vision_config.spatial_merge_size``; the processor resizes the whole image to a
  multiple of the patch, so the raster covers all of it.
* ``pixtral`` -- a Pixtral tower (Mistral 3's, and Pixtral-12B's ``llava`` variant, whose
  config has no ``spatial_merge_size``: no merge, 16 px patches): ``image_sizes`` (the
  resized height and width) over ``patch_size x spatial_merge_size``; row-break tokens are
  not image tokens.
* ``anyres`` -- LLaVA-NeXT / OneVision: the base image (the whole image squashed to the
  tower's square) then the high-resolution tiles' patches, unpadded back to the image's
  aspect ratio, with one newline token closing each row. The tile grid and the unpadding
  are computed with transformers' own ``get_anyres_image_grid_shape`` / ``unpad_image``;
  OneVision's ``anyres_max_N`` down-sampling follows its ``pack_image_features``. An image
  so thin that unpadding leaves no column (or row) of tiles -- 20 x 1000 pixels -- keeps
  only the base image's place (its newline tokens have none).
* ``tiles`` -- Idefics3 / SmolVLM, InternVL and Aya Vision: ``k`` equal tiles of ``t`` tokens each
  (``t`` = the tower's patch grid over the pixel-shuffle factor), row-major, then one
  global image (thumbnail) of the whole image when ``k > 1``. Neither family passes the
  tile grid to the model, so ``rows x cols`` is the factorisation of ``k - 1`` whose
  aspect ratio is closest (in log ratio) to the image's: InternVL chooses its grid that
  way among all candidates, and Idefics3's grid (the image resized to a longest edge,
  rounded up to whole tiles) agrees with it for every aspect ratio we checked. Pass the
  original image's size for tiled layouts; without it a square grid is assumed, and a
  non-square tile count is an error.

* ``patch_positions`` -- Gemma 4's variable resolution: the processor resizes the whole
  image to a patch grid whose (x, y) it passes per patch (``image_position_ids``, -1 on
  padding), and the tower average-pools ``k x k`` patches into one token in raster order
  (``Gemma4VisionPooler``: token = x // k + (width // k) * (y // k)), ``k`` the square root
  of patches per token.

Every layout checks that its regions account for exactly the row's image tokens and
raises a ``ValueError`` saying what it expected otherwise -- a wrong map would silently
localise the wrong place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .errors import unknown

Box = tuple[float, float, float, float]
FULL: Box = (0.0, 0.0, 1.0, 1.0)


@dataclass(frozen=True)
class Region:
    """``rows x cols`` image tokens in raster order, starting at ``start`` among the row's
    image tokens, ``stride`` tokens per raster row (``cols`` plus any trailing newline
    tokens), covering ``box`` = (x0, y0, x1, y1) as fractions of the original image;
    ``trailing`` tokens without a place follow the last row (LLaVA-NeXT's one newline
    after an untiled image)."""

    start: int
    rows: int
    cols: int
    stride: int
    box: Box = FULL
    trailing: int = 0

    def __post_init__(self) -> None:
        if self.rows < 1 or self.cols < 1 or self.stride < self.cols or self.start < 0 or self.trailing < 0:
            raise ValueError(f"invalid region {self}")

    @property
    def end(self) -> int:
        """One past the last token of the region (newlines and trailing tokens included)."""
        return self.start + self.rows * self.stride + self.trailing

    def indices(self) -> torch.Tensor:
        """``(rows, cols)`` indices of the region's tokens among the row's image tokens."""
        r = torch.arange(self.rows)[:, None] * self.stride
        return self.start + r + torch.arange(self.cols)[None, :]


#: layout name -> ``fn(config, n_tokens, inputs, row, image_size) -> list[Region]``
LAYOUTS: dict[str, Callable[..., list[Region]]] = {}


def register_layout(name: str):
    """Decorator: add a token layout under ``name`` (an adapter's ``token_layout``)."""
    def add(fn):
        LAYOUTS[name] = fn
        return fn
    return add


def token_regions(layout: str, config: Any, n_tokens: int, inputs: dict | None = None, row: int = 0,
                  image_size: tuple[int, int] | None = None, image_count_inputs: tuple[str, ...] = ()) -> list[Region]:
    """The regions of one row's ``n_tokens`` image tokens under ``layout``.

    ``inputs``: the processor's output (per-image tensors such as ``image_grid_thw``,
    ``image_sizes``); ``row`` the batch row, holding one image; ``image_size`` the original
    image's ``(width, height)`` (needed by tiled layouts); ``image_count_inputs`` the
    adapter's inputs that hold one entry per image, on which one image per row is checked."""
    if layout not in LAYOUTS:
        raise ValueError(unknown("token layout", layout, LAYOUTS))
    if n_tokens < 1:
        raise ValueError(f"row {row} has no image tokens to map")
    _one_image_per_row(inputs or {}, row, image_count_inputs)
    regions = LAYOUTS[layout](config, n_tokens, inputs or {}, row, image_size)
    end = max(r.end for r in regions)
    if end != n_tokens:
        raise ValueError(f"{layout} layout: regions account for {end} image tokens, the row has {n_tokens}")
    return regions


def visible_box(image_processor: Any, image_size: tuple[int, int], layout: str = "grid") -> Box:
    """The part of an original image of ``image_size`` = (width, height) that ``image_processor``'s
    output shows, as fractions of the image (:data:`FULL` for most processors), for a family
    whose tokens follow ``layout``. Only the ``grid`` layout's single square reads a centre
    crop or a pad: LLaVA-NeXT's processor also carries ``do_center_crop``, but its AnyRes
    tiles cover the whole image (the ``anyres`` layout maps them), so other layouts get
    :data:`FULL`.

    CLIP-style processors (LLaVA 1.5's, ViP-LLaVA's, Video-LLaVA's: ``do_center_crop`` with a
    ``crop_size``) resize the short side to ``size["shortest_edge"]`` -- or to
    ``size["height"] x size["width"]`` -- and cut the centre: a 640 x 480 photo reaches
    LLaVA-1.5's tower as its central 480 x 480, and the layout's grid covers that square, not
    the photo. Where the crop is larger than the resized image the processor pads, and the
    box reaches past the image (fractions below 0 or above 1). Computed as transformers'
    ``get_resize_output_image_size`` (``default_to_square=False``) and ``center_crop`` do.

    A processor that pads to a square first (``LlavaImageProcessor(do_pad=True)``, LLaVA-1.5's
    original "pad" preprocessing: ``do_pad`` with a ``pad_to_square`` method) shows the whole
    image inside the square of its long side, centred as ``pad_to_square`` places it: the
    640 x 480 photo's grid covers (0, -1/6, 1, 7/6)."""
    width, height = image_size
    if width < 1 or height < 1:
        raise ValueError(f"image_size must be positive, got {image_size}")
    if layout not in LAYOUTS:
        raise ValueError(unknown("token layout", layout, LAYOUTS))
    if image_processor is None or layout != "grid":
        return FULL
    frame_w, frame_h, left, top = width, height, 0, 0  # the image the resize and crop act on
    if getattr(image_processor, "do_pad", False) and callable(getattr(image_processor, "pad_to_square", None)) \
            and width != height:
        side = max(width, height)
        frame_w, frame_h, left, top = side, side, (side - width) // 2, (side - height) // 2
    box = _crop_of(image_processor, frame_w, frame_h)
    if box is None:
        return FULL
    if (frame_w, frame_h) == (width, height):
        return box
    # from fractions of the padded square to fractions of the image inside it
    return ((box[0] * frame_w - left) / width, (box[1] * frame_h - top) / height,
            (box[2] * frame_w - left) / width, (box[3] * frame_h - top) / height)


def _crop_of(image_processor: Any, width: int, height: int) -> Box | None:
    """The part of a ``width`` x ``height`` image a resize and centre crop keep (fractions),
    :data:`FULL` where the processor does not crop, None where its resize rule is not one
    we model (``longest_edge`` ...): say nothing rather than guess."""
    crop = getattr(image_processor, "crop_size", None)
    if not getattr(image_processor, "do_center_crop", False) or not crop:
        return FULL
    size = getattr(image_processor, "size", None) or {}
    if not getattr(image_processor, "do_resize", True) or not size:
        resized_w, resized_h = width, height
    elif "shortest_edge" in size:
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = size["shortest_edge"], int(size["shortest_edge"] * long / short)
        resized_w, resized_h = (new_short, new_long) if width <= height else (new_long, new_short)
    elif "height" in size and "width" in size:
        resized_w, resized_h = size["width"], size["height"]
    else:
        return None
    crop_w, crop_h = crop["width"], crop["height"]
    top, left = (resized_h - crop_h) // 2, (resized_w - crop_w) // 2
    return (left / resized_w, top / resized_h, (left + crop_w) / resized_w, (top + crop_h) / resized_h)


def within(regions: list[Region], box: Box) -> list[Region]:
    """``regions`` (boxes as fractions of what the processor showed) with their boxes as
    fractions of the original image, ``box`` being where the shown part lies in it
    (:func:`visible_box`)."""
    if box == FULL:
        return regions
    bx0, by0, bx1, by1 = box
    w, h = bx1 - bx0, by1 - by0
    return [Region(r.start, r.rows, r.cols, r.stride,
                   (bx0 + r.box[0] * w, by0 + r.box[1] * h, bx0 + r.box[2] * w, by0 + r.box[3] * h), r.trailing)
            for r in regions]


def content_indices(regions: list[Region]) -> torch.Tensor:
    """Sorted indices of the tokens that lie in some region (CLS and newlines left out)."""
    return torch.cat([r.indices().flatten() for r in regions]).unique()


def _row_entry(inputs: dict, name: str, row: int):
    """Row ``row``'s entry of the processor's per-image input ``name``, with a clear error."""
    value = inputs.get(name)
    if value is None:
        raise ValueError(f"this layout needs the processor's {name!r} to place image tokens; pass the processor output")
    if row >= len(value):
        raise ValueError(f"{name!r} has {len(value)} entries, no entry for row {row} (one image per row)")
    return value[row]


def _per_image(inputs: dict, name: str, row: int) -> list[int]:
    return [int(v) for v in _row_entry(inputs, name, row)]


def _vision(config: Any, name: str):
    value = getattr(getattr(config, "vision_config", None), name, None)
    if value is None:
        raise ValueError(f"config.vision_config has no {name!r}; cannot place image tokens")
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _one_image_per_row(inputs: dict, row: int, image_count_inputs: tuple[str, ...]) -> None:
    """A clear error where the processor's output shows more than one image in a row, or
    images and rows that do not pair up: every layout maps one image's tokens, per-image
    entries are read by row, and several images' tokens can add up to a count that fits a
    layout (four LLaVA images of 16 tokens make one 8x8 "grid"). Where no input holds an
    entry per image (Idefics3 / SmolVLM, InternVL, Aya Vision: their pixels count tiles),
    two images in one row cannot be told from one tiled image here: the id of the token that
    marks each image is the tokenizer's, not the config's."""
    crops = inputs.get("num_crops")  # Gemma 3's pan-and-scan: the image plus its crops
    if crops is not None and row < len(crops):
        n = crops[row]
        n = int(n.sum()) if hasattr(n, "sum") else int(sum(n) if isinstance(n, (list, tuple)) else n)
        if n > 0:
            raise ValueError(f"row {row} holds its image and {n} pan-and-scan crops; image-token positions are "
                             "mapped for one image per row (do_pan_and_scan=False)")
    ids = inputs.get("input_ids")
    if not (isinstance(ids, torch.Tensor) and ids.dim() == 2):
        return
    for name in image_count_inputs:
        value = inputs.get(name)
        if value is not None and len(value) != ids.shape[0]:
            # Gemma3Processor drops num_crops from its output, so its pan-and-scan crops show here
            hint = ("; crops a processor adds to an image count as images (Gemma 3's pan-and-scan: "
                    "do_pan_and_scan=False)") if len(value) > ids.shape[0] else ""
            raise ValueError(f"{len(value)} images for {ids.shape[0]} rows ({name!r} has an entry per image): "
                             f"image-token positions are mapped for one image per row, each row with its image{hint}")


@register_layout("unknown")
def _unknown(config, n_tokens, inputs, row, image_size) -> list[Region]:
    """An architecture known only by introspection: where its image tokens lie is not known
    (a perceiver's latents have no place at all), so nothing is guessed."""
    raise ValueError(f"model_type {getattr(config, 'model_type', None)!r} has no adapter stating where its image "
                     "tokens lie in the image; add hooks/adapters/<model_type>.json with its token_layout")


@register_layout("grid")
def _grid(config, n_tokens, inputs, row, image_size) -> list[Region]:
    for skip in (0, 1):
        side = math.isqrt(n_tokens - skip)
        if side > 0 and side * side == n_tokens - skip:
            return [Region(skip, side, side, side)]
    raise ValueError(
        f"cannot map {n_tokens} image tokens to a square grid (nor one after a CLS token); several images in "
        "one row, or a tiled input under a grid adapter? Pass boxes from a detector instead")


@register_layout("qwen_thw")
def _qwen(config, n_tokens, inputs, row, image_size) -> list[Region]:
    t, h, w = _per_image(inputs, "image_grid_thw", row)
    merge = _vision(config, "spatial_merge_size")
    if t != 1:
        raise ValueError(f"image_grid_thw row {row} has t={t}: a video, not an image")
    return [Region(0, h // merge, w // merge, w // merge)]


@register_layout("pixtral")
def _pixtral(config, n_tokens, inputs, row, image_size) -> list[Region]:
    height, width = _per_image(inputs, "image_sizes", row)
    step = _vision(config, "patch_size") * int(getattr(config, "spatial_merge_size", 1) or 1)
    return [Region(0, height // step, width // step, width // step)]


@register_layout("anyres")
def _anyres(config, n_tokens, inputs, row, image_size) -> list[Region]:
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

    side = _vision(config, "image_size") // _vision(config, "patch_size")
    if n_tokens <= side * side + 1:  # one tile: the base image (and a newline)
        return [Region(0, side, side, side, trailing=max(0, n_tokens - side * side))]
    base = Region(0, side, side, side)
    size = _per_image(inputs, "image_sizes", row)  # (height, width) of the original image
    tiles_h, tiles_w = get_anyres_image_grid_shape(size, config.image_grid_pinpoints, _vision(config, "image_size"))
    _, rows, cols = unpad_image(torch.empty(1, tiles_h * side, tiles_w * side), size).shape
    aspect = getattr(config, "vision_aspect_ratio", None)  # OneVision: "anyres_max_9"
    if isinstance(aspect, str) and aspect.startswith("anyres_max_"):
        ratio = math.sqrt(rows * cols / (int(aspect[len("anyres_max_"):]) * side * side))
        if ratio > 1.1:  # the same rule as LlavaOnevisionModel.pack_image_features
            rows, cols = int(rows // ratio), int(cols // ratio)
    newline = (n_tokens - side * side) - rows * cols  # one per row when the model has image_newline
    if newline not in (0, rows):
        raise ValueError(f"anyres layout: expected {side * side} base tokens and a {rows} x {cols} grid "
                         f"(+{rows} newlines), the row has {n_tokens} image tokens")
    if rows == 0 or cols == 0:  # an extreme aspect ratio unpads to nothing: the newlines alone, no place
        return [Region(0, side, side, side, trailing=newline)]
    return [base, Region(side * side, rows, cols, cols + (1 if newline else 0))]


def _tile_grid(count: int, image_size: tuple[int, int] | None) -> tuple[int, int]:
    """``(rows, cols)`` with ``rows * cols == count``, closest to the image's aspect ratio."""
    pairs = [(count // c, c) for c in range(1, count + 1) if count % c == 0]
    if image_size is None:
        side = math.isqrt(count)
        if side * side != count:
            raise ValueError(f"{count} tiles: pass the image's size to tell the tile grid ({pairs})")
        return side, side
    width, height = image_size
    return min(pairs, key=lambda rc: (abs(math.log(rc[1] / rc[0]) - math.log(width / height)), rc[0]))


@register_layout("tiles")
def _tiles(config, n_tokens, inputs, row, image_size) -> list[Region]:
    side = _vision(config, "image_size") // _vision(config, "patch_size")
    if getattr(config, "scale_factor", None):  # Idefics3 / SmolVLM pixel shuffle
        side //= int(config.scale_factor)
    elif getattr(config, "downsample_ratio", None):  # InternVL pixel shuffle
        side = int(side * float(config.downsample_ratio))
    elif getattr(config, "downsample_factor", None):  # Aya Vision pixel shuffle
        side //= int(config.downsample_factor)
    per = side * side
    if n_tokens % per:
        raise ValueError(f"tiles layout: {n_tokens} image tokens are not whole tiles of {per}")
    count = n_tokens // per
    if count == 1:
        return [Region(0, side, side, side)]
    rows, cols = _tile_grid(count - 1, image_size)
    regions = [Region(per * (r * cols + c), side, side, side, (c / cols, r / rows, (c + 1) / cols, (r + 1) / rows))
               for r in range(rows) for c in range(cols)]
    return regions + [Region(per * (count - 1), side, side, side)]  # the global image / thumbnail, last


@register_layout("patch_positions")
def _patch_positions(config, n_tokens, inputs, row, image_size) -> list[Region]:
    # integer bookkeeping, wherever the inputs live
    positions = torch.as_tensor(_row_entry(inputs, "image_position_ids", row), device="cpu")
    real = positions[(positions != -1).all(-1)]
    if len(real) == 0 or len(real) % n_tokens:
        raise ValueError(f"row {row}: {len(real)} patches cannot pool into {n_tokens} image tokens")
    kernel = math.isqrt(len(real) // n_tokens)
    width, height = int(real[:, 0].max()) + 1, int(real[:, 1].max()) + 1
    if kernel * kernel * n_tokens != len(real) or width % kernel or height % kernel:
        raise ValueError(f"row {row}: a {width}x{height} patch grid does not pool into {n_tokens} tokens")
    return [Region(0, height // kernel, width // kernel, width // kernel)]
