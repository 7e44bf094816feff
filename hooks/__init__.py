"""Model-agnostic hook machinery for Hugging Face vision-language models.

``hooks`` knows *where* things are inside a VLM -- vision encoder, projector, decoder
layers, their self-attention, LM head, token embeddings, image-token positions, pixel
inputs -- and attaches forward hooks whose handles it owns and always removes. It knows
nothing about hallucination; :mod:`mitigate` builds on it.

    >>> from hooks import HookGroup, resolve
    >>> points = resolve(model)                       # doctest: +SKIP
    >>> with HookGroup() as group:                    # doctest: +SKIP
    ...     group.keep_generate_uncompiled(model)         # hooks.compiled: why
    ...     points.add_hook(group, "lm_head.output", lambda m, a, k, out: out)
    ...     model.generate(**inputs)
"""

from .adapters import Adapter, get_adapter, register_adapter, supported_model_types
from .adapters.introspect import HookPointError, introspect_adapter
from .attention import BiasContext, add_attention_bias, key_bias
from .capture import AttentionCapture
from .describe import inspect
from .group import HookGroup, groups_on, hook_state
from .points import POINTS, ModelPoints, resolve

__all__ = [
    "Adapter",
    "AttentionCapture",
    "BiasContext",
    "HookGroup",
    "HookPointError",
    "ModelPoints",
    "POINTS",
    "add_attention_bias",
    "get_adapter",
    "groups_on",
    "hook_state",
    "inspect",
    "introspect_adapter",
    "key_bias",
    "register_adapter",
    "resolve",
    "supported_model_types",
]
