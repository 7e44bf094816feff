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


def _weak(cache: Any) -> Callable[[], Any] | None:
    if cache is None:
        return None
    try:
        return weakref.ref(cache)
    except TypeError:  # an object without weak references: held as long as the hook's state
        return lambda: cache
