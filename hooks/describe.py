"""``hooks.inspect(model)``: show what every abstract hook point resolved to."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from torch import nn

from .points import resolve


def inspect(model: nn.Module, *, file: TextIO | None = sys.stdout) -> dict[str, Any]:
    """Resolve ``model``'s hook points, print them as a table (unless ``file=None``) and return them.

    Raises :class:`hooks.HookPointError` naming the model type and the missing points when
    ``model`` is not a vision-language model or its parts cannot be found.
    """
    info = resolve(model).describe()
    if file is not None:
        width = max(len(k) for k in info)
        for key, value in info.items():
            print(f"{key:<{width}}  {value}", file=file)
    return info


def _shape_of(value: Any) -> tuple[int, ...] | None:
    """Shape of a hook's tensor payload: a tensor, a ModelOutput / tuple's first tensor."""
    import torch

    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    for attr in ("last_hidden_state", "pooler_output", "logits"):
        item = getattr(value, attr, None)
        if isinstance(item, torch.Tensor):
            return tuple(item.shape)
    if isinstance(value, (tuple, list)):
        for item in value:
            shape = _shape_of(item)
            if shape is not None:
                return shape
    return None


def trace(model: nn.Module, inputs: dict[str, Any]) -> dict[str, list[tuple[int, ...] | None]]:
    """Run one forward pass with a recording hook on every abstract point.

    Returns, per point name, the shapes seen in call order (one entry per layer for
    per-layer points). Input points record ``hidden_states`` / ``inputs_embeds``; output
    points record the output. All hooks are removed afterwards, whatever happens.
    """
    import torch

    from .group import HookGroup
    from .points import PER_LAYER, POINTS

    points = resolve(model)
    seen: dict[str, list] = {name: [] for name in POINTS}

    def recorder(name: str, per_layer: bool, kind: str):
        def record(*hook_args: Any) -> None:
            hook_args = hook_args[1:] if per_layer else hook_args  # drop the layer index
            _module, args, kwargs = hook_args[:3]
            if kind == "output":
                seen[name].append(_shape_of(hook_args[3]))
            else:
                payload = kwargs.get("hidden_states", kwargs.get("inputs_embeds"))
                seen[name].append(_shape_of(payload if payload is not None else args))

        return record

    with HookGroup("trace") as group, torch.no_grad():
        for name, (attr, kind) in POINTS.items():
            points.add_hook(group, name, recorder(name, attr in PER_LAYER, kind))
        model(**inputs)
    return seen
