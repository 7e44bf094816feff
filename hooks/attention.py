"""An additive bias on decoder self-attention scores, for ``sdpa`` and ``eager`` alike.

The bias is injected by a pre-forward hook on each chosen self-attention module: it
rewrites the module's ``attention_mask`` argument into an additive float mask
``mask + bias``, which both transformers' eager attention (``scores + mask``) and
PyTorch's ``scaled_dot_product_attention`` (a float ``attn_mask`` is added to the scores)
apply before the softmax. No eager attention is forced on the model.

Two traps this handles (DESIGN.md §3):

* Under ``sdpa`` transformers passes ``attention_mask=None`` when the 2-D mask is all
  ones and relies on ``is_causal``; editing ``None`` would change nothing, silently. Here
  the causal pattern is built explicitly from absolute positions in that case.
* Under ``sdpa`` the mask is boolean (``True`` = attend), under ``eager`` it is an
  additive float mask; both are converted to one additive float form.

Positions are *sequence indices* (the column in ``input_ids`` for the prompt, then one
per generated token), independent of rotary/M-RoPE positions, so a bias never moves
positions. For a query at index ``i`` and a key at index ``j`` the score becomes
``q_i·k_j/√d + mask_ij + bias_ij``; the sum is clamped at the dtype's minimum so a row
that ends up fully masked (a padding row) stays finite, as transformers' own masks do.

Flash-attention kernels take no additive mask: asking for a bias there is an error.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from .cache import cache_of, cache_parameter
from .group import HookGroup
from .points import ModelPoints

SUPPORTED_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass(frozen=True)
class BiasContext:
    """What a bias function knows about one attention call.

    ``query_positions`` (Q,) and ``key_positions`` (K,) are absolute sequence indices;
    ``layer`` is the decoder layer index; ``dtype``/``device`` are those of the scores.
    ``key_offset`` is ``key_positions[0]`` as a Python int (the keys are a contiguous
    range), so a bias can slice a precomputed row without a device sync per step.
    """

    layer: int
    batch_size: int
    query_positions: torch.Tensor
    key_positions: torch.Tensor
    dtype: torch.dtype
    device: torch.device
    key_offset: int = 0


BiasFn = Callable[[BiasContext], "torch.Tensor | None"]


def key_bias(key_mask: torch.Tensor, value: float, *, query_from: torch.Tensor | int | None = None) -> BiasFn:
    """A bias of ``value`` on the keys where ``key_mask`` (batch, seq) is True.

    ``value=-inf`` removes those keys from attention (the same as a 0 in the 2-D attention
    mask, but without moving any position); a finite negative value down-weights them.
    With ``query_from`` (an int, or a (batch,) tensor of per-row indices) only queries at
    sequence index ``>= query_from`` get the bias. Keys beyond ``key_mask``'s length
    (generated tokens) get none.
    """
    if not isinstance(key_mask, torch.Tensor) or key_mask.dim() != 2 or key_mask.dtype != torch.bool:
        raise ValueError("key_mask must be a boolean (batch, seq) tensor")
    if not isinstance(value, (int, float)) or value != value or value > 0:
        raise ValueError(f"value must be a non-positive number (or -inf), got {value!r}")

    def bias(ctx: BiasContext) -> torch.Tensor | None:
        if ctx.batch_size != key_mask.shape[0]:
            raise ValueError(
                f"key_bias was built for batch {key_mask.shape[0]} but the model ran batch {ctx.batch_size} "
                "(beam search or contrast branches expand the batch; build the mask for the expanded batch)"
            )
        keys = ctx.key_positions
        inside = keys < key_mask.shape[1]
        cols = torch.where(inside, keys, torch.zeros_like(keys)).to(key_mask.device)
        hit = key_mask[:, cols] & inside.to(key_mask.device)[None, :]  # (B, K)
        if not bool(hit.any()):
            return None
        out = torch.zeros(ctx.batch_size, 1, len(ctx.query_positions), len(keys), dtype=ctx.dtype, device=ctx.device)
        out = out.masked_fill(hit.to(ctx.device)[:, None, None, :], float(value))
        if query_from is not None:
            start = torch.as_tensor(query_from, device=ctx.device).reshape(-1, 1)  # (B|1, 1)
            applies = ctx.query_positions.to(ctx.device)[None, :] >= start  # (B|1, Q)
            out = torch.where(applies[:, None, :, None], out, torch.zeros((), dtype=ctx.dtype, device=ctx.device))
        return out

    return bias


def add_attention_bias(
    group: HookGroup,
    points: ModelPoints,
    bias_fn: BiasFn,
    *,
    layers: Iterable[int] | None = None,
    same_for_all_layers: bool = False,
) -> list:
    """Add ``bias_fn(ctx)`` to the attention scores of the chosen decoder layers.

    ``bias_fn`` returns a tensor broadcastable to ``(batch, heads, Q, K)`` (use 1 for
    heads), or ``None`` for no change on that call. The hooks belong to ``group``.

    ``same_for_all_layers=True`` promises that ``bias_fn`` ignores ``ctx.layer``: the
    biased mask is then built once per forward and reused by every layer that receives the
    same mask (same tensor, same positions) -- transformers passes one mask object to all
    layers of an attention type. This is what keeps the cost of a bias near zero on small
    models, where rebuilding the mask in each layer was a third of a decoding step. The
    memo is cleared by a pre-forward hook on the language model, so each forward (each
    decoding step, each new prompt) computes its own.

    With ``same_for_all_layers=True`` on every attention layer of a decoder that builds one
    causal mask for all its layers (the adapter's ``shared_causal_mask``, no sliding-window
    layers), a single pre-forward hook on the language model builds that mask as
    transformers would, folds the bias in, and hands the 4-D result to the language model,
    which uses a 4-D mask as it is: no hook on the attention modules at all. Each hooked
    module costs a decoding step its hook dispatch; on a 4-layer model that was about half
    of context-mode prior suppression's overhead. Same scores as the per-layer hooks (tested).
    """
    impl = points.attn_implementation
    if impl not in SUPPORTED_IMPLEMENTATIONS:
        raise ValueError(
            f"an additive attention bias needs attention in {SUPPORTED_IMPLEMENTATIONS}; the model uses {impl!r} "
            f"(load it with attn_implementation='sdpa')"
        )
    if not callable(bias_fn):
        raise TypeError("bias_fn must be callable: bias_fn(BiasContext) -> tensor | None")

    handles = []
    chosen = points.attention_layer_indices(layers)
    if same_for_all_layers and shares_one_mask(points, chosen):
        handles.append(group.add_forward_pre_hook(points.language_model, _SharedMaskHook(points, bias_fn, chosen[0])))
        return handles
    memo = _Memo() if same_for_all_layers else None
    if memo is not None:
        handles.append(group.add_forward_pre_hook(points.language_model, memo.clear))
    for index in chosen:
        module = points.attention[index]
        handles.append(group.add_forward_pre_hook(module, _BiasHook(index, module, bias_fn, memo)))
    return handles


class _Memo:
    """The biased mask of the current forward, keyed by the incoming mask (identity) and the
    layer kind and shape; cleared before every forward of the language model."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.mask: torch.Tensor | None = None  # the incoming mask (held so its identity stays valid)
        self.value: torch.Tensor | None = None

    def clear(self, *_: object) -> None:
        self.key = self.mask = self.value = None

    def get(self, mask: torch.Tensor | None, key: tuple):
        """The memoised mask, ``False`` for "no bias on this forward", None when not memoised."""
        if self.key == key and self.mask is mask:
            return self.value
        return None

    def put(self, mask: torch.Tensor | None, key: tuple, value: "torch.Tensor | bool") -> None:
        self.key, self.mask, self.value = key, mask, value


