"""Tiny random-weight vision-language models and matching dummy inputs.

Everything is built from a config: no weights, processors or tokenizers are downloaded.
Per-architecture facts live in ``tiny_configs/<name>.json``, where the name is the model
type, or for a variant of one on another vision tower a name of its own
(``llava_pixtral``: pixtral-12b's ``llava`` with a Pixtral tower; the spec's ``model_type``
says which type it builds, and :func:`tiny_spec_name` finds the spec of a built model):

* ``config``  -- kwargs for :func:`transformers.AutoConfig.for_model`;
* ``inputs``  -- how to build inputs: ``pixel_layout`` (a key of :data:`PIXEL_LAYOUTS`),
  ``pixel_inputs`` (the pixel/extra names the family's ``forward`` takes),
  ``image_sizes`` (``[height, width]`` per image, cycled over the batch), optional
  ``rename`` (a pixel input's name as the family's processor returns it, e.g. Video-LLaVA's
  ``pixel_values_images`` for ``pixel_values``), optional
  ``image_wrap`` (ids, or config attribute names, placed around each image's placeholder
  run), optional ``token_types`` (name and per-kind value of a token-type input) and
  ``prompt`` (segment order; ``"bos"``, ``"text"`` or ``"images"``);
* ``image_processor`` -- the family's transformers image processor (``class``) with
  ``kwargs`` sizing it for the tiny tower (:func:`tiny_image_processor`; the settings the
  family's checkpoints save), and optional ``call_kwargs``: what the family's *processor*
  adds at call time, which the saved image-processor config does not hold (InternVL's and
  Aya Vision's ``crop_to_patches``, Pixtral's patch size times the merge size;
  :func:`tiny_preprocess`).

The number of image placeholder tokens is never computed from a formula: :func:`tiny_inputs`
runs the model's own ``get_image_features`` on the pixel inputs -- the same call
``generate()`` makes before decoding -- and counts the feature vectors it returns.

    >>> model = build_tiny_model("llava")                    # doctest: +SKIP
    >>> inputs = tiny_inputs(model, batch_size=2, text_lengths=[3, 7])  # doctest: +SKIP
    >>> model(**inputs).logits.shape                         # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, PreTrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

__all__ = [
    "PIXEL_LAYOUTS",
    "TINY_MODEL_TYPES",
    "build_tiny_model",
    "tiny_config",
    "tiny_image_features",
    "tiny_image_processor",
    "tiny_inputs",
    "tiny_pixel_input_names",
    "tiny_preprocess",
    "tiny_spec",
    "tiny_spec_name",
    "tiny_adapter",
]

_CONFIG_DIR = Path(__file__).with_name("tiny_configs")
_TOKEN_ID_SUFFIXES = ("_token_id", "_token_ids", "_token_index")
_DEFAULT_TEXT_LENGTH = 6


# --------------------------------------------------------------------------- specs


@functools.cache
def _load_specs() -> dict[str, dict]:
    """All JSON specs whose ``model_type`` the installed transformers knows, by spec name
    (the file's stem: the model type, or a variant's own name)."""
    specs = {}
    for path in sorted(_CONFIG_DIR.glob("*.json")):
        spec = json.loads(path.read_text())
        spec.setdefault("model_type", path.stem)
        if spec["model_type"] in CONFIG_MAPPING:
            specs[path.stem] = spec
    return specs


#: every tiny spec's name: the model types, and variants of them on other towers
TINY_MODEL_TYPES: tuple[str, ...] = tuple(_load_specs())


def tiny_spec(name: str) -> dict:
    """A copy of the JSON spec ``name`` (``model_type``, ``config``, ``inputs``, ``notes``); module paths are in :mod:`hooks.adapters`."""
    specs = _load_specs()
    if name not in specs:
        raise ValueError(
            f"No tiny config for model_type {name!r}; known model types: {', '.join(specs) or '(none)'}"
        )
    return copy.deepcopy(specs[name])


def tiny_spec_name(config) -> str:
    """The name of the spec a model of ``config`` was built from: its model type's, or the
    variant's whose vision tower it has (``llava`` on a Pixtral tower: ``llava_pixtral``)."""
    vision = getattr(getattr(config, "vision_config", None), "model_type", None)
    names = [n for n, spec in _load_specs().items() if spec["model_type"] == config.model_type]
    for name in names:
        if name != config.model_type and _load_specs()[name]["config"].get("vision_config", {}).get("model_type") == vision:
            return name
    return config.model_type


