"""Abstract hook points, resolved on one model.

:func:`resolve` turns a model into a :class:`ModelPoints`: the modules behind each
abstract point (vision encoder, projector, decoder layers, their self-attention, LM head,
token embeddings), the image token id, and the names of the pixel inputs. Mitigations ask
for points by name and never by class name, so one mitigation runs on every architecture
the adapter table (or introspection) covers.

Abstract point names (``<part>.<input|output>``), see :data:`POINTS`:

=========================  ===========================================================
``vision_encoder.output``  what the vision tower returns (a ``ModelOutput`` or tensor)
``projector.output``       image embeddings after the multimodal projector/merger
``language_model.input``   the decoder stack's call; ``kwargs["inputs_embeds"]`` holds
                           text and image embeddings merged, as the decoder receives them
``token_embeddings.output`` the text token embeddings
``decoder_layer.input``    each decoder layer's call (``args[0]``/``hidden_states``)
``decoder_layer.output``   each decoder layer's output hidden states
``attention.input``        each decoder layer's self-attention call (``attention_mask``
                           among the kwargs); :mod:`hooks.attention` builds on this
``attention.output``       each self-attention's output
``lm_head.output``         next-token logits
=========================  ===========================================================
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .adapters import MODULE_FIELDS, Adapter, adapter_for_class, get_adapter
from .adapters.introspect import HookPointError, introspect_adapter
from .errors import unknown
from .group import HookGroup
from .layout import Region, token_regions

# abstract point -> (ModelPoints attribute, "input" | "output")
POINTS: dict[str, tuple[str, str]] = {
    "vision_encoder.output": ("vision_encoder", "output"),
    "projector.output": ("projector", "output"),
    "language_model.input": ("language_model", "input"),
    "token_embeddings.output": ("token_embeddings", "output"),
    "decoder_layer.input": ("decoder_layers", "input"),
    "decoder_layer.output": ("decoder_layers", "output"),
    "attention.input": ("attention", "input"),
    "attention.output": ("attention", "output"),
    "lm_head.output": ("lm_head", "output"),
}
PER_LAYER = {"decoder_layers", "attention"}


@dataclass
class ModelPoints:
    """The resolved hook points of one model. Build it with :func:`resolve`."""

    model: nn.Module = field(repr=False)
    adapter: Adapter
    vision_encoder: nn.Module = field(repr=False)
    projector: nn.Module = field(repr=False)
    language_model: nn.Module = field(repr=False)
    decoder_layers: tuple[nn.Module, ...] = field(repr=False)
    # per decoder layer its self-attention, None for a hybrid decoder's linear-attention layers
    attention: tuple[nn.Module | None, ...] = field(repr=False)
    lm_head: nn.Module = field(repr=False)
    token_embeddings: nn.Module = field(repr=False)
    image_token_id: int
    video_token_id: int | None = None

    # -- facts ------------------------------------------------------------------------
    @property
    def model_type(self) -> str:
        return self.adapter.model_type

    @property
    def num_layers(self) -> int:
        return len(self.decoder_layers)

    @property
    def pixel_inputs(self) -> tuple[str, ...]:
        """Names of the tensors that carry pixels (``pixel_values`` …)."""
        return self.adapter.pixel_inputs

    @property
    def image_inputs(self) -> tuple[str, ...]:
        """Names of the other per-image inputs (``image_grid_thw``, ``image_sizes`` …)."""
        return self.adapter.image_inputs

    def pixel_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The subset of a call's kwargs that are pixel or per-image inputs and not ``None``."""
        names = (*self.pixel_inputs, *self.image_inputs)
        return {k: kwargs[k] for k in names if kwargs.get(k) is not None}

    @property
    def attn_implementation(self) -> str:
        """The attention implementation the decoder uses (``sdpa``, ``eager``, ``flash_attention_2`` …)."""
        first = next(a for a in self.attention if a is not None)
        config = getattr(first, "config", None) or getattr(self.language_model, "config", None)
        # under an attention capture the config names the capture's wrapper, which runs the
        # implementation it wraps (an attention bias added after a capture was refused)
        return getattr(config, "_hallu_capture_wraps", None) or getattr(config, "_attn_implementation", None) or "eager"

    # -- image-token positions ----------------------------------------------------------
    def image_token_mask(self, input_ids: torch.Tensor, *, include_video: bool = False) -> torch.Tensor:
        """Boolean ``(batch, seq)`` mask of the positions the model fills with image features.

        Read from ``input_ids == config.image_token_id`` (never from a formula: the number
        of tokens per image depends on the image size for several families).
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("input_ids must be a 2-D (batch, seq) tensor")
        mask = input_ids == self.image_token_id
        if include_video and self.video_token_id is not None:
            mask = mask | (input_ids == self.video_token_id)
        return mask

    def image_token_positions(self, input_ids: torch.Tensor, *, include_video: bool = False) -> list[torch.Tensor]:
        """Per batch row, the sorted indices of its image tokens (rows may differ in count)."""
        mask = self.image_token_mask(input_ids, include_video=include_video)
        return [row.nonzero(as_tuple=True)[0] for row in mask]

    def token_regions(self, n_tokens: int, inputs: dict | None = None, row: int = 0,
                      image_size: tuple[int, int] | None = None) -> list[Region]:
        """Where one row's ``n_tokens`` image tokens lie in its image, under the adapter's
        ``token_layout`` (:mod:`hooks.layout`); ``image_size`` is the original ``(width, height)``."""
        return token_regions(self.adapter.token_layout, self.model.config, n_tokens, inputs, row, image_size,
                             self.adapter.image_count_inputs)

    # -- hook registration by abstract name ----------------------------------------------
    def modules_for(self, point: str, layers: Iterable[int] | None = None) -> list[nn.Module]:
        """The modules behind an abstract point; ``layers`` selects decoder layers (negative ok)."""
        attr, _ = _lookup(point)
        target = getattr(self, attr)
        if attr not in PER_LAYER:
            if layers is not None:
                raise ValueError(f"point {point!r} is not per-layer; do not pass layers")
            return [target]
        return [target[i] for i in self._indices(attr, layers)]

    def _indices(self, attr: str, layers: Iterable[int] | None) -> list[int]:
        return self.attention_layer_indices(layers) if attr == "attention" else self.layer_indices(layers)

    def layer_indices(self, layers: Iterable[int] | None) -> list[int]:
        """Normalise a layer selection to sorted non-negative indices, with a clear error."""
        n = self.num_layers
        if layers is None:
            return list(range(n))
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
            # "all" was read letter by letter ("layer index 'a' out of range")
            raise ValueError(f"layers must be None (every layer) or a list of layer indices, got {layers!r}")
        out = []
        for i in layers:
            if isinstance(i, bool) or not isinstance(i, numbers.Integral):  # True is not layer 1
                raise ValueError(f"layer indices must be ints, got {i!r} in {layers!r}")
            i = int(i)  # numpy ints too
            if not -n <= i < n:
                raise ValueError(f"layer index {i!r} out of range for a {n}-layer decoder ({self.model_type})")
            out.append(i % n)
        return sorted(set(out))

    @property
    def attention_layers(self) -> list[int]:
        """Indices of the decoder layers with softmax self-attention: every layer, except a
        hybrid decoder's linear-attention ones (the adapter's ``linear_attention``)."""
        return [i for i, a in enumerate(self.attention) if a is not None]

    @property
    def kv_shared_layers(self) -> list[int]:
        """Attention layers that reuse an earlier layer's keys and values (Gemma 4's
        ``is_kv_shared_layer``): at ``generate()``'s prefill they compute only the last query."""
        return [i for i in self.attention_layers if getattr(self.attention[i], "is_kv_shared_layer", False)]

    def linear_attention(self, layers: Iterable[int] | None = None) -> list[tuple[int, nn.Module]]:
        """``(index, module)`` of a hybrid decoder's linear-attention token mixers among
        ``layers`` (None: all); empty for a decoder with softmax attention in every layer."""
        name = self.adapter.linear_attention
        return [(i, getattr(self.decoder_layers[i], name)) for i in self.layer_indices(layers)
                if self.attention[i] is None and name]

    def attention_layer_indices(self, layers: Iterable[int] | None) -> list[int]:
        """:meth:`layer_indices` for the attention points: ``None`` is every attention layer,
        and a chosen layer without softmax attention is a ``ValueError`` naming it."""
        if layers is None:
            return self.attention_layers
        out = self.layer_indices(layers)
        linear = [i for i in out if self.attention[i] is None]
        if linear:
            raise ValueError(
                f"layers {linear} of this {self.model_type} decoder are {self.adapter.linear_attention} (linear "
                f"attention, no attention scores); its attention layers are {self.attention_layers}")
        return out

    def add_hook(
        self,
        group: HookGroup,
        point: str,
        fn: Callable,
        *,
        layers: Iterable[int] | None = None,
    ) -> list:
        """Register ``fn`` at an abstract point through ``group`` (which owns the handles).

        For per-layer points ``fn`` is called as ``fn(layer_index, module, args, kwargs[, output])``;
        otherwise with PyTorch's hook signature ``fn(module, args, kwargs[, output])``.
        """
        attr, kind = _lookup(point)
        layers = None if layers is None else list(layers)  # a generator is read twice below
        modules = self.modules_for(point, layers)
        indices = self._indices(attr, layers) if attr in PER_LAYER else [None]
        register = group.add_forward_pre_hook if kind == "input" else group.add_forward_hook
        handles = []
        for index, module in zip(indices, modules):
            hook = fn if index is None else _bind_layer(fn, index)
            handles.append(register(module, hook))
        return handles

    def describe(self) -> dict[str, Any]:
        """What every point resolved to: module paths and class names, ids and input names."""
        paths = {id(m): name for name, m in self.model.named_modules()}

        def where(module: nn.Module) -> str:
            return f"{paths.get(id(module), '?')} ({type(module).__name__})"

        return {
            "model_type": self.model_type,
            "model_class": type(self.model).__name__,
            "adapter": self.adapter.source,
            "vision_encoder": where(self.vision_encoder),
            "projector": where(self.projector),
            "language_model": where(self.language_model),
            "token_embeddings": where(self.token_embeddings),
            "decoder_layers": f"{self.adapter.decoder_layers}[0..{self.num_layers - 1}] "
            f"({type(self.decoder_layers[0]).__name__})",
            "attention": f"{self.adapter.decoder_layers}[i].{self.adapter.self_attention} "
            f"({type(next(a for a in self.attention if a is not None)).__name__}, {self.attn_implementation})"
            + (f"; layers {self.attention_layers} only, the others are {self.adapter.linear_attention}"
               if len(self.attention_layers) < self.num_layers else ""),
            "lm_head": where(self.lm_head),
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "pixel_inputs": list(self.pixel_inputs),
            "image_inputs": list(self.image_inputs),
            "pixel_layout": self.adapter.pixel_layout,
            "image_count_inputs": list(self.adapter.image_count_inputs),
            "token_layout": self.adapter.token_layout,
            "multimodal_rope": self.adapter.multimodal_rope,
        }