class _BiasHook:
    """Pre-forward hook that folds a bias into one attention module's mask."""

    def __init__(self, layer: int, module: nn.Module, bias_fn: BiasFn, memo: _Memo | None = None) -> None:
        self.layer = layer
        self.memo = memo
        self.cache_layer = getattr(module, "layer_idx", layer)
        self.bias_fn = bias_fn
        self.is_causal = bool(getattr(module, "is_causal", True))
        # layers of one kind ("full_attention", "sliding_attention", ...) see the same cache
        # sizes within a forward, so they can share a memoised mask
        types = getattr(getattr(module, "config", None), "layer_types", None)
        self.kind = types[self.cache_layer] if types and self.cache_layer < len(types) else "attention"
        params = [p for p in inspect.signature(module.forward).parameters.values()]
        names = [p.name for p in params]
        self.mask_index = names.index("attention_mask") if "attention_mask" in names else None
        self.cache_index = cache_parameter(module.forward)[1]
        # Gemma 4's KV-shared layers read the keys an earlier layer of their type stored
        # (``shared_kv_states``; a sliding window's last positions), hold nothing in the
        # cache, and at generate()'s prefill compute only the last query: their queries are
        # the last of the tokens seen, their keys the last ``len(keys)`` of them
        self.layer_type = getattr(module, "layer_type", None)
        self.kv_shared = bool(getattr(module, "is_kv_shared_layer", False))
        if self.kv_shared:  # the cache layer that counts the tokens: the last earlier one of its type holding keys
            modes = getattr(module.config, "kv_sharing_modes", None) or []
            owners = [j for j in range(min(self.cache_layer, len(modes)))
                      if modes[j] != "reuse" and types and types[j] == self.layer_type]
            self.cache_layer = owners[-1] if owners else 0

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if not isinstance(hidden, torch.Tensor):
            raise RuntimeError(f"attention bias: cannot find hidden_states in the call of layer {self.layer}")
        batch, q_len = hidden.shape[0], hidden.shape[1]
        mask = _call_arg(args, kwargs, "attention_mask", self.mask_index)
        device, dtype = hidden.device, hidden.dtype
        key = (self.kind, batch, q_len, self.is_causal, dtype, device)
        new_mask = self.memo.get(mask, key) if self.memo is not None else None
        if new_mask is False:
            return None
        if new_mask is None:
            new_mask = self._build(args, kwargs, mask, batch, q_len, dtype, device)
            if self.memo is not None:
                self.memo.put(mask, key, False if new_mask is None else new_mask)
            if new_mask is None:
                return None
        return _with_arg(args, kwargs, "attention_mask", self.mask_index, new_mask)

    def _build(self, args, kwargs, mask, batch, q_len, dtype, device) -> torch.Tensor | None:
        cache = cache_of(kwargs)
        if cache is None and self.cache_index is not None and self.cache_index < len(args):
            cache = args[self.cache_index]
        shared = (kwargs.get("shared_kv_states") or {}).get(self.layer_type) if self.kv_shared else None
        if self.kv_shared and shared is None:
            raise RuntimeError(f"attention bias: layer {self.layer} shares another layer's keys, which its call did "
                               "not carry (shared_kv_states)")
        if shared is not None:
            # the owner layer has already added this forward's tokens; a sliding window's
            # shared keys are its last kv_len positions -- or, from a static cache, its whole
            # buffer from position 0, slots past the tokens so far empty (and masked)
            kv_len = shared[0].shape[-2]
            total = int(cache.get_seq_length(self.cache_layer)) if cache is not None else kv_len
            q_start, kv_offset = total - q_len, max(total - kv_len, 0)
        elif cache is not None:
            q_start = int(cache.get_seq_length(self.cache_layer))
            kv_len, kv_offset = cache.get_mask_sizes(q_len, self.cache_layer)
        else:
            q_start, kv_len, kv_offset = 0, q_len, 0
        if mask is not None and not isinstance(mask, torch.Tensor):
            raise TypeError(
                f"attention bias: layer {self.layer} received an attention mask of type {type(mask).__name__}; "
                "only tensor masks (sdpa/eager) can take an additive bias"
            )
        if isinstance(mask, torch.Tensor):
            kv_len = mask.shape[-1]
        q_pos = torch.arange(q_start, q_start + q_len, device=device)
        k_pos = torch.arange(int(kv_offset), int(kv_offset) + int(kv_len), device=device)
        bias = self.bias_fn(BiasContext(self.layer, batch, q_pos, k_pos, dtype, device, int(kv_offset)))
        if bias is None:
            return None
        return _fold(mask, bias, q_pos, k_pos, self.is_causal, dtype)