def tiny_adapter(name: str):
    """The adapter :func:`hooks.resolve` uses for the tiny model ``name``: its model type's
    table, or that table's variant for the spec's vision tower."""
    from ..adapters import get_adapter

    spec = tiny_spec(name)
    return get_adapter(spec["model_type"]).for_vision(spec["config"].get("vision_config", {}).get("model_type"))


# --------------------------------------------------------------------------- models


def tiny_config(model_type: str, attn_implementation: str = "sdpa") -> PreTrainedConfig:
    """The tiny :class:`~transformers.PreTrainedConfig` for ``model_type``.

    Raises:
        ValueError: ``model_type`` has no JSON spec, or its config class is not installed.
    """
    spec = tiny_spec(model_type)
    return AutoConfig.for_model(spec["model_type"], attn_implementation=attn_implementation, **spec["config"])


def build_tiny_model(model_type: str, attn_implementation: str = "sdpa", seed: int = 0) -> PreTrainedModel:
    """A float32 random-weight ``AutoModelForImageTextToText`` in eval mode.

    Weights depend only on ``seed`` (the global RNG state of the caller is left untouched),
    so two calls with the same seed and different ``attn_implementation`` hold equal weights.
    """
    config = tiny_config(model_type, attn_implementation)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, attn_implementation=attn_implementation)
        # from_config zero-initialises a few matrices (Gemma3's mm_input_projection_weight,
        # InternVL's cls token and position embeddings). A zero projection makes every image
        # feature identically 0, which would hide wiring mistakes in tests: give them weights.
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() >= 2 and not param.any():
                    param.normal_(0.0, 0.02)
    return model.float().eval()


def tiny_image_processor(model_type: str):
    """The family's own image processor (from transformers, built from code: nothing is
    downloaded) sized for the tiny tower: the spec's ``image_processor`` ``class`` and
    ``kwargs``. Real preprocessing -- resizing, AnyRes tiling, Idefics3 / InternVL
    splitting, Qwen's patch packing -- on real PIL images, at the tiny model's scale."""
    import transformers

    spec = tiny_spec(model_type).get("image_processor")
    if spec is None:
        raise ValueError(f"the tiny spec of {model_type!r} names no image_processor")
    # the PIL backend (transformers' fallback when torchvision is absent), named directly so
    # that the result does not depend on whether torchvision happens to be installed
    cls = getattr(transformers, spec["class"] + "Pil", None) or getattr(transformers, spec["class"])
    return cls(**spec["kwargs"])


def tiny_preprocess(model_type: str, images: list, image_processor=None, **kwargs) -> dict:
    """The family's image preprocessing as its processor runs it: ``image_processor``
    (default :func:`tiny_image_processor`) called on ``images`` with the spec's
    ``call_kwargs`` -- the settings the family's processor adds that its image processor's
    saved config lacks -- and ``kwargs``; tensors returned."""
    image_processor = image_processor or tiny_image_processor(model_type)
    call = (tiny_spec(model_type).get("image_processor") or {}).get("call_kwargs", {})
    return image_processor(images=images, return_tensors="pt", **{**call, **kwargs})


def tiny_image_features(model: PreTrainedModel, pixel_inputs: dict) -> torch.Tensor:
    """``(n_tokens, dim)``: the rows the decoder receives at the image positions of the
    images in ``pixel_inputs`` (a processor's output), in order -- the model's own
    ``get_image_features``, packed as ``generate()`` packs them (AnyRes newlines included)."""
    return torch.cat([unit.reshape(-1, unit.shape[-1]) for unit in _feature_units(model, pixel_inputs)])