def _lookup(point: str) -> tuple[str, str]:
    try:
        return POINTS[point]
    except KeyError:
        raise ValueError(unknown("hook point", point, POINTS)) from None


def _bind_layer(fn: Callable, index: int) -> Callable:
    def hook(*args: Any) -> Any:
        return fn(index, *args)

    hook.__name__ = getattr(fn, "__name__", "hook")
    return hook


def _config_id(config: Any, names: tuple[str, ...]) -> int | None:
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is None:
            continue
        for name in names:
            value = getattr(cfg, name, None)
            if isinstance(value, int):
                return value
    return None


def _check_image_token(config: Any, adapter: Adapter, image_token_id: int) -> None:
    """A registered adapter naming the wrong config attribute (``bos_token_id``) marked other
    tokens as the image: VCD's no-image branch hid BOS, or, with ``pad_token_id``, nothing,
    and answered as the plain model, silently. The id must be the model's own image token
    where its config names one, and never a BOS / EOS / PAD token."""
    own = _config_id(config, ("image_token_id", "image_token_index"))
    if own is not None and own != image_token_id:
        raise HookPointError(f"adapter {adapter.model_type!r} (from {adapter.source}): image_token_id "
                             f"{list(adapter.image_token_id)} gives {image_token_id}, but the model's config says its "
                             f"image token is {own}; the hooks would take other tokens for the image")
    text = getattr(config, "text_config", None)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        # the text config's first: a VLM config's own copy is deprecated in some families (Idefics3)
        value = next((getattr(cfg, name) for cfg in (text, config) if cfg is not None and name in vars(cfg)), None)
        ids = value if isinstance(value, (list, tuple)) else [value]
        if image_token_id in [i for i in ids if isinstance(i, int)]:
            raise HookPointError(f"adapter {adapter.model_type!r} (from {adapter.source}): image_token_id "
                                 f"{list(adapter.image_token_id)} gives {image_token_id}, the model's {name}, not an "
                                 "image token")


