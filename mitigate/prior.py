"""Prior-token suppression: keep the prompt's and the language model's priors from
overriding the pixels.

Two kinds of prior tokens cause the failures DO-Bench (PriorRobust, A1-A3/B1-B3), MIOH
(LC-S sycophantic pressure, LC-I instructional override) and ReactBench (Counterfactual
Attribute) measure:

* **context mode** -- tokens *in the prompt* that carry a belief or an assertion about the
  image. Their influence is cut by an additive bias on the attention scores to the span's
  key positions in chosen decoder layers (:mod:`hooks.attention`, sdpa and eager alike;
  positions unchanged): ``bias = log(1 - strength)``, so ``strength = 0`` is the
  unmitigated model and ``strength = 1`` removes the span from attention exactly as a 0 in
  the attention mask would. Spans come from :func:`mitigate.spans.find_prior_spans` on the
  decoded prompt, or from the caller. ``compact_positions=True`` (with ``strength = 1``)
  also moves every later token's rotary position back by the span tokens before it, so
  the prompt is read exactly as if the span had been deleted from its text -- masking alone
  leaves a gap in the positions, and on the organism that gap, not the masked belief, is
  what kept DO-Bench's B-series 15 points above level 0 (``docs/results/prior_full.md``).
  1-D and multimodal rotary positions alike (Qwen2/2.5/3-VL shift all three axes). Exact
  while a sliding window (Gemma3's: 1024 tokens, 512 on the 1B model) covers the whole
  prompt; in a longer prompt, a window that holds the masked span reaches that many tokens
  less far back than the deleted prompt's (the window counts cache slots, not positions).
  Hybrid decoders (Qwen3.5: Gated DeltaNet layers between full-attention ones) have no
  attention scores in their linear-attention layers; there the span's input to the token
  mixer is multiplied by ``1 - strength`` at the prefill -- at ``strength = 1`` exactly
  what transformers does to a position the attention mask removes (it zeroes the padding's
  input to those layers), so full suppression still equals removing the span from the
  mask; the scaling in between is our choice, the recurrent analogue of down-weighting a
  key. ``compact_positions`` is refused there: a recurrent layer steps through the zeroed
  positions (its short convolution still mixes their neighbours in), so no position shift
  makes the prompt read as if the span were deleted. The whole prompt must come in one
  forward there (no ``prefill_chunk_size``): the span mask is found on the prompt's tokens.
  Elsewhere a chunked prefill is exact: the spans are found again over the prompt so far
  at every chunk (a chunk boundary inside a belief sentence is an error). New prompt tokens
  after decoding steps (a chat continued over its cache) and a forward that enters below
  the model's own call (``model.model(...)``) are refused: the spans are found in the ids
  that call receives.
  A zeroed position is not a deleted one: the layer's state still decays across it.
* **output mode** -- *output* tokens the language model favours whatever the image shows.
  An image-free contrast branch (the image tokens hidden from attention) gives the
  language prior ``l(y|x)``, and the logits become ``l(y|v,x) - gamma * l(y|x)`` on the
  plausible set ``p(y|v,x) >= beta * max p`` (VCD Eq. 4), as in VDD, M3ID and PAI. Default
  ``gamma = 0.1``: PAI (Liu et al., ECCV 2024) uses ``1.1 * l(y|v,x) - 0.1 * l(y|x)``, which
  has the same argmax and, up to its temperature of 1.1, the same distribution; ``beta =
  0.1`` as in VCD/PAI. On a hybrid decoder (Qwen3.5) the hidden image tokens are zeroed
  inputs to the linear-attention layers (transformers' masking of a 0 in the 2-D mask),
  not removed: each still decays the recurrent state, so over hundreds of image tokens those
  layers keep less of the text before the image than a text-only prompt would, and
  ``l(y|x)`` is further from a text-only model's there than on attention-only families.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from hooks import BiasContext, HookGroup, ModelPoints, add_attention_bias
from hooks.cache import PromptCache, cache_of

from .base import IDENTITY_DIGEST, Mitigation, register
from .checks import real
from .branches import Branch, refuse_guidance, refuse_paged_cache, verifies_drafts
from .spans import Span, decode_with_offsets, find_prior_spans_between, spans_to_mask, user_spans
from .turns import assistant_token_ranges, turn_markers
from .vcd import _check_beta, cut_implausible, refuse_length_penalty

MODES = ("context", "output", "both")
#: Zero-bias columns kept after the prompt's row for generated tokens (grown when exceeded).
GENERATED_ROOM = 256


@register
@dataclass
class PriorSuppression(Mitigation):
    """``PriorSuppression(tokenizer, mode="context", strength=1.0, layers=None, gamma=0.1, beta=0.1)``.

    ``tokenizer`` decodes the prompt to find spans (context mode). ``spans``: None to detect
    them, or per batch row a list of substrings / ``(start, end)`` character offsets.
    Offsets index the decoded prompt (image and special tokens left out), unless
    ``span_texts`` gives per row the string they index -- the text passed to the
    processor, chat template and all -- in which case each offset range is found in the
    decoded prompt as the same text at the same occurrence (``spans.user_spans``).
    ``layers``: decoder layers that get the bias (None = all; a hybrid decoder's
    linear-attention layers among them get the span's input scaled instead).
    """

    tokenizer: Any = field(default=None, repr=False)  # results.json records the config, not the vocabulary
    mode: str = "context"
    strength: float = 1.0
    layers: Sequence[int] | None = None
    gamma: float = 0.1
    beta: float = 0.1
    compact_positions: bool = False  # context mode, strength 1: positions as if the span were deleted
    spans: Sequence[Sequence[str | tuple[int, int]]] | None = None
    # not printed (one text per row), but a run's identity carries their digest
    span_texts: Sequence[str] | None = field(default=None, repr=False, metadata={IDENTITY_DIGEST: True})
    # the chat template the prompts were written with (default: the tokenizer's own): detection
    # leaves the model's own earlier answers (assistant turns) alone (mitigate.turns)
    chat_template: str | None = field(default=None, repr=False, metadata={IDENTITY_DIGEST: True})
    found: list[list[Span]] = field(default_factory=list, init=False, repr=False)
    #: per row of the last prompt: the ``(start, end)`` token index ranges (end exclusive)
    #: the bias suppresses -- what ``found``'s character spans cover in ``input_ids``
    token_spans: list[list[tuple[int, int]]] = field(default_factory=list, init=False, repr=False)

    name = "prior_suppression"
    #: context mode tells the prompt from a decoding step by the cache's per-row length, and
    #: output mode has a contrast branch: neither runs in a paged cache's one packed row
    continuous_batching = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        self.strength = real(self.strength, "strength", "in [0, 1] (0 = off, 1 = full masking)",
                             lambda v: 0.0 <= v <= 1.0)
        self.gamma = real(self.gamma, "gamma", "a finite number >= 0", lambda v: 0.0 <= v < math.inf)
        self.beta = _check_beta(self.beta)
        if not isinstance(self.compact_positions, bool):
            raise ValueError(f"compact_positions must be True or False, got {self.compact_positions!r}")
        if self.compact_positions and (self.mode not in ("context", "both") or self.strength != 1.0):
            raise ValueError("compact_positions: needs context mode at strength 1 (a span still partly attended "
                             f"has no position to close), got mode={self.mode!r}, strength={self.strength!r}")
        if self.compact_positions and self.layers is not None:
            raise ValueError("compact_positions: needs the span masked in every layer (layers=None); in a layer "
                             f"that still sees it the closed-up positions collide with the span's, got layers={self.layers!r}")
        if self.spans is not None:
            _check_spans(self.spans)
        if self.span_texts is not None:
            if self.spans is None:
                raise ValueError("span_texts: given without spans (it is the string the spans' offsets index)")
            if isinstance(self.span_texts, str) or len(self.span_texts) != len(self.spans) \
                    or not all(isinstance(t, str) for t in self.span_texts):
                raise ValueError(f"span_texts: one string per row of spans ({len(self.spans)} rows), "
                                 f"got {self.span_texts!r:.200}")
        if self.mode in ("context", "both") and self.tokenizer is None:
            raise ValueError("tokenizer is needed in context mode (to find the prior spans in the prompt)")

    def conflict(self, other: Mitigation) -> str | None:
        suppressing = self.uses_context and self.strength
        if suppressing and other.name == self.name and other is not self and other.uses_context and other.strength:
            # two biases would add: strength 1 - (1 - s)^2
            return ("prior suppression (context mode) is already attached to this model by another attach(); "
                    "detach it first (two would suppress the spans twice over)")
        # crop-and-verify re-asks its views and localises in batches of its own (other rows, a
        # generic prompt), where spans naming the caller's rows and texts do not apply
        if self.spans is not None and suppressing and other.name == "crop_verify":
            return ("PriorSuppression(spans=...) names rows and texts of the caller's batch, and crop-and-verify "
                    "re-asks its views and localises in batches of its own; use spans=None (the spans are then "
                    "found in each prompt, views included)")
        return None

    @property
    def uses_context(self) -> bool:
        return self.mode in ("context", "both")

    @property
    def uses_output(self) -> bool:
        return self.mode in ("output", "both")

    @property
    def extra_rows(self) -> int:
        """One image-free branch in output mode (cost reports count forward rows per token)."""
        return 1 if self.uses_output else 0

    # -- output mode: an image-free branch -------------------------------------------------
    def branches(self, points: ModelPoints) -> list[Branch]:
        return [Branch("prior:no_image", hide_image=True)] if self.uses_output else []

    def combine(self, logits: torch.Tensor, branch_logits: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.gamma == 0:
            return logits
        refuse_length_penalty()
        (prior,) = branch_logits
        out = logits - self.gamma * prior
        return cut_implausible(out, logits, self.beta)  # finite outside the set: mitigate.vcd's notes

    # -- context mode: attention bias on the spans ---------------------------------------------
    def span_mask(self, points: ModelPoints, input_ids: torch.Tensor) -> torch.Tensor:
        """``(batch, seq)`` mask of the prior-span tokens; records the spans in ``self.found``
        (characters of the decoded prompt) and ``self.token_spans`` (token positions)."""
        tok = self.tokenizer
        skip = {i for i in (points.image_token_id, points.video_token_id) if i is not None}
        skip |= set(getattr(tok, "all_special_ids", []) or [])
        image = points.image_token_mask(input_ids, include_video=True)
        # what those ids read as in the caller's text (span_texts): not counted as occurrences
        to_tokens = getattr(tok, "convert_ids_to_tokens", None)
        hidden = [t for t in to_tokens(sorted(skip)) if isinstance(t, str)] if to_tokens and self.span_texts else []
        rows = input_ids.shape[0]
        if self.spans is not None and (not self.spans or rows % len(self.spans)):
            raise ValueError(f"spans: given for {len(self.spans)} rows, the batch has {rows}")
        # generate() repeats each row for its beams / return sequences (repeat_interleave)
        source_row = None if self.spans is None else [r // (rows // len(self.spans)) for r in range(rows)]
        if source_row is not None:  # ... as exact copies: other prompts are not a row's repeats
            first = {}
            for r, given in enumerate(source_row):
                if not torch.equal(input_ids[r], input_ids[first.setdefault(given, r)]):
                    raise ValueError(f"spans: given for {len(self.spans)} rows, the batch has {rows} rows whose "
                                     f"prompts differ (rows {first[given]} and {r}), not one prompt's beams or "
                                     "returned sequences: give one entry per prompt")
        mask = torch.zeros_like(input_ids, dtype=torch.bool)
        self.found, self.token_spans = [], []
        # a row repeated (beams, return sequences, one prompt asked of a batch) is read once
        seen: dict[tuple, tuple[list[Span], torch.Tensor, list[tuple[int, int]]]] = {}
        for row in range(input_ids.shape[0]):
            ids = input_ids[row].tolist()
            key = (tuple(ids), None if source_row is None else source_row[row])
            if key not in seen:
                text, offsets = decode_with_offsets(tok, ids, skip)
                if source_row is None:
                    # an image ends a sentence: a tokenizer that drops the template's newlines
                    # would otherwise join "user" before the image to the belief after it; so
                    # does a turn's edge, and the model's own earlier answers are not searched
                    cuts = [offsets[i][0] for i in image[row].nonzero().flatten().tolist()]
                    answered = self._assistant_turns(ids, offsets, text)
                    cuts += [c for turn in answered for c in turn]
                    spans = [s for s in find_prior_spans_between(text, cuts)
                             if not any(s.start < end and start < s.end for start, end in answered)]
                else:
                    given = source_row[row]
                    spans = user_spans(text, self.spans[given], None if self.span_texts is None else self.span_texts[given],
                                       hidden=hidden)
                row_mask = spans_to_mask(offsets, spans, input_ids.shape[1])
                if row_mask.any():
                    idx = row_mask.nonzero().flatten()
                    if bool(image[row, int(idx.min()) : int(idx.max()) + 1].any()):
                        raise ValueError(f"spans: a span in row {row} overlaps the image tokens")
                seen[key] = spans, row_mask, _runs(row_mask)
            spans, row_mask, runs = seen[key]
            mask[row] = row_mask
            self.found.append(list(spans))
            self.token_spans.append(list(runs))
        return mask

    def _assistant_turns(self, ids: list[int], offsets: list[tuple[int, int]], text: str) -> list[tuple[int, int]]:
        """The ``(start, end)`` characters in ``text`` of each assistant turn of the prompt
        (:mod:`mitigate.turns`); none without a readable chat template."""
        if "_turn_markers" not in vars(self):  # read once: the template does not change
            self._turn_markers = turn_markers(self.tokenizer, self.chat_template)
        if self._turn_markers is None:
            return []
        return [(min(offsets[j][0] for j in range(begin, end)), max(offsets[j][1] for j in range(begin, end)))
                for begin, end in assistant_token_ranges(ids, offsets, text, self.tokenizer, self._turn_markers)]

    def attach_hooks(self, points: ModelPoints, group: HookGroup) -> None:
        if not self.uses_context or self.strength == 0:
            return
        value = -math.inf if self.strength >= 1.0 else math.log1p(-self.strength)
        state: dict[str, Any] = {}
        prompt_cache = PromptCache()

        def new_prompt(keys: torch.Tensor | None, ids: torch.Tensor | None) -> None:
            """The span mask of the prompt so far; what was built from the last one is dropped."""
            state.clear()
            if keys is not None:
                state["keys"], state["ids"] = keys, ids

        def more_prompt(ids: torch.Tensor, past: int) -> None:
            """Several new tokens over the cache a prompt forward just filled: the next chunk of
            a chunked prefill (``prefill_chunk_size``). The spans are found again over the
            whole prompt so far, so a belief sentence in a later chunk is suppressed as in one
            forward -- exactly, unless a span found now reaches back into tokens an earlier
            chunk already ran without it (the chunk boundary cut its sentence): an error."""
            keys = state["keys"]
            if not state.get("prompt_forward") or past != keys.shape[1]:
                # decoding steps came between: a chat continued over its cache. The spans are
                # the last prompt's; the new turn's beliefs would silently go unsuppressed
                raise ValueError(
                    "prior suppression (context mode): this forward brings new prompt tokens after decoding steps "
                    "(a conversation continued over its cache); its spans were found on the previous prompt, so "
                    "beliefs in the new tokens would not be suppressed: run the whole conversation as one prompt")
            whole = torch.cat([state["ids"], ids.to(state["ids"].device)], dim=1)
            keys_now = self.span_mask(points, whole)
            if not torch.equal(keys_now[:, :past], keys):
                raise ValueError(
                    "prior suppression (context mode): a belief / assertion span ends in this prefill chunk but "
                    "starts in tokens an earlier chunk already ran without it (prefill_chunk_size cut its "
                    f"sentence at token {past}): use a larger prefill_chunk_size, or none")
            new_prompt(keys_now, whole)

        def generated_without_cache(ids: torch.Tensor | None, kwargs: dict) -> bool:
            """Whether this forward is ``generate(use_cache=False)``'s next step: the last
            prompt again, with the tokens generated so far after it, one more than at the last
            forward. Those tokens are never part of a span (as over a cache); finding the spans
            anew in the whole sequence had suppressed a belief the model itself wrote, in
            every step after it."""
            prompt = state.get("ids")
            if kwargs.get("use_cache") is not False or not state.get("without_cache") or ids is None or prompt is None:
                return False
            length = state.get("length", prompt.shape[1])
            return (ids.shape[0] == prompt.shape[0] and ids.shape[1] == length + 1
                    and torch.equal(ids[:, : prompt.shape[1]].to(prompt.device), prompt))

        def capture(module, args, kwargs):
            refuse_guidance("prior suppression (context mode)", "that prompt's spans would replace the generated "
                            "prompt's, so every later decoding step would run unsuppressed")
            ids = kwargs.get("input_ids")
            cache = cache_of(kwargs)
            refuse_paged_cache(cache, "prior suppression (context mode)")
            if cache is None or cache.get_seq_length() == 0:  # a new prompt
                if generated_without_cache(ids, kwargs):  # the same prompt, one more generated token
                    state["length"] = ids.shape[1]
                else:
                    # embeddings alone carry no text to find spans in: nothing to suppress, said
                    if ids is None:
                        warnings.warn("prior suppression (context mode): this prompt came as inputs_embeds, with no "
                                      "token ids to find belief / assertion spans in, so it runs unsuppressed; pass "
                                      "input_ids to suppress its spans", stacklevel=2)
                    new_prompt(None if ids is None else self.span_mask(points, ids), ids)
                    state["without_cache"] = kwargs.get("use_cache") is False
                state["prompt_forward"] = True
                prompt_cache.filled(cache)
            else:  # a decoding step, or more prompt after a cached part (chunked prefill, a continued chat)
                if not prompt_cache.continues(cache):
                    if "keys" in state:
                        raise ValueError(
                            "prior suppression: this forward continues a cache that is not the one the last prompt "
                            "filled (a conversation continued after another call while attached); the spans found "
                            "belong to that call: continue a cache right after the call that made it")
                    # no prompt forward filled it while attached (a prompt cached before attach(), or
                    # under another handle): its spans were never looked for, let alone suppressed
                    raise ValueError(
                        "prior suppression (context mode): this forward continues a cache that no prompt forward "
                        "filled while it was attached (a prompt cached before attach(), or by another handle), so "
                        "the prompt's spans were neither found nor suppressed: attach before the prompt runs, or "
                        "run the whole prompt in generate()")
                prompt = "keys" in state and ids is not None and ids.shape[1] > 1 and not verifies_drafts(kwargs)
                if prompt:
                    more_prompt(ids, int(cache.get_seq_length()))
                state["prompt_forward"] = prompt
            state["announced"] = True  # the decoder's check: this forward's spans were looked for

        def announced(module, args, kwargs):
            """The language model runs inside a forward whose token ids :func:`capture` read:
            one that enters below it (``model.model(...)``, ``model.forward(...)``, the decoder
            itself) would get the last prompt's spans applied to other tokens."""
            if not state.pop("announced", False):
                raise ValueError(
                    "prior suppression (context mode) finds the spans in the token ids the model's own call "
                    "receives, and this forward reached the language model without it (model.model(...), "
                    "model.forward(...) or the decoder called directly): call model(...) or model.generate()")

        def forward_done(module, args, kwargs, output):
            state.pop("announced", None)  # also after a forward that stopped before its decoder

        def remember_cache(module, args, kwargs, output):
            """The cache the model made itself at a prompt forward: a manual loop continues it."""
            if state.get("prompt_forward"):
                prompt_cache.made(output)

        def row_keys(rows: int, device: torch.device) -> torch.Tensor:
            """``(rows, prompt_len)``: the span mask of every row a forward runs, on ``device``."""
            keys = state["keys"]
            # contrast branches append their rows in blocks after the original rows (beams
            # are expanded by generate() before the first forward, so spans are per beam)
            if rows % keys.shape[0]:
                raise RuntimeError(f"prior spans were found for {keys.shape[0]} rows, the model ran {rows}")
            # keys live with the input ids, the scores with a layer: on a model split over
            # devices (device_map="auto") they differ
            return keys.repeat(rows // keys.shape[0], 1).to(device)

        def row_bias(rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
            """``(rows, 1, 1, prompt_len)``: ``value`` on the span keys, built once per prompt."""
            memo = (rows, dtype, device)
            if state.get("row_key") != memo:
                # room for generated tokens (never in a span), so a decoding step only slices
                hit = torch.nn.functional.pad(row_keys(rows, device), (0, GENERATED_ROOM))
                zero = torch.zeros(hit.shape, dtype=dtype, device=device)
                state["row_key"], state["row"] = memo, zero.masked_fill(hit, value)[:, None, None, :]
            return state["row"]

        def span_keys() -> torch.Tensor | None:
            """This prompt's span mask, or None when it has no span (no prompt seen yet)."""
            keys = state.get("keys")
            if keys is None:
                return None
            if "any" not in state:  # once per prompt: bool() syncs with the device
                state["any"] = bool(keys.any())
            return keys if state["any"] else None

        def bias(ctx: BiasContext) -> torch.Tensor | None:
            if span_keys() is None:
                return None
            row = row_bias(ctx.batch_size, ctx.dtype, ctx.device)
            start, count = ctx.key_offset, len(ctx.key_positions)  # a contiguous range
            if start + count > row.shape[-1]:  # past the room: generated tokens are never in a span
                row = torch.nn.functional.pad(row, (0, start + count - row.shape[-1] + GENERATED_ROOM))
                state["row"] = row
            return row[..., start : start + count].expand(-1, -1, len(ctx.query_positions), -1)

        def span_counts(rows: int, device: torch.device, length: int) -> torch.Tensor:
            """``(rows, >= length)``: span tokens at or before each position, built once per
            prompt; generated tokens (past the prompt) count all of the prompt's spans."""
            memo = (rows, device)
            if state.get("count_key") != memo or state["counts"].shape[1] < length:
                counts = row_keys(rows, device).long().cumsum(-1)
                room = max(length, counts.shape[1]) + GENERATED_ROOM - counts.shape[1]
                state["count_key"], state["counts"] = memo, torch.cat([counts, counts[:, -1:].expand(-1, room)], 1)
            return state["counts"]

        def compact(module, args, kwargs):
            """The decoder's positions minus the span tokens before each one (a decoding
            step: minus all of the prompt's), as if the spans were deleted from the text."""
            keys = span_keys()
            if keys is None:
                return None
            lead = kwargs.get("inputs_embeds")
            lead = kwargs.get("input_ids") if lead is None else lead
            if lead is None:
                raise ValueError("compact_positions: the decoder call has neither inputs_embeds nor input_ids")
            rows, length = lead.shape[0], lead.shape[1]
            cache = cache_of(kwargs)
            past = 0 if cache is None else int(cache.get_seq_length())
            positions = kwargs.get("position_ids")
            if positions is None:  # what the decoder itself would use (M-RoPE decoders expand it to 3 axes)
                positions = torch.arange(past, past + length, device=lead.device)[None]
            if positions.dim() not in (2, 3):
                raise ValueError(f"compact_positions: position_ids of shape {tuple(positions.shape)} are neither "
                                 "(batch, length) nor (components, batch, length)")
            before = span_counts(rows, positions.device, past + length)
            # Multimodal rotary positions (Qwen2/2.5/3-VL: (3, batch, length), or 4 rows with
            # a leading text-only row for mask building) shift every row by the same count: an
            # image after the span starts at the text position before it on each axis, so
            # the deleted prompt's image moves by the same count on t, h and w alike.
            shift = before[:, past : past + length]
            kwargs = {**kwargs, "position_ids": positions - (shift if positions.dim() == 2 else shift[None])}
            if kwargs.get("attention_mask") is None and cache is None:
                # with no mask and no cache, transformers reads non-consecutive position_ids
                # as packed sequences and would cut attention at the span; an all-ones mask
                # is what the decoder assumes anyway
                kwargs["attention_mask"] = torch.ones(rows, past + length, dtype=torch.long, device=lead.device)
            return args, kwargs

        def linear_keep(rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            """``(rows, prompt_len, 1)``: ``1 - strength`` on the span, 1 elsewhere, built once per prompt."""
            memo = (rows, dtype, device)
            if state.get("keep_key") != memo:
                state["keep_key"] = memo
                state["keep"] = (1.0 - self.strength * row_keys(rows, device).to(dtype))[..., None]
            return state["keep"]

        def scale_linear(module, args, kwargs):
            """A hybrid decoder's linear-attention layer at the prefill: the span's input
            times ``1 - strength`` (decoding steps carry no span)."""
            keys = span_keys()
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if keys is None or hidden is None or hidden.shape[1] == 1:
                return None
            # the prompt's positions, and under generate(use_cache=False) the tokens generated after them
            generated = hidden.shape[1] - keys.shape[1]
            if not state.get("prompt_forward") or generated < 0 or (generated and hidden.shape[1] != state.get("length")):
                # the span mask was found on the first forward's tokens; a later multi-token
                # forward (prefill_chunk_size, a chat continued over its cache) is not those tokens
                raise ValueError(f"prior suppression: a linear-attention layer got {hidden.shape[1]} positions that "
                                 f"are not the prompt whose spans were found ({keys.shape[1]} tokens): on a hybrid "
                                 "decoder context mode needs the whole prompt in one forward (no prefill_chunk_size, "
                                 "no continuation of a cached prompt)")
            keep = linear_keep(hidden.shape[0], hidden.dtype, hidden.device)
            if generated:
                keep = torch.nn.functional.pad(keep, (0, 0, 0, generated), value=1.0)
            hidden = hidden * keep
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": hidden}
            return (hidden, *args[1:]), kwargs

        linear = points.linear_attention(self.layers)
        if linear and self.compact_positions:
            raise ValueError(f"compact_positions: {points.model_type} has linear-attention layers "
                             f"{[i for i, _ in linear]}, which step through a masked span's positions; no position "
                             "shift reads the prompt as if it were deleted (use compact_positions=False)")
        group.add_forward_pre_hook(points.model, capture, prepend=True)
        group.add_forward_hook(points.model, remember_cache)
        group.add_forward_hook(points.model, forward_done, always_call=True)
        group.add_forward_pre_hook(points.language_model, announced, prepend=True)
        attention_layers = set(points.attention_layers)
        attention = [i for i in points.layer_indices(self.layers) if i in attention_layers]
        if attention:
            add_attention_bias(group, points, bias, layers=attention, same_for_all_layers=True)
        for _, module in linear:
            group.add_forward_pre_hook(module, scale_linear)
        if self.compact_positions:
            group.add_forward_pre_hook(points.language_model, compact)


__all__ = ["MODES", "PriorSuppression"]


def _check_spans(spans: Any) -> None:
    """``spans`` is one list per row, each of substrings or ``(start, end)`` offsets: a
    flat list of strings (``["I am sure."]``) had been read row by row, character by
    character, and failed with "' ' does not occur in the prompt"."""
    shape = ("spans: one list per row of the batch, each of substrings or (start, end) character offsets, e.g. "
             "spans=[['I am certain there is no dog.']] for one row")
    if isinstance(spans, (str, bytes)) or not isinstance(spans, Sequence) or not spans:
        raise ValueError(f"{shape}; got {spans!r:.200}")
    for row, items in enumerate(spans):
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise ValueError(f"{shape}; row {row} is {items!r:.100}, not a list")
        for item in items:
            offsets = isinstance(item, (tuple, list)) and len(item) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in item)
            if not (isinstance(item, str) or offsets):
                raise ValueError(f"{shape}; row {row} holds {item!r:.100}")


def _runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of True in a 1-D mask (end exclusive)."""
    padded = torch.nn.functional.pad(mask.to(torch.int8), (1, 1))
    edges = (padded[1:] - padded[:-1]).nonzero().flatten().tolist()
    return list(zip(edges[::2], edges[1::2]))