def _feature_units(model: PreTrainedModel, pixel_inputs: dict) -> list[torch.Tensor]:
    """``get_image_features(...).pooler_output`` as a list of units (images, tiles or samples)."""
    encoder = model.base_model.get_image_features
    accepted = inspect.signature(encoder).parameters
    kwargs = {name: value for name, value in pixel_inputs.items() if name in accepted}
    with torch.no_grad():
        pooled = encoder(**kwargs, return_dict=True).pooler_output
    return list(pooled) if isinstance(pooled, torch.Tensor) else pooled


# --------------------------------------------------------------------------- pixel layouts


class PixelLayout:
    """How one family lays out pixel inputs, and how its image features map back to images.

    ``build`` returns the pixel/extra input tensors for ``sizes`` (one ``(height, width)`` per
    image, sample-major). ``split`` turns the vector counts of the units returned by
    ``get_image_features(...).pooler_output`` into one count per image; by default a unit
    is an image.
    """

    def build(self, config, sizes, images_per_sample, generator, options) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def split(self, unit_counts, images_per_sample, options) -> list[int]:
        return list(unit_counts)


def _vision_size(config) -> int:
    size = config.vision_config.image_size
    return size[0] if isinstance(size, (list, tuple)) else size


def _channels(config) -> int:
    vision = config.vision_config
    return getattr(vision, "num_channels", None) or getattr(vision, "in_channels", 3)


def _uniform_size(sizes, config, layout_name) -> int:
    """The side of square, vision-sized images; layouts without size handling need exactly that."""
    side = _vision_size(config)
    if any(tuple(size) != (side, side) for size in sizes):
        raise ValueError(f"pixel layout {layout_name!r} needs every image to be {side}x{side}, got {sizes}")
    return side


class StandardLayout(PixelLayout):
    """``pixel_values``: ``(num_images, C, S, S)`` at the vision tower's own resolution."""

    def build(self, config, sizes, images_per_sample, generator, options):
        side = _uniform_size(sizes, config, "standard")
        return {"pixel_values": torch.randn(len(sizes), _channels(config), side, side, generator=generator)}


class TiledAnyResLayout(PixelLayout):
    """LLaVA-NeXT / OneVision AnyRes: ``(num_images, max_tiles, C, S, S)`` plus ``image_sizes``.

    Tile counts follow the image processor (base tile + best-fit grid from
    ``image_grid_pinpoints``). When the family takes ``batch_num_images`` and a sample has
    several images, the processor does not tile them: each gets the base tile only.
    """

    def build(self, config, sizes, images_per_sample, generator, options):
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

        side = _vision_size(config)
        tiled = images_per_sample == 1 or "batch_num_images" not in options["pixel_inputs"]
        tiles = [
            image_size_to_num_patches(list(size), config.image_grid_pinpoints, side) if tiled else 1 for size in sizes
        ]
        pixel_values = torch.zeros(len(sizes), max(tiles), _channels(config), side, side)
        for index, count in enumerate(tiles):
            pixel_values[index, :count] = torch.randn(count, _channels(config), side, side, generator=generator)
        batch_size = len(sizes) // images_per_sample
        return {
            "pixel_values": pixel_values,
            "image_sizes": torch.tensor(sizes, dtype=torch.long),
            "batch_num_images": torch.full((batch_size,), images_per_sample, dtype=torch.long),
        }


