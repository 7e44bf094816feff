"""Per-architecture facts, as data.

Each supported ``config.model_type`` has one small JSON file in this folder naming where
its parts live (dotted module paths relative to the ``...ForConditionalGeneration``
model), which config attribute holds the image token id, what its pixel inputs are
called and how they are laid out. The files are loaded into a registry keyed by
``model_type``; an unknown model type falls back to introspection
(:mod:`hooks.adapters.introspect`).

Adding an architecture = adding ``<model_type>.json`` here (or calling
:func:`register_adapter` at run time) and one row in the parametrised tests.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import unknown
from ..layout import LAYOUTS

_DATA_DIR = Path(__file__).parent

# Fields every adapter file must define. Module paths are dotted attribute paths from the
# top-level model; ``self_attention`` is relative to one decoder layer.
MODULE_FIELDS = (
    "vision_encoder",
    "projector",
    "language_model",
    "decoder_layers",
    "lm_head",
    "token_embeddings",
)
# batch_patches: (images, max_patches, C*P*P) patch rows padded per image, their grid
# positions in a per-image input (Gemma 4's image_position_ids)
PIXEL_LAYOUTS = ("batch_chw", "batch_tiles_chw", "flat_patches", "batch_images_chw", "tiles_chw", "batch_patches")


@dataclass(frozen=True)
class Adapter:
    """Where an architecture keeps its parts; see the JSON files beside this module."""

    model_type: str
    vision_encoder: str
    projector: str
    language_model: str
    decoder_layers: str
    self_attention: str
    lm_head: str
    token_embeddings: str
    image_token_id: tuple[str, ...] = ("image_token_id", "image_token_index")
    video_token_id: tuple[str, ...] = ()
    pixel_inputs: tuple[str, ...] = ("pixel_values",)
    image_inputs: tuple[str, ...] = ()
    pixel_layout: str = "batch_chw"
    # the inputs whose first dimension counts the images of the whole batch, one entry per
    # image (LLaVA's pixel_values, LLaVA-NeXT's image_sizes, Qwen's image_grid_thw): with one
    # image per row their length is the number of rows. Image-token positions are mapped for
    # one image per row, and the per-image entries are looked up by row; a row with two
    # images beside a row with one made row 1 read row 0's second entry, silently. Empty
    # where no input counts images (Idefics3's pixel_values is (rows, images, ...), InternVL's
    # counts tiles).
    image_count_inputs: tuple[str, ...] = ()
    # per pixel input, the per-image input saying which of its pixels each image owns --
    # flat_patches: rows of image i = product of grid row i (Qwen's image_grid_thw);
    # batch_patches: the rows of image i whose positions are not -1 (Gemma 4's
    # image_position_ids); batch_chw: the top-left (height, width) of image i in a batch
    # zero-padded to its largest image (Pixtral's image_sizes) -- so a distortion treats each
    # image's own pixels alone, whatever batch it is in (mitigate.branches); {} where every
    # image fills its tensor
    pixel_grids: dict = field(default_factory=dict, hash=False)
    # the range the pixel inputs come in: "normalised" (mean-centred by the processor, as
    # VCD's noise schedule assumes) or "unit" ([0, 1]; the model maps x to 2x - 1 itself,
    # Gemma 4), so distortions act in the normalised space either way
    pixel_range: str = "normalised"
    multimodal_rope: bool = False
    rope_state: str | None = None
    # True when the rows the decoder receives at image positions are a rearrangement of the
    # projector's output rows (anyres unpadding + newline rows, Qwen2.5's window order)
    # rather than those rows in order.
    packed_image_features: bool = False
    image_newline: str | None = None
    # how the image tokens of one row map back onto the image: a key of hooks.layout.LAYOUTS
    token_layout: str = "grid"
    # True when the image tokens' states do not depend on the text after them (the decoder
    # attends causally over the prompt; at most bidirectionally within an image), so a KV
    # cache cut after the last image token serves another prompt about the same image
    # (mitigate.localize_prefix). False for a prefix-LM (PaliGemma) and, to be safe, for an
    # architecture known only by introspection.
    causal_image_prefix: bool = False
    # hybrid decoders (Qwen3.5's Gated DeltaNet layers between its full-attention ones): the
    # module name, on a decoder layer, of the token mixer that is not softmax attention. Such
    # layers have no attention scores to bias or capture, so the attention points skip them
    # and asking for one by index is an error (ModelPoints.attention_layer_indices).
    linear_attention: str | None = None
    # True when the wrapper hands its language model the 2-D padding mask and the language
    # model builds one causal mask for all its layers with transformers' create_causal_mask,
    # which returns a 4-D mask it is given as it is. An attention bias that is the same in
    # every layer is then folded into that one mask by a single hook on the language model
    # (hooks.attention) instead of a hook per attention module. False where the wrapper
    # builds the masks itself (Gemma 3 and PaliGemma's image / prefix blocks, Gemma 4) and
    # for hybrid decoders (their linear layers read the 2-D mask); the per-layer hooks serve
    # those. Multimodal-RoPE text models (Qwen2/2.5/3-VL, GLM-4V) qualify: with a cache or
    # a 2-D mask their positions do not enter the mask. Sliding-window layers are checked
    # on the config at attach time.
    shared_causal_mask: bool = False
    # vision_config.model_type -> why this table does not describe the architecture with that
    # tower (a checkpoint of this model_type built on a tower with another token layout, and
    # no variant for it below); resolve() refuses it rather than map its image tokens as this
    # table's layout would
    refused_vision_towers: dict = field(default_factory=dict, hash=False)
    # vision_config.model_type -> the fields that differ for a checkpoint of this model_type
    # built on that tower (pixtral-12b: "llava" with a Pixtral tower, which reads each image at
    # its own size, so image_sizes counts and places its tokens): resolve() uses this table
    # with those fields replaced (:meth:`for_vision`)
    vision_variants: dict = field(default_factory=dict, hash=False)
    notes: str = ""
    source: str = field(default="table", compare=False)

    def __post_init__(self) -> None:
        for name in (*MODULE_FIELDS, "self_attention"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"adapter {self.model_type!r}: field {name!r} must be a non-empty dotted path")
        if self.pixel_layout not in PIXEL_LAYOUTS:
            raise ValueError(
                f"adapter {self.model_type!r}: pixel_layout {self.pixel_layout!r} is not one of {PIXEL_LAYOUTS}"
            )
        if self.token_layout not in LAYOUTS:
            raise ValueError(f"adapter {self.model_type!r}: token_layout {self.token_layout!r} is not one of {sorted(LAYOUTS)}")
        for name in ("image_token_id", "video_token_id", "pixel_inputs", "image_inputs", "image_count_inputs"):
            value = getattr(self, name)
            # a lone string was split into letters ("config attributes tried: ['i', 'm', ...]")
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"adapter {self.model_type!r}: {name} must be a list of names, got {value!r}"
                                 + (f" (write [{value!r}])" if isinstance(value, str) else ""))
            object.__setattr__(self, name, tuple(value))
        stray = [n for n in self.image_count_inputs if n not in (*self.pixel_inputs, *self.image_inputs)]
        if stray:
            raise ValueError(f"adapter {self.model_type!r}: image_count_inputs {stray} are not among its pixel inputs "
                             f"{self.pixel_inputs} or image inputs {self.image_inputs}")
        if self.pixel_range not in ("normalised", "unit"):
            raise ValueError(f"adapter {self.model_type!r}: pixel_range must be 'normalised' or 'unit', "
                             f"got {self.pixel_range!r}")
        if self.pixel_grids and self.pixel_layout not in ("flat_patches", "batch_patches", "batch_chw"):
            raise ValueError(f"adapter {self.model_type!r}: pixel_grids is for the patch layouts and padded "
                             f"batch_chw images, this one is {self.pixel_layout!r}")
        if not isinstance(self.pixel_grids, dict) or any(
                k not in self.pixel_inputs or v not in self.image_inputs for k, v in self.pixel_grids.items()):
            raise ValueError(f"adapter {self.model_type!r}: pixel_grids must map pixel inputs {self.pixel_inputs} to "
                             f"per-image inputs {self.image_inputs}, got {self.pixel_grids!r}")
        if not self.image_token_id:
            raise ValueError(f"adapter {self.model_type!r}: image_token_id must name at least one config attribute")
        if self.linear_attention is not None and (not isinstance(self.linear_attention, str) or not self.linear_attention):
            raise ValueError(f"adapter {self.model_type!r}: linear_attention must be a module name or null")
        if not isinstance(self.refused_vision_towers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in self.refused_vision_towers.items()):
            raise ValueError(f"adapter {self.model_type!r}: refused_vision_towers must map vision model types to "
                             f"reasons, got {self.refused_vision_towers!r}")
        fixed = {"model_type", "source", "vision_variants", "refused_vision_towers"}
        known = {f.name for f in dataclasses.fields(self)} - fixed
        if not isinstance(self.vision_variants, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) and v and set(v) <= known
                for k, v in self.vision_variants.items()):
            raise ValueError(f"adapter {self.model_type!r}: vision_variants must map vision model types to field "
                             f"overrides among {sorted(known)}, got {self.vision_variants!r}")
        if set(self.vision_variants) & set(self.refused_vision_towers):
            raise ValueError(f"adapter {self.model_type!r}: a vision tower is both refused and a variant: "
                             f"{sorted(set(self.vision_variants) & set(self.refused_vision_towers))}")
        for name in ("causal_image_prefix", "shared_causal_mask"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"adapter {self.model_type!r}: {name} must be true or false")

    @classmethod
    def from_dict(cls, data: dict, source: str = "table") -> "Adapter":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"adapter {data.get('model_type')!r}: unknown field(s) {unknown}; known: {sorted(known)}")
        if "model_type" not in data:
            raise ValueError("adapter data needs a 'model_type'")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:  # the dataclass's own TypeError named neither the adapter nor the fields' meaning
            raise ValueError(f"adapter {data['model_type']!r}: missing field(s) {missing} (module paths, as in "
                             "hooks/adapters/llava.json)")
        return cls(**{**data, "source": source})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def for_vision(self, vision_type: str | None) -> "Adapter":
        """This table for a checkpoint on a ``vision_type`` tower: itself, or its variant for
        that tower (:attr:`vision_variants`, validated as a whole adapter)."""
        overrides = self.vision_variants.get(vision_type) if vision_type else None
        if not overrides:
            return self
        return dataclasses.replace(self, **overrides, vision_variants={},
                                   source=f"{self.source} (its {vision_type} tower variant)")


_REGISTRY: dict[str, Adapter] = {}


def register_adapter(adapter: Adapter | dict, *, overwrite: bool = False) -> Adapter:
    """Add an architecture at run time (a dict with the JSON files' fields, or an :class:`Adapter`)."""
    if isinstance(adapter, dict):
        adapter = Adapter.from_dict(adapter, source="registered")
    else:  # a copy of a table adapter says where it came from
        origin = adapter.source not in ("registered", "table")
        adapter = dataclasses.replace(adapter, source=f"registered (from {adapter.source})" if origin else "registered")
    if adapter.model_type in _REGISTRY and not overwrite:
        raise ValueError(f"an adapter for model_type {adapter.model_type!r} exists; pass overwrite=True to replace it")
    _REGISTRY[adapter.model_type] = adapter
    return adapter


def get_adapter(model_type: str) -> Adapter:
    """The table adapter for ``model_type``; ``KeyError`` with close matches if there is none."""
    try:
        return _REGISTRY[model_type]
    except KeyError:
        raise KeyError(unknown("model_type (no adapter)", model_type, _REGISTRY)) from None


def adapter_for_class(model) -> Adapter | None:
    """A table adapter for ``model``'s class when its ``model_type`` has none: transformers
    registers some classes under several model types (``shieldgemma2`` is Gemma 3's class,
    ``glmga`` GLM-4.6V's) and users subclass them; the class, or a base class, that the
    installed transformers maps from a table model type carries that adapter's facts."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as names
    except ImportError:  # pragma: no cover - every supported transformers has it
        return None
    by_class: dict[str, str] = {}
    for model_type, class_name in names.items():
        if model_type in _REGISTRY and isinstance(class_name, str):
            by_class.setdefault(class_name, model_type)
    for cls in type(model).__mro__:
        if cls.__name__ in by_class:
            table = _REGISTRY[by_class[cls.__name__]]
            model_type = getattr(getattr(model, "config", None), "model_type", table.model_type)
            return dataclasses.replace(table, model_type=model_type,
                                       source=f"{table.source} (its class {cls.__name__})")
    return None


def supported_model_types() -> tuple[str, ...]:
    """Model types with a table adapter (whether or not the installed transformers has them)."""
    return tuple(sorted(_REGISTRY))


def _load_tables() -> None:
    for path in sorted(_DATA_DIR.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:  # a broken data file is a packaging bug: fail loudly
            raise ValueError(f"{path}: invalid JSON: {exc}") from exc
        adapter = Adapter.from_dict(data, source=f"table:{path.name}")
        if adapter.model_type != path.stem:
            raise ValueError(f"{path}: model_type {adapter.model_type!r} does not match the file name")
        _REGISTRY[adapter.model_type] = adapter


_load_tables()

__all__ = ["Adapter", "adapter_for_class", "register_adapter", "get_adapter", "supported_model_types", "PIXEL_LAYOUTS"]
