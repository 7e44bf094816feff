"""Where is the queried object? The model's own attention, normalised as ViCrop does.

ViCrop (Zhang et al., ICLR 2025): the attention from the last prompt token to the image
tokens, at a middle layer, divided elementwise by the same map for a generic prompt (so
regions every prompt attends to cancel out); then the window of a few sizes that holds the
most of that ratio is the object's box.

Only the chosen layers compute attention weights: a pre-forward hook gives those
attention modules an eager copy of their config for the one call (and an additive mask
where sdpa would have relied on ``is_causal`` or a boolean mask), a forward hook takes the weights and puts
the config back. The rest of the model keeps its attention implementation. One forward
per prompt, no generation, no cache.

``queries="question"`` reads the mean attention of the text after the image instead of
the last token's (our extension, not ViCrop's). Models differ in where they look: on the
organism (a 4-layer decoder; 60 held-out scenes; a hit is a window covering half the
object's box) the last token's map hits 15% at layer 0 (a random window of the same size:
10%) and 2-17% at layers 1-3, while the question's mean hits 32% at layer 0 (random: 22%,
its windows are larger): that model matches the image at the object's word, and its last
token reads the word rather than the image. ViCrop's choice is the default.

Image tokens map back to the image through a token grid: a square of ``g x g`` tokens,
after a leading CLS token when there is one (LLaVA with the "full" feature strategy), or
Qwen's ``image_grid_thw`` over the spatial merge. Other layouts (tiles, anyres, pooled
crops) raise a clear error: pass boxes from a detector instead.
"""

from __future__ import annotations

import copy
import math
from typing import Sequence

import torch
from torch import nn

from hooks import HookGroup, ModelPoints, resolve
from hooks.attention import _additive_mask

GENERIC_PROMPT = "describe the image ."  # ViCrop: "Write a general description of the image."