def shares_one_mask(points: ModelPoints, layers: list[int]) -> bool:
    """Whether a bias that is the same in every layer can be folded once into the mask the
    language model builds for all its layers (:class:`_SharedMaskHook`): the adapter says
    the language model builds one causal mask from the 2-D mask, every decoder layer is an
    attention layer and chosen, and its config has no sliding-window layers (their mask
    differs from the full layers')."""
    if not points.adapter.shared_causal_mask or layers != list(range(points.num_layers)):
        return False
    config = getattr(points.language_model, "config", None)
    types = getattr(config, "layer_types", None)
    if types:
        return all(kind == "full_attention" for kind in types)
    return getattr(config, "sliding_window", None) is None or getattr(config, "use_sliding_window", True) is False


class _SharedMaskHook:
    """Pre-forward hook on the language model: the causal mask it would build for all its
    layers (transformers' ``create_causal_mask``, same arguments), with the bias folded in,
    passed in place of its 2-D mask. ``create_causal_mask`` returns a 4-D mask as it is, so
    every layer gets the biased mask and the mask is built once per forward, as before."""

    def __init__(self, points: ModelPoints, bias_fn: BiasFn, layer: int) -> None:
        from transformers.masking_utils import create_causal_mask

        model = points.language_model
        self.bias_fn, self.layer, self.config = bias_fn, layer, model.config
        self.create = create_causal_mask
        self.create_cache = cache_parameter(create_causal_mask)[0]
        self.index = {p.name: i for i, p in enumerate(inspect.signature(model.forward).parameters.values())}
        self.cache_name = cache_parameter(model.forward)[0]
        self.model_type = points.model_type
        self.multimodal_rope = points.adapter.multimodal_rope

    def _arg(self, args: tuple, kwargs: dict, name: str | None):
        return None if name is None else _call_arg(args, kwargs, name, self.index.get(name))

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict):
        mask = self._arg(args, kwargs, "attention_mask")
        mapping = isinstance(mask, dict)
        if mapping:
            # masks prepared per layer type (generate() does this for a static cache on text
            # configs with layer_types): one type here, checked at attach time
            if set(mask) != {"full_attention"}:
                raise RuntimeError(f"attention bias: the {self.model_type} language model received masks for layer "
                                   f"types {sorted(mask)}; one mask for all layers was expected (full attention only)")
            mask = mask["full_attention"]
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4) or (mapping and mask.dim() != 4)):
            raise RuntimeError(
                f"attention bias: the {self.model_type} language model received an attention mask of type "
                f"{type(mask).__name__}{'' if not isinstance(mask, torch.Tensor) else f' and {mask.dim()} dims'}, "
                "neither a 2-D padding mask nor a prepared 4-D mask")
        embeds = self._arg(args, kwargs, "inputs_embeds")
        lead = embeds if embeds is not None else self._arg(args, kwargs, "input_ids")
        if not isinstance(lead, torch.Tensor):
            raise RuntimeError(f"attention bias: the {self.model_type} language model call has neither "
                               "inputs_embeds nor input_ids")
        batch, q_len, device = lead.shape[0], lead.shape[1], lead.device
        dtype = embeds.dtype if embeds is not None else module.get_input_embeddings().weight.dtype
        cache = cache_of(kwargs)  # either keyword (past_key_values before transformers 5.24, or still accepted)
        if cache is None:
            cache = self._arg(args, kwargs, self.cache_name)
        if cache is not None:
            q_start = int(cache.get_seq_length(self.layer))
            kv_len, kv_offset = cache.get_mask_sizes(q_len, self.layer)
        else:  # the language model starts an empty cache, or runs without one
            q_start, kv_offset = 0, 0
            kv_len = mask.shape[-1] if mask is not None else q_len
        if isinstance(mask, torch.Tensor) and mask.dim() == 4:
            kv_len = mask.shape[-1]  # a mask given in 4-D is used as it is, by every layer
        q_pos = torch.arange(q_start, q_start + q_len, device=device)
        k_pos = torch.arange(int(kv_offset), int(kv_offset) + int(kv_len), device=device)
        bias = self.bias_fn(BiasContext(self.layer, batch, q_pos, k_pos, dtype, device, int(kv_offset)))
        if bias is None:
            return None  # the language model builds its own mask, unchanged
        if q_len == 1 and cache is not None and (mask is None or mask.dim() == 2):
            # a decoding step: what create_causal_mask gives a single query, built directly
            # (it was a third of this hook's time): the keys the 2-D mask keeps (zeros past
            # its end, as transformers pads it), up to the query's position (a static cache
            # holds empty slots beyond it)
            keep = None
            if mask is not None:
                end = int(kv_offset) + int(kv_len)
                keep = mask[:, int(kv_offset) : end].to(device=device, dtype=torch.bool)
                if keep.shape[-1] < int(kv_len):
                    keep = torch.nn.functional.pad(keep, (0, int(kv_len) - keep.shape[-1]))
            if int(kv_offset) + int(kv_len) - 1 > q_start:
                causal = (k_pos <= q_start)[None, :]
                keep = causal if keep is None else keep & causal
            bias = bias.to(dtype)
            if keep is not None:
                bias = torch.where(keep[:, None, None, :], bias, torch.finfo(dtype).min)
            new_mask = bias.clamp(min=torch.finfo(dtype).min)
            return self._replace(args, kwargs, new_mask, mapping)
        if mask is None or mask.dim() == 2:
            use_cache = self._arg(args, kwargs, "use_cache")
            caches = cache is not None or (use_cache if use_cache is not None else getattr(self.config, "use_cache", True))
            built = self.create(
                config=self.config,
                inputs_embeds=embeds if embeds is not None else torch.empty(batch, q_len, 0, dtype=dtype, device=device),
                attention_mask=mask,
                position_ids=None if caches or mask is not None else self._mask_positions(args, kwargs),
                **{self.create_cache: cache},
            )
            mask = built if isinstance(built, torch.Tensor) else None
        return self._replace(args, kwargs, _fold(mask, bias, q_pos, k_pos, True, dtype), mapping)

    def _mask_positions(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The positions the language model hands its mask builder, which reads them for
        packed sequences when there is neither a cache nor a 2-D mask: 1-D rotary
        positions as they are; multimodal rotary positions only through a text row the
        caller prepended (4 rows: Qwen2/2.5/3-VL, GLM-4V). What such a text model does with
        2-D positions differs by family (Qwen3-VL reads them, Qwen2-VL does not), so that
        one case is refused rather than guessed."""
        positions = self._arg(args, kwargs, "position_ids")
        if positions is None or (positions.dim() == 2 and not self.multimodal_rope):
            return positions
        if positions.dim() == 3 and positions.shape[0] == 4:
            return positions[0]
        if positions.dim() == 2:
            raise ValueError(
                f"attention bias: a {self.model_type} language model called with 2-D position_ids, no cache and no "
                "attention mask builds its mask from them or not depending on the family; pass an attention_mask "
                "(or use_cache=True), or its 4-row multimodal positions")
        return None

    def _replace(self, args: tuple, kwargs: dict, new_mask: torch.Tensor, mapping: bool = False):
        if mapping:
            new_mask = {"full_attention": new_mask}
        return _with_arg(args, kwargs, "attention_mask", self.index.get("attention_mask"), new_mask)


def _call_arg(args: tuple, kwargs: dict, name: str, index: int | None):
    """A forward argument by keyword, else at its positional ``index``; None when absent."""
    if name in kwargs:
        return kwargs[name]
    if index is not None and index < len(args):
        return args[index]
    return None


def _with_arg(args: tuple, kwargs: dict, name: str, index: int | None, value) -> tuple[tuple, dict]:
    """The call with ``name`` set to ``value`` where it came (positionally or by keyword)."""
    if name in kwargs or index is None or index >= len(args):
        return args, {**kwargs, name: value}
    return (*args[:index], value, *args[index + 1 :]), kwargs


def _fold(mask, bias, q_pos, k_pos, is_causal: bool, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` (None, boolean or additive) plus ``bias`` as one additive float mask."""
    if mask is None and (len(q_pos) == 1 or not is_causal):
        additive = None  # nothing masked: the bias is the whole mask
    else:
        additive = _additive_mask(mask, q_pos, k_pos, is_causal, dtype)
    bias = bias.to(dtype)
    if additive is not None:
        bias = additive + bias
    # a row fully masked (padding) stays finite, as transformers' own masks do
    return bias.clamp(min=torch.finfo(dtype).min)


def _additive_mask(
    mask: torch.Tensor | None, q_pos: torch.Tensor, k_pos: torch.Tensor, is_causal: bool, dtype: torch.dtype
) -> torch.Tensor:
    """The mask the attention would have applied, as an additive float tensor (1|B, 1, Q, K)."""
    minimum = torch.finfo(dtype).min
    if mask is None:
        if is_causal and len(q_pos) > 1:
            allowed = k_pos[None, :] <= q_pos[:, None]
            return torch.where(allowed, 0.0, minimum).to(dtype)[None, None]
        return torch.zeros(1, 1, len(q_pos), len(k_pos), dtype=dtype, device=q_pos.device)
    if mask.dtype == torch.bool:
        return torch.where(mask, 0.0, minimum).to(dtype)
    return mask.to(dtype)
