"""Fallback for model types without a table adapter: find the parts by looking.

The search uses Hugging Face's own accessors first (``get_input_embeddings``,
``get_output_embeddings``, ``get_decoder``) and then the attribute names the families we
know use. It is a best effort: whatever it cannot find is reported by name, together with
the model type, so the user can add a JSON adapter instead of guessing.
"""

from __future__ import annotations

from torch import nn

from . import Adapter

# Candidate attribute names, in order of preference, searched on the top model and on its
# inner ``model`` (the usual HF split into ``XModel`` + ``XForConditionalGeneration``).
VISION_NAMES = ("vision_tower", "visual", "vision_model", "vision_encoder", "image_encoder", "vision", "image_tower")
#: per-image inputs a model's forward may take beside its pixels
IMAGE_INPUT_NAMES = ("image_sizes", "image_grid_thw", "pixel_attention_mask", "pixel_mask", "image_position_ids",
                     "num_crops", "aspect_ratio_ids", "aspect_ratio_mask", "image_flags")
#: a forward's pixel inputs are named so (``pixel_values``; Video-LLaVA's ``pixel_values_images``)
PIXEL_INPUT_PREFIX = "pixel_values"
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "mm_projector", "merger", "projector", "mlp1",
                   "embed_vision")
LANGUAGE_NAMES = ("language_model", "text_model", "llm", "decoder")
LAYER_LIST_NAMES = ("layers", "h", "blocks", "decoder_layers")
ATTENTION_NAMES = ("self_attn", "attn", "self_attention", "attention")
# the token mixer of a hybrid decoder's layers without softmax attention (Qwen3-Next / 3.5's Gated DeltaNet)
LINEAR_ATTENTION_NAMES = ("linear_attn",)


class HookPointError(ValueError):
    """A hook point could not be resolved on a model."""


def _path_of(model: nn.Module, target: nn.Module) -> str | None:
    for name, module in model.named_modules():
        if module is target:
            return name
    return None