def _get(model: nn.Module, path: str, what: str, missing: list[str]) -> Any:
    try:
        return model.get_submodule(path)
    except AttributeError:
        missing.append(f"{what} ({path})")
        return None


_WARNED: set[str] = set()


def _paths_exist(model: nn.Module, adapter: Adapter) -> bool:
    try:
        for name in MODULE_FIELDS:
            model.get_submodule(getattr(adapter, name))
    except AttributeError:
        return False
    return True


def _warn_guessed(adapter: Adapter, model: nn.Module) -> None:
    """Once per model type: introspection found the modules, the facts are guesses."""
    if adapter.model_type in _WARNED:
        return
    _WARNED.add(adapter.model_type)
    import warnings

    warnings.warn(
        f"model_type {adapter.model_type!r} ({type(model).__name__}) has no adapter in hooks/adapters: its modules "
        f"were found by introspection, and its facts are guesses -- pixel inputs {list(adapter.pixel_inputs)}, image "
        f"inputs {list(adapter.image_inputs)}, video "
        f"token {adapter.video_token_id or 'none'}, multimodal RoPE {adapter.multimodal_rope}, pixel layout "
        f"{adapter.pixel_layout!r}; where its image tokens lie in the image is not known (localisation refuses). "
        "Add hooks/adapters/<model_type>.json (or hooks.register_adapter) to state them.", UserWarning, stacklevel=3)


