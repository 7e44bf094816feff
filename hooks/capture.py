"""Attention weights of chosen decoder layers, recomputed from the queries and keys the
layer's own attention call receives -- without switching the model to eager attention.

Every transformers decoder computes its (post-RoPE) queries and keys and hands them to an
*attention function* looked up by name (``config._attn_implementation``: ``sdpa``,
``eager``, ``flash_attention_2`` …) in transformers' ``AttentionInterface``. For the
chosen layers only, :class:`AttentionCapture` gives the attention module a copy of its
config naming a registered wrapper (``"hallu_capture"``; an owned
:meth:`HookGroup.patch_attribute`, restored exactly on detach). The wrapper

1. calls the module's original attention function with the same arguments, so the
   layer's output -- and everything the model returns -- is exactly what it was;
2. while the capture is *armed*, computes ``softmax(q_P · Kᵀ · scaling + mask)`` for the
   requested query positions ``P`` only (e.g. the last prompt token), with the mask the
   original function got (``None`` + causal, boolean, additive float or flash's 2-D
   padding mask), grouped-query heads expanded and a ``softcap`` applied when the call
   passes one.

That is ``P × K`` scores per head instead of eager attention's ``K × K`` on the whole
prompt (issue 6: "recompute those layers' attention scores from captured queries and
keys"). Because the output is untouched, a capture can ride along the caller's own
``generate()``: armed for one forward, it records each chosen layer at the prefill and
lets the decoding steps pass (:meth:`AttentionCapture.arm`).

Attention sinks (``s_aux``) are not modelled: a call that passes them is refused with a
clear error rather than given weights that do not sum as the model's do.
"""

from __future__ import annotations

import copy
import sys
from typing import Callable, Iterable

import torch

from .group import HookGroup
from .points import ModelPoints

IMPLEMENTATION = "hallu_capture"
_STATE = "_hallu_capture"  # attribute of the config copy: (capture, layer index, inner function)
WRAPS = "_hallu_capture_wraps"  # attribute of the config copy: the implementation the capture wraps


def _registered() -> None:
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if IMPLEMENTATION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(IMPLEMENTATION, _capture_forward)