def _first_attr(model: nn.Module, roots: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    for root in roots:
        base = model.get_submodule(root) if root else model
        for name in names:
            child = getattr(base, name, None)
            if isinstance(child, nn.Module):
                return f"{root}.{name}" if root else name
    return None


def _text_layers(model: nn.Module, language_model: str | None) -> str | None:
    if language_model is None:
        return None
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", None) or config
    expected = getattr(text_config, "num_hidden_layers", None)
    base = model.get_submodule(language_model)

    def under(name: str) -> str:  # "" is the model itself (get_decoder() returned it)
        return f"{language_model}.{name}" if language_model else name

    for name in LAYER_LIST_NAMES:
        child = getattr(base, name, None)
        if isinstance(child, nn.ModuleList) and (expected is None or len(child) == expected):
            return under(name)
    for name, child in base.named_modules():  # nested, e.g. language_model.model.layers
        if isinstance(child, nn.ModuleList) and expected is not None and len(child) == expected and name:
            return under(name)
    return None


def introspect_adapter(model: nn.Module) -> Adapter:
    """Build an :class:`Adapter` for ``model`` by introspection, or raise :class:`HookPointError`."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    text_config = getattr(config, "text_config", None)
    if getattr(config, "is_encoder_decoder", False) or getattr(text_config, "is_encoder_decoder", False):
        # generate() runs the encoder before the decoding loop and each forward then brings only
        # decoder_input_ids: the mitigations act on a decoder-only language model's forward (the
        # image tokens among the prompt ids), and a search for "the decoder's layers" finds the
        # encoder's first (Florence-2's BART)
        raise HookPointError(
            f"model_type {model_type!r} ({type(model).__name__}) is an encoder-decoder model; the hooks and "
            "mitigations support decoder-only language models, whose forward sees the prompt and its image "
            "tokens at every step")
    roots = ("", "model") if isinstance(getattr(model, "model", None), nn.Module) else ("",)

    found: dict[str, str | None] = {}
    found["vision_encoder"] = _first_attr(model, roots, VISION_NAMES)
    found["projector"] = _first_attr(model, roots, PROJECTOR_NAMES)
    if found["projector"] is None and found["vision_encoder"] is not None:  # Qwen-style: merger inside the tower
        found["projector"] = _first_attr(model, (found["vision_encoder"],), PROJECTOR_NAMES)

    language = _first_attr(model, roots, LANGUAGE_NAMES)
    if language is None and hasattr(model, "get_decoder"):
        try:
            language = _path_of(model, model.get_decoder())
        except Exception:  # some models raise when they have no decoder
            language = None
    found["language_model"] = language
    found["decoder_layers"] = _text_layers(model, language)

    embeddings = _accessor(model, "get_input_embeddings")
    found["token_embeddings"] = _path_of(model, embeddings) if embeddings is not None else None
    head = _accessor(model, "get_output_embeddings")
    found["lm_head"] = _path_of(model, head) if head is not None else None

    attention = linear = None
    why: list[str] = []  # what was there instead, for the error
    if found["decoder_layers"] is not None:
        layers = list(model.get_submodule(found["decoder_layers"]))
        # the first name some layer has; the layers without it must all have a linear mixer
        attention = next((n for n in ATTENTION_NAMES for layer in layers
                          if isinstance(getattr(layer, n, None), nn.Module)), None)
        others = [layer for layer in layers if not isinstance(getattr(layer, attention or "", None), nn.Module)]
        if others:
            linear = next((n for n in LINEAR_ATTENTION_NAMES
                           if all(isinstance(getattr(layer, n, None), nn.Module) for layer in others)), None)
            if linear is None:
                attention = None  # some layers have neither: report it rather than guess
        if attention is None:
            odd = [i for i, layer in enumerate(layers)
                   if not any(isinstance(getattr(layer, n, None), nn.Module) for n in ATTENTION_NAMES)]
            sample = layers[odd[0]] if odd else layers[0]
            why.append(f"decoder layer {odd[0] if odd else 0} ({type(sample).__name__}) has none of "
                       f"{'/'.join(ATTENTION_NAMES)} (its modules: {', '.join(_children(sample))}; "
                       f"{len(odd)} of {len(layers)} layers are like it): cross-attention or convolution layers "
                       "are not supported")
    found["self_attention"] = attention
    if found["projector"] is None:
        why.append(f"no module named {'/'.join(PROJECTOR_NAMES)} (top-level modules: "
                   f"{', '.join(_children(_top(model, roots)))})")

    missing = sorted(k for k, v in found.items() if v is None)
    if missing:
        raise HookPointError(
            f"model_type {model_type!r} ({type(model).__name__}) has no table adapter and introspection could not "
            f"find: {', '.join(missing)}. "
            + (
                "No vision encoder was found: a model that is not a vision-language model, or one whose images "
                "reach the decoder as the tokens of a VQ tokenizer (Chameleon, Emu3: no encoder features for a "
                f"projector to map), is not supported (top-level modules: {', '.join(_children(_top(model, roots)))}). "
                if "vision_encoder" in missing
                else ""
            )
            + ("".join(f"Found: {w}. " for w in why))
            + "Add an adapter with hooks.register_adapter({...}) naming these module paths."
        )
    import inspect

    parameters = list(inspect.signature(model.forward).parameters)
    accepted = set(parameters)
    video = tuple(n for n in ("video_token_id", "video_token_index") if getattr(config, n, None) is not None)
    # the pixel inputs the forward takes, by name (a guess, said in resolve()'s warning):
    # a pixel input the branches do not know would reach the model unexpanded
    pixels = tuple(n for n in parameters if n.startswith(PIXEL_INPUT_PREFIX)) or ("pixel_values",)
    return Adapter(model_type=model_type, source="introspection", linear_attention=linear, token_layout="unknown",
                   video_token_id=video, image_inputs=tuple(n for n in IMAGE_INPUT_NAMES if n in accepted),
                   pixel_inputs=pixels, **found)  # type: ignore[arg-type]


def _top(model: nn.Module, roots: tuple[str, ...]) -> nn.Module:
    """The module holding the parts: the inner ``model`` where there is one."""
    return model.get_submodule(roots[-1]) if roots[-1] else model


def _children(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_children()]


def _accessor(model: nn.Module, name: str) -> nn.Module | None:
    """``model.<name>()`` (Hugging Face's embedding accessors), or None where the model has
    none or transformers cannot work it out (it raises NotImplementedError for some)."""
    try:
        return getattr(model, name)() if hasattr(model, name) else None
    except (NotImplementedError, AttributeError):
        return None