def default_layers(points: ModelPoints) -> list[int]:
    """ViCrop's choice: a middle layer (and its neighbour for small models)."""
    n = points.num_layers
    return sorted({max(0, n // 2 - 1), n // 2})


#: Which prompt positions' attention is read: ViCrop's last token, or the mean over the
#: text after the (last) image -- the question and the generation prompt.
QUERIES = ("last", "question")


def _question_weights(inputs: dict, image: torch.Tensor) -> torch.Tensor:
    """``(batch, seq)`` weights summing to 1 per row over the text after the last image."""
    ids = inputs["input_ids"]
    pos = torch.arange(ids.shape[1], device=ids.device)
    last_image = torch.where(image, pos, torch.full_like(pos, -1)).amax(dim=1, keepdim=True)
    w = (pos[None, :] > last_image).float()
    mask = inputs.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        w = w * mask.to(w.device).float()
    return w / w.sum(dim=1, keepdim=True).clamp(min=1.0)


@torch.no_grad()
def last_token_image_attention(model: nn.Module, inputs: dict, layers: Sequence[int] | None = None,
                               queries: str = "last") -> list[torch.Tensor]:
    """Per batch row, the attention (mean over heads and ``layers``) from the last token
    (``queries="question"``: mean over the text after the image) to each of the row's image
    tokens, in ``input_ids`` order."""
    if queries not in QUERIES:
        raise ValueError(f"queries must be one of {QUERIES}, got {queries!r}")
    points = resolve(model)
    layers = points.layer_indices(layers if layers is not None else default_layers(points))
    image = points.image_token_mask(inputs["input_ids"])
    rows = image.shape[0]  # contrast branches' rows (appended after these) are dropped
    question = _question_weights(inputs, image) if queries == "question" else None
    taken: list[torch.Tensor] = []
    eager_configs: dict[int, object] = {}

    def pre(index: int, module, args, kwargs):
        config = module.config
        eager = eager_configs.setdefault(id(config), copy.copy(config))
        eager._attn_implementation = "eager"
        module._localize_config = config
        module.config = eager
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        # eager attention adds its mask: sdpa's "no mask, is_causal" and its boolean masks
        # (e.g. the one built for contrast-branch rows) must become additive first
        needs = (mask is None and hidden is not None and hidden.shape[1] > 1) or (
            mask is not None and mask.dtype == torch.bool)
        if needs:
            q = torch.arange(hidden.shape[1], device=hidden.device)
            mask = _additive_mask(mask, q, q, bool(getattr(module, "is_causal", True)), hidden.dtype)
            return args, {**kwargs, "attention_mask": mask}
        return None

    def post(index: int, module, args, kwargs, output):
        module.config = module._localize_config
        del module._localize_config
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise RuntimeError(f"layer {index}'s attention returned no weights under eager attention")
        if question is None:
            taken.append(weights[:rows, :, -1, :].float().mean(dim=1))  # (batch, keys)
        else:
            heads = weights[:rows].float().mean(dim=1)  # (batch, queries, keys)
            taken.append(torch.einsum("bq,bqk->bk", question.to(heads.device), heads))

    with HookGroup("localize") as group:
        points.add_hook(group, "attention.input", pre, layers=layers)
        points.add_hook(group, "attention.output", post, layers=layers)
        model(**inputs, use_cache=False)
    # Under an attached contrast mitigation (VCD, prior suppression's output mode) the
    # forward also ran the branches, appended after the original rows: only the originals
    # were kept above.
    attention = torch.stack(taken).mean(0)  # (batch, seq)
    return [attention[row][image[row].to(attention.device)] for row in range(attention.shape[0])]


def token_grid(n_tokens: int, inputs: dict | None = None, row: int = 0, merge: int = 2) -> tuple[int, int, int]:
    """``(skip, rows, cols)``: leading tokens to drop and the grid of the rest."""
    grid = None if inputs is None else inputs.get("image_grid_thw")
    if grid is not None:  # Qwen: (t, h, w) patches per image; t = 1 for images
        _, h, w = (int(v) for v in grid[row])
        return 0, h // merge, w // merge
    for skip in (0, 1):
        side = math.isqrt(n_tokens - skip)
        if side * side == n_tokens - skip and side > 0:
            return skip, side, side
    raise ValueError(
        f"cannot map {n_tokens} image tokens to a grid (not a square, nor a square after a CLS token); "
        "for tiled / anyres models pass boxes from a detector (CropVerify(localizer=...))"
    )


def best_window(heat: torch.Tensor, width: int, height: int, sizes: Sequence[float] = (0.25, 0.4, 0.6)) -> tuple:
    """The square window (side = each fraction of the short side) holding the largest mean
    of ``heat`` (a grid upsampled to the image), as ``(x0, y0, x1, y1)`` in pixels."""
    up = torch.nn.functional.interpolate(heat[None, None].float(), size=(height, width), mode="nearest")[0, 0]
    integral = torch.nn.functional.pad(up.cumsum(0).cumsum(1), (1, 0, 1, 0))
    best, box = -math.inf, (0.0, 0.0, float(width), float(height))
    for frac in sizes:
        side = max(1, int(round(frac * min(width, height))))
        stride = max(1, side // 4)
        for y in range(0, height - side + 1, stride):
            for x in range(0, width - side + 1, stride):
                total = integral[y + side, x + side] - integral[y, x + side] - integral[y + side, x] + integral[y, x]
                score = float(total) / (side * side) * math.sqrt(frac)  # favour larger windows on ties
                if score > best:
                    best, box = score, (float(x), float(y), float(x + side), float(y + side))
    return box


def vicrop_heat(question_attention: torch.Tensor, generic_attention: torch.Tensor, grid: tuple[int, int, int],
                eps: float = 1e-6) -> torch.Tensor:
    """ViCrop's ratio map on the token grid: attention(question) / attention(generic prompt)."""
    skip, rows, cols = grid
    q = question_attention[skip : skip + rows * cols].reshape(rows, cols)
    g = generic_attention[skip : skip + rows * cols].reshape(rows, cols)
    return q / (g + eps)