class QwenPatchesLayout(PixelLayout):
    """Qwen-VL: flattened patches ``(sum t*h*w, C * temporal_patch * P * P)`` plus ``image_grid_thw``."""

    def build(self, config, sizes, images_per_sample, generator, options):
        vision = config.vision_config
        patch, merge, temporal = vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size
        grids = []
        for height, width in sizes:
            if height % (patch * merge) or width % (patch * merge):
                raise ValueError(f"Qwen image size {height}x{width} must be a multiple of {patch * merge}")
            grids.append((1, height // patch, width // patch))
        total = sum(t * h * w for t, h, w in grids)
        return {
            "pixel_values": torch.randn(total, _channels(config) * temporal * patch * patch, generator=generator),
            "image_grid_thw": torch.tensor(grids, dtype=torch.long),
        }


class IdeficsImagesLayout(PixelLayout):
    """Idefics3 / SmolVLM: ``(batch, images, C, S, S)`` plus an all-ones ``pixel_attention_mask``.

    ``get_image_features`` returns one unit per *sample*; its images are identical in shape,
    so the sample's vectors are shared equally between them.
    """

    def build(self, config, sizes, images_per_sample, generator, options):
        side = _uniform_size(sizes, config, "idefics_images")
        batch_size = len(sizes) // images_per_sample
        shape = (batch_size, images_per_sample, _channels(config), side, side)
        return {
            "pixel_values": torch.randn(*shape, generator=generator),
            "pixel_attention_mask": torch.ones(batch_size, images_per_sample, side, side, dtype=torch.bool),
        }

    def split(self, unit_counts, images_per_sample, options):
        counts = []
        for sample_count in unit_counts:
            if sample_count % images_per_sample:
                raise ValueError(f"{sample_count} image vectors cannot be shared by {images_per_sample} images")
            counts += [sample_count // images_per_sample] * images_per_sample
        return counts


class PaddedSizesLayout(PixelLayout):
    """Pixtral / Mistral3: ``(num_images, C, H_max, W_max)`` zero-padded, plus true ``image_sizes``."""

    def build(self, config, sizes, images_per_sample, generator, options):
        max_height, max_width = max(h for h, _ in sizes), max(w for _, w in sizes)
        pixel_values = torch.zeros(len(sizes), _channels(config), max_height, max_width)
        for index, (height, width) in enumerate(sizes):
            pixel_values[index, :, :height, :width] = torch.randn(
                _channels(config), height, width, generator=generator
            )
        return {"pixel_values": pixel_values, "image_sizes": torch.tensor(sizes, dtype=torch.long)}


class InternVLTilesLayout(PixelLayout):
    """InternVL: ``(total_tiles, C, S, S)``, ``inputs.tiles_per_image`` tiles per image across the batch."""

    def build(self, config, sizes, images_per_sample, generator, options):
        side = _uniform_size(sizes, config, "internvl_tiles")
        tiles = len(sizes) * options.get("tiles_per_image", 1)
        return {"pixel_values": torch.randn(tiles, _channels(config), side, side, generator=generator)}

    def split(self, unit_counts, images_per_sample, options):
        per_image = options.get("tiles_per_image", 1)
        return [sum(unit_counts[i : i + per_image]) for i in range(0, len(unit_counts), per_image)]


class PositionedPatchesLayout(PixelLayout):
    """Gemma 4: ``(num_images, max_patches, C * P * P)`` patch rows, each image's patches in
    raster order and zero-padded to the batch's longest, plus ``image_position_ids``
    ``(num_images, max_patches, 2)`` = each patch's (x, y) in the patch grid, -1 on padding.
    The tower pools ``pooling_kernel_size`` squared patches into one token."""

    def build(self, config, sizes, images_per_sample, generator, options):
        vision = config.vision_config
        patch, kernel = vision.patch_size, vision.pooling_kernel_size
        grids = []
        for height, width in sizes:
            if height % (patch * kernel) or width % (patch * kernel):
                raise ValueError(f"Gemma 4 image size {height}x{width} must be a multiple of {patch * kernel}")
            grids.append((height // patch, width // patch))
        longest = max(h * w for h, w in grids)
        pixel_values = torch.zeros(len(sizes), longest, _channels(config) * patch * patch)
        positions = torch.full((len(sizes), longest, 2), -1, dtype=torch.long)
        for index, (rows, cols) in enumerate(grids):
            n = rows * cols
            pixel_values[index, :n] = torch.rand(n, pixel_values.shape[-1], generator=generator)
            y, x = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
            positions[index, :n] = torch.stack([x.flatten(), y.flatten()], dim=-1)
        return {"pixel_values": pixel_values, "image_position_ids": positions}


PIXEL_LAYOUTS: dict[str, PixelLayout] = {
    "standard": StandardLayout(),
    "tiled_anyres": TiledAnyResLayout(),
    "qwen_patches": QwenPatchesLayout(),
    "idefics_images": IdeficsImagesLayout(),
    "padded_sizes": PaddedSizesLayout(),
    "internvl_tiles": InternVLTilesLayout(),
    "positioned_patches": PositionedPatchesLayout(),
}


# --------------------------------------------------------------------------- inputs


def _image_feature_counts(model, pixel_inputs, layout, images_per_sample, options) -> list[int]:
    """Image-token count per image, from the model's own ``get_image_features``."""
    units = _feature_units(model, pixel_inputs)
    return layout.split([unit.numel() // unit.shape[-1] for unit in units], images_per_sample, options)


def _special_token_ids(config) -> set[int]:
    """Every id named ``*_token_id(s)`` / ``*_token_index`` anywhere in the config."""
    found: set[int] = set()

    def visit(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and key.endswith(_TOKEN_ID_SUFFIXES):
                    values = value if isinstance(value, (list, tuple)) else [value]
                    found.update(v for v in values if isinstance(v, int))
                else:
                    visit(value)

    visit(config.to_dict())
    return found


def _resolve_ids(config, entries) -> list[int]:
    """Literal ids, or names of config attributes holding an id."""
    return [entry if isinstance(entry, int) else getattr(config, entry) for entry in entries]


def _split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def tiny_pixel_input_names(model_type: str) -> list[str]:
    """The pixel inputs :func:`tiny_inputs` gives ``model_type``'s model, by the names the
    family's processor uses (the spec's ``rename``)."""
    return _renamed(tiny_spec(model_type)["inputs"])


def _renamed(options: dict) -> list[str]:
    """The spec's ``pixel_inputs``, each by the name the family's processor gives it (``rename``)."""
    return [options.get("rename", {}).get(name, name) for name in options["pixel_inputs"]]


def _pixel_inputs(model, options, batch_size, images_per_sample, generator):
    """The family's pixel inputs and the image-token count of every image (sample-major)."""
    layout = PIXEL_LAYOUTS[options["pixel_layout"]]
    sizes = options["image_sizes"]
    sizes = [tuple(sizes[i % len(sizes)]) for i in range(batch_size * images_per_sample)]
    built = layout.build(model.config, sizes, images_per_sample, generator, options)
    pixel_inputs = {name: built[spec_name] for name, spec_name in zip(_renamed(options), options["pixel_inputs"])}
    return pixel_inputs, _image_feature_counts(model, pixel_inputs, layout, images_per_sample, options)


def _processed_pixel_inputs(model, options, images):
    """The image processor's pixel inputs for one image per row, and each image's token
    count (the features of that image alone)."""
    model_type = tiny_spec_name(model.config)
    processor = tiny_image_processor(model_type)
    out = tiny_preprocess(model_type, [[image] for image in images], processor)
    names = _renamed(options)
    missing = [name for name in names if name not in out]
    if missing:
        raise ValueError(f"{type(processor).__name__} returned no {missing}")
    counts = [len(tiny_image_features(model, tiny_preprocess(model_type, [[image]], processor))) for image in images]
    return {name: out[name] for name in names}, counts


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(map(len, rows))
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for row, ids in enumerate(rows):
        input_ids[row, length - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, length - len(ids) :] = 1
    return input_ids, attention_mask


def tiny_inputs(
    model: PreTrainedModel,
    batch_size: int = 1,
    text_lengths: list[int] | None = None,
    seed: int = 0,
    images_per_sample: int = 1,
    images: list | None = None,
) -> dict[str, torch.Tensor]:
    """Dummy inputs for ``model(**inputs)`` and ``model.generate(**inputs)``.

    Each row follows the spec's ``prompt`` (e.g. BOS, text, the images, text). An image's
    placeholder run holds exactly as many image tokens as the model produces feature vectors
    for it, wrapped in the family's begin/end ids. Text ids are random but avoid every special
    id in the config (image, video, pad, bos, eos, boi, eoi, vision start/end, wrappers).

    Args:
        model: a model built by :func:`build_tiny_model` (or any model of a known type).
        batch_size: number of rows.
        text_lengths: random text tokens per row (default 6), shared between the prompt's
            text segments. Rows of different lengths are LEFT-padded with the pad id
            (attention mask 0 there).
        seed: seed for the text ids and pixels.
        images_per_sample: images in every row (0 gives text-only inputs without pixels).
        images: real PIL images, one per row (``batch_size`` is then their number): the
            pixel inputs are the family's own image processor's output
            (:func:`tiny_image_processor`) instead of random tensors, so tiling, AnyRes and
            dynamic resolution follow each image's size.

    Returns:
        ``input_ids``, ``attention_mask``, the family's pixel inputs and, where the family has
        one, its token-type input (``mm_token_type_ids`` for Qwen, ``token_type_ids`` for
        Gemma3/PaliGemma), all plain tensors.

    Raises:
        ValueError: bad sizes or lengths, unknown model type, or a config without a pad id.
    """
    config, text_config = model.config, model.config.get_text_config()
    options = tiny_spec(tiny_spec_name(config))["inputs"]
    if images is not None:
        if not images or images_per_sample != 1:
            raise ValueError("images: give one PIL image per row (images_per_sample=1)")
        batch_size = len(images)
        if text_lengths is not None and len(text_lengths) != batch_size:
            raise ValueError(f"text_lengths must be {batch_size} non-negative ints, got {text_lengths}")
    if batch_size < 1 or images_per_sample < 0:
        raise ValueError(f"need batch_size >= 1 and images_per_sample >= 0, got {batch_size}, {images_per_sample}")
    text_lengths = [_DEFAULT_TEXT_LENGTH] * batch_size if text_lengths is None else list(text_lengths)
    if len(text_lengths) != batch_size or any(n < 0 for n in text_lengths):
        raise ValueError(f"text_lengths must be {batch_size} non-negative ints, got {text_lengths}")
    pad_id = getattr(text_config, "pad_token_id", None)
    pad_id = pad_id if pad_id is not None else getattr(config, "pad_token_id", None)
    if pad_id is None:
        raise ValueError(f"{config.model_type}: the config sets no pad_token_id")

    generator = torch.Generator().manual_seed(seed)
    # Pixels first: their features decide how many placeholder tokens each image needs.
    pixel_inputs, counts = {}, []
    if images is not None:
        pixel_inputs, counts = _processed_pixel_inputs(model, options, images)
    elif images_per_sample:
        pixel_inputs, counts = _pixel_inputs(model, options, batch_size, images_per_sample, generator)

    wrap = options.get("image_wrap", {})
    before, after = _resolve_ids(config, wrap.get("before", [])), _resolve_ids(config, wrap.get("after", []))
    image_id = config.image_token_id
    special = _special_token_ids(config) | set(before) | set(after) | {pad_id}
    allowed = torch.tensor(sorted(set(range(text_config.vocab_size)) - special))
    prompt = options.get("prompt", ["text", "images", "text"])

    rows = []
    for row, text_length in enumerate(text_lengths):
        chunks = iter(_split_evenly(text_length, max(1, prompt.count("text"))))
        ids: list[int] = []
        for segment in prompt:
            if segment == "bos":
                ids.append(text_config.bos_token_id)
            elif segment == "text":
                ids += allowed[torch.randint(len(allowed), (next(chunks),), generator=generator)].tolist()
            elif segment == "images":
                for count in counts[row * images_per_sample : (row + 1) * images_per_sample]:
                    ids += before + [image_id] * count + after
            else:
                raise ValueError(f"unknown prompt segment {segment!r} in the {config.model_type} spec")
        rows.append(ids)

    input_ids, attention_mask = _left_pad(rows, pad_id)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, **pixel_inputs}
    if token_types := options.get("token_types"):
        types = torch.full_like(input_ids, token_types["text"])
        types[input_ids == image_id] = token_types["image"]
        inputs[token_types["name"]] = types
    return inputs