def _inner_function(module: torch.nn.Module, name: str) -> Callable:
    """The function the module would have called for implementation ``name``: the
    registered one, or for ``eager`` the module's own file's ``eager_attention_forward``
    (it differs per family: softcapping, sinks, ...)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name == "eager":
        fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if fn is None:  # a module defined outside a modeling file: the reference eager
            from transformers.models.llama.modeling_llama import eager_attention_forward as fn
        return fn
    if name == IMPLEMENTATION:
        raise ValueError("attention is already being captured on this module by another AttentionCapture")
    if name not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"attention implementation {name!r} is not registered with transformers")
    return ALL_ATTENTION_FUNCTIONS[name]


def _capture_forward(module, query, key, value, attention_mask, *args, **kwargs):
    capture, layer, inner = getattr(module.config, _STATE)
    out = inner(module, query, key, value, attention_mask, *args, **kwargs)
    if capture.wants(layer):
        capture.record(layer, query, key, attention_mask, kwargs)
    return out


def attention_probabilities(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
                            positions: torch.Tensor, *, scaling: float | None = None,
                            softcap: float | None = None, is_causal: bool = True) -> torch.Tensor:
    """``(B, H, len(positions), K)`` attention probabilities of the query rows ``positions``
    (indices into ``query``'s sequence axis), as the layer's attention computes them.

    ``query`` is ``(B, H, Q, D)``, ``key`` ``(B, Hkv, K, D)`` (grouped-query heads are
    expanded); ``mask`` is what the attention function received: None (causal when
    ``is_causal``), boolean ``(B|1, 1|H, Q, K)`` (True = attend), additive float of that
    shape, or a 2-D ``(B, K)`` padding mask (flash attention; causal added)."""
    q = query[:, :, positions].float()
    k = key.float()
    if k.shape[1] != q.shape[1]:
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"{q.shape[1]} query heads cannot share {k.shape[1]} key heads")
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    n_query, n_key = query.shape[2], key.shape[2]
    absolute = positions.to(scores.device) + (n_key - n_query)  # queries are the last n_query positions
    causal = torch.arange(n_key, device=scores.device)[None, :] <= absolute[:, None]  # (P, K)
    if mask is None:
        if is_causal:
            scores = scores.masked_fill(~causal, float("-inf"))
    elif mask.dim() == 2:
        keep = mask.to(scores.device).bool()[:, None, None, :] & causal[None, None]
        scores = scores.masked_fill(~keep, float("-inf"))
    else:
        rows = mask[:, :, positions.to(mask.device)] if mask.shape[2] == n_query else mask
        rows = rows[..., -n_key:].to(scores.device)
        if rows.dtype == torch.bool:
            scores = scores.masked_fill(~rows, float("-inf"))
        else:
            scores = scores + rows.float()
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a fully masked (padding) row: zeros


def _empty_after(mask, end: int) -> bool:
    """Whether ``mask`` blocks every key column from ``end`` on, for every query: the empty
    slots of a static cache's buffer (a 2-D padding mask of ``end`` columns says the same)."""
    if not isinstance(mask, torch.Tensor):
        return False
    if mask.dim() == 2:
        return mask.shape[-1] <= end
    after = mask[..., end:]
    blocked = ~after if after.dtype == torch.bool else after <= torch.finfo(after.dtype).min / 2
    return bool(blocked.all())


class AttentionCapture:
    """Records, for the chosen decoder ``layers``, the attention of some query positions.

    ``attach(group)`` installs the wrapper on those layers (output unchanged). ``arm(rows,
    seq_len, weights)`` asks for the next forward's prefill: ``weights`` is ``(rows,
    seq_len)`` (a weighting of query positions per row, e.g. the question's tokens) or None
    for the last position. Each chosen layer then records once, its first call with the
    whole prompt as queries, ``(rows, heads, keys)`` = the weights' mix of the attention
    rows (later decoding steps are ignored; rows past ``rows`` -- contrast branches
    appended to the batch -- are dropped). ``take()`` returns ``(rows, layers x heads, keys)``
    and disarms.
    """

    def __init__(self, points: ModelPoints, layers: Iterable[int]) -> None:
        self.points = points
        self.layers = points.attention_layer_indices(layers)
        if not self.layers:
            raise ValueError("layers: at least one decoder layer to capture")
        self._armed: dict | None = None
        self._taken: dict[int, torch.Tensor] = {}

    def attach(self, group: HookGroup) -> None:
        _registered()
        for index in self.layers:
            module = self.points.attention[index]
            config = getattr(module, "config", None)
            if config is None or not hasattr(config, "_attn_implementation"):
                raise ValueError(f"layer {index}'s attention ({type(module).__name__}) has no config naming its "
                                 "attention implementation; its attention cannot be captured")
            inner = _inner_function(module, config._attn_implementation or "eager")
            mine = copy.copy(config)
            setattr(mine, WRAPS, config._attn_implementation or "eager")  # what the decoder really runs
            mine._attn_implementation = IMPLEMENTATION
            setattr(mine, _STATE, (self, index, inner))
            group.patch_attribute(module, "config", mine)

    def arm(self, rows: int, seq_len: int, weights: torch.Tensor | None = None, *, prefix: int = 0) -> None:
        """``prefix``: the cached positions before the ``seq_len`` queries (0 at a prefill)."""
        if weights is not None and tuple(weights.shape) != (rows, seq_len):
            raise ValueError(f"weights has shape {tuple(weights.shape)}, expected ({rows}, {seq_len})")
        # the query positions to score: the union over rows of the weighted ones (None: the last)
        positions = None if weights is None else weights.abs().sum(0).nonzero(as_tuple=True)[0]
        self._armed = {"rows": rows, "seq_len": seq_len, "weights": weights, "positions": positions,
                       "prefix": prefix}
        self._taken = {}

    def wants(self, layer: int) -> bool:
        return self._armed is not None and layer not in self._taken

    def record(self, layer: int, query: torch.Tensor, key: torch.Tensor, mask, kwargs: dict) -> None:
        armed = self._armed
        end = armed["prefix"] + armed["seq_len"]
        whole = query.shape[2] == armed["seq_len"]
        if (whole or query.shape[2] == 1) and key.shape[2] > end:
            # no mask is causal from the first key: a whole prompt's prefill, never one query
            if _empty_after(mask, end) if mask is not None else whole:
                # a static cache: the keys are its whole buffer, the positions so far in its
                # first slots and empty, masked ones after them -- no position of ours
                key = key[:, :, :end]
                mask = mask[..., :end] if isinstance(mask, torch.Tensor) and mask.shape[-1] > end else mask
            elif whole:
                raise ValueError(
                    f"attention capture: layer {layer}'s {armed['seq_len']} queries follow {key.shape[2] - armed['seq_len']} "
                    f"cached positions, not the {armed['prefix']} it was armed with (a prompt continued over a cache "
                    "filled earlier); localise over the whole conversation in one forward")
        # a KV-shared layer (Gemma 4) at generate()'s prefill: transformers computes its last
        # query only, over the whole prompt's keys
        last_only = query.shape[2] == 1 and armed["seq_len"] > 1 and key.shape[2] == armed["seq_len"]
        if query.shape[2] == 1 and armed["seq_len"] > 1 and not last_only:
            return  # a decoding step of an un-captured prefill: take() will say so
        if last_only and armed["positions"] is not None:
            raise ValueError(f"layer {layer} shares an earlier layer's keys: at the prefill transformers computes only "
                             "its last query, so only the last token's attention (queries='last') can be read there; "
                             "choose a layer that is not KV-shared")
        if query.shape[2] != armed["seq_len"] and not last_only:
            raise ValueError(
                f"attention capture expected the whole prompt ({armed['seq_len']} positions) in one call, layer "
                f"{layer} got {query.shape[2]}: do not use prefill_chunk_size while capturing")
        if kwargs.get("s_aux") is not None:
            raise ValueError("attention sinks (s_aux) are not supported by the attention capture")
        rows = armed["rows"]
        module = self.points.attention[layer]
        positions = armed["positions"]
        positions = (torch.full((1,), query.shape[2] - 1, device=query.device) if positions is None
                     else positions.to(query.device))
        probs = attention_probabilities(
            query[:rows], key[:rows], None if mask is None else mask[:rows] if mask.shape[0] > 1 else mask,
            positions, scaling=kwargs.get("scaling"), softcap=kwargs.get("softcap"),
            is_causal=bool(getattr(module, "is_causal", True)))
        if armed["weights"] is None:
            self._taken[layer] = probs[:, :, 0]
        else:
            w = armed["weights"].to(probs.device)[:, positions].float()
            self._taken[layer] = torch.einsum("bq,bhqk->bhk", w, probs)

    def take(self) -> torch.Tensor:
        missing = [i for i in self.layers if i not in self._taken]
        self._armed = None
        if missing:
            raise RuntimeError(f"attention capture: layers {missing} saw no prompt forward since arm()")
        taken, self._taken = self._taken, {}
        return torch.cat([taken[i].to(taken[self.layers[0]].device) for i in self.layers], dim=1)
