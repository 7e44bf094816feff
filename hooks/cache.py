"""Where a forward call carries its KV cache, across transformers versions.

transformers 5.24 renamed the cache argument of every model and attention ``forward``
from ``past_key_values`` to ``cache`` (the old keyword is still accepted by models and
renamed before it reaches the layers, so hooks on inner modules see only the new name;
``output.past_key_values`` survives as a deprecated alias). The hooks read whichever name
the running version uses, so one toolkit release works on both sides of the rename.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any, Callable

# the current name first: a call on transformers >= 5.24 never carries the old one
CACHE_NAMES = ("cache", "past_key_values")


def cache_of(kwargs: dict) -> Any:
    """The KV cache a forward call received as a keyword, or ``None``."""
    for name in CACHE_NAMES:
        value = kwargs.get(name)
        if value is not None:
            return value
    return None


def cache_parameter(forward: Callable) -> tuple[str | None, int | None]:
    """``(name, positional index)`` of a forward's cache parameter, ``(None, None)`` if it has none."""
    names = [p.name for p in inspect.signature(forward).parameters.values()]
    for name in CACHE_NAMES:
        if name in names:
            return name, names.index(name)
    return None, None


def output_cache(output: Any) -> Any:
    """The cache a model's output returns (``output.cache``, before 5.24 ``output.past_key_values``).

    Model outputs are dicts as well as dataclasses; the keys are read first, so the
    deprecated ``past_key_values`` property of a 5.24 output is never touched."""
    if isinstance(output, dict):
        return cache_of(output)
    for name in CACHE_NAMES:
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None


def drop_output_cache(output: Any) -> None:
    """Set the cache a generate() output returns to None, in its dict as well as its attribute
    (a ``ModelOutput`` keeps both, and ``output.x = None`` leaves the dict's entry, which
    ``output["cache"]``, ``to_tuple()`` and :func:`output_cache` read)."""
    for name in CACHE_NAMES:
        if isinstance(output, dict) and name in output:
            output[name] = None
        elif name in getattr(type(output), "__dataclass_fields__", {}):
            object.__setattr__(output, name, None)


class PromptCache:
    """Which KV cache a hook's last prompt forward filled, held weakly (a finished call's
    cache is not kept alive), so that a later forward can be checked to continue it and
    not another call's: hooks that keep per-prompt state (contrast branches' rows and
    image positions, prior suppression's spans) would otherwise apply it to the wrong
    conversation."""

    def __init__(self) -> None:
        self._ref: Callable[[], Any] | None = None

    def filled(self, cache: Any) -> None:
        """A prompt forward ran over ``cache`` (None: the model makes its own, see :meth:`made`)."""
        self._ref = _weak(cache)

    def made(self, output: Any) -> None:
        """After that forward: the cache the model made itself, when it was given none (a
        manual decoding loop continues it)."""
        if self._ref is None:
            self._ref = _weak(output_cache(output))

    def continues(self, cache: Any) -> bool:
        """Whether ``cache`` is the one the last prompt forward filled."""
        return self._ref is not None and self._ref() is cache

    def current(self) -> Any:
        """That cache, while anything else still holds it; else ``None``."""
        return None if self._ref is None else self._ref()


def keep_first_rows(cache: Any, rows: int, total: int) -> bool:
    """Cut ``cache`` in place to its first ``rows`` batch rows where its layers hold
    ``total``; True when it was cut.

    Contrast branches append their rows after the original ones, so a cache they filled
    holds ``total = rows * (K + 1)``; cut back, it is the cache the unmitigated model
    would hold after the same tokens (every row is computed independently), and plain
    decoding can continue it. Done for dynamic caches -- full-attention, sliding-window
    and indexed layers through transformers' own ``batch_select_indices``, the recurrent
    and convolution states of linear-attention layers; shared-KV placeholders hold nothing. Not for static caches
    (preallocated for ``total`` rows, and reused by the next ``generate()`` as they are),
    quantized or offloaded ones, nor for a cache whose layers do not all hold ``total``
    rows: those are left untouched (False)."""
    import torch
    from transformers.cache_utils import (BaseQuantizedLayer, DummyLayer, DynamicLayer, LinearAttentionCacheLayerMixin,
                                          StaticLayer)

    layers = getattr(cache, "layers", None)
    if not layers or getattr(cache, "offloading", False) or rows <= 0 or total <= rows:
        return False
    cuts = []  # (layer, key/value tensors to cut?, linear-attention state dicts)
    for layer in layers:
        if isinstance(layer, DummyLayer):
            continue  # a layer that reads another's keys and values (Gemma 4's shared KV) holds none
        linear = isinstance(layer, LinearAttentionCacheLayerMixin)
        if isinstance(layer, (BaseQuantizedLayer, StaticLayer)) or not (isinstance(layer, DynamicLayer) or linear):
            return False  # static, quantized or unknown layers: not ours to reshape
        kv = isinstance(layer, DynamicLayer) and layer.get_seq_length() > 0
        if kv and layer.keys.shape[0] != total:
            return False
        states = [layer.conv_states, layer.recurrent_states] if linear else []
        if any(t is not None and t.shape[0] != total for d in states for t in d.values()):
            return False
        cuts.append((layer, kv, states))
    for layer, kv, states in cuts:
        if kv:
            layer.batch_select_indices(torch.arange(rows, device=layer.keys.device))
        for d in states:
            for key, t in d.items():
                if t is not None:
                    d[key] = t[:rows].clone()
    return True


def _weak(cache: Any) -> Callable[[], Any] | None:
    if cache is None:
        return None
    try:
        return weakref.ref(cache)
    except TypeError:  # an object without weak references: held as long as the hook's state
        return lambda: cache