def resolve(model: nn.Module, adapter: Adapter | None = None) -> ModelPoints:
    """Resolve every abstract hook point on ``model``.

    Uses the table adapter for ``model.config.model_type`` when there is one, else the one
    of its class (:func:`~hooks.adapters.adapter_for_class`), else introspection -- with a
    warning, since introspection finds modules but guesses the per-architecture facts -- or
    the ``adapter`` given. Raises :class:`HookPointError` (a ``ValueError``) naming the model
    type and every point that could not be found.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"resolve() needs a torch.nn.Module, got {type(model).__name__}")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if adapter is None:
        try:
            adapter = get_adapter(model_type) if model_type else None
        except KeyError:
            adapter = None
        if adapter is None:  # a class's adapter serves only where its module paths are there
            adapter = adapter_for_class(model)  # (a user's subclass may rename a part)
            if adapter is not None and not _paths_exist(model, adapter):
                adapter = None
        vision_type = getattr(getattr(config, "vision_config", None), "model_type", None)
        if adapter is not None:  # a checkpoint of this type (or class) on another tower: pixtral-12b
            adapter = adapter.for_vision(vision_type)
        if adapter is not None and vision_type in adapter.refused_vision_towers:
            raise HookPointError(
                f"model_type {model_type!r} with a {vision_type!r} vision tower is not the architecture its table "
                f"describes: {adapter.refused_vision_towers[vision_type]}. Register an adapter for it "
                "(hooks.register_adapter) and pass it: resolve(model, adapter=...)")
        if adapter is None:
            adapter = introspect_adapter(model)
            _warn_guessed(adapter, model)

    missing: list[str] = []
    modules = {name: _get(model, getattr(adapter, name), name, missing) for name in MODULE_FIELDS}
    layers = modules["decoder_layers"]
    attention: tuple[nn.Module, ...] = ()
    if layers is not None:
        if not isinstance(layers, (nn.ModuleList, nn.Sequential)) or len(layers) == 0:
            missing.append(f"decoder_layers ({adapter.decoder_layers} is not a non-empty ModuleList)")
        else:
            found = [getattr(layer, adapter.self_attention, None) for layer in layers]
            # a hybrid decoder's linear-attention layers have no self-attention (None below)
            linear = [isinstance(getattr(layer, adapter.linear_attention, None), nn.Module)
                      if adapter.linear_attention else False for layer in layers]
            if any(not isinstance(a, nn.Module) and not lin for a, lin in zip(found, linear)) or not any(
                    isinstance(a, nn.Module) for a in found):
                kinds = adapter.self_attention + (f" or .{adapter.linear_attention}" if adapter.linear_attention else "")
                missing.append(f"attention ({adapter.decoder_layers}[i].{kinds})")
            else:
                attention = tuple(a if isinstance(a, nn.Module) else None for a in found)
    image_token_id = _config_id(config, adapter.image_token_id)
    if image_token_id is None:
        missing.append(f"image_token_id (config attributes tried: {list(adapter.image_token_id)})")
    else:
        _check_image_token(config, adapter, image_token_id)
    if missing:
        # a part of a model (its LlavaModel, its vision tower) has no LM head: say what to pass
        part = any(m.startswith("lm_head") for m in missing)
        raise HookPointError(
            f"cannot resolve hook points for model_type {adapter.model_type!r} ({type(model).__name__}, "
            f"adapter from {adapter.source}): missing {', '.join(missing)}"
            + ("; pass the whole model with its LM head (the ...ForConditionalGeneration that "
               "AutoModelForImageTextToText loads), not a part of it" if part else "")
        )
    return ModelPoints(
        model=model,
        adapter=adapter,
        vision_encoder=modules["vision_encoder"],
        projector=modules["projector"],
        language_model=modules["language_model"],
        decoder_layers=tuple(layers),
        attention=attention,
        lm_head=modules["lm_head"],
        token_embeddings=modules["token_embeddings"],
        image_token_id=image_token_id,
        video_token_id=_config_id(config, adapter.video_token_id) if adapter.video_token_id else None,
    )
