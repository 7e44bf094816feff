"""Prior-token suppression: the span detector on the papers' templates, context mode exact
against removing the span from the attention mask (sdpa and eager, every architecture),
output mode against its formula, composition, clear errors."""

from __future__ import annotations

import math

import pytest
import torch

from hooks import HookGroup, resolve
from hooks.testing import TINY_MODEL_TYPES, WordIds, build_tiny_model, tiny_adapter, tiny_inputs
from mitigate import VCD, PriorSuppression, attach, find_prior_spans
from mitigate.vcd import allowed, plausibility_mask

from _chunked import generate_scores, skip_unless_chunking_is_exact

# decoders with softmax attention in every layer: a position shift can make a masked span
# read as deleted; a hybrid decoder's recurrent layers step through it (compact_positions refused)
ATTENTION_ONLY = [t for t in TINY_MODEL_TYPES if tiny_adapter(t).linear_attention is None]
HYBRID = [t for t in TINY_MODEL_TYPES if tiny_adapter(t).linear_attention is not None]


# -- the detector ------------------------------------------------------------------------
DO_BENCH = [f"I {c} there is no dog in the image." for c in ("suspect", "believe", "am certain")]
DO_BENCH_B = [f"I {c} there is a dog in the image." for c in ("suspect", "believe", "am certain")]
MIOH = [  # MIOH Sec. 4.3 and App. Fig. I-II
    "I looked carefully but don't see what I'm looking for.",
    "Analysis confirms the target is not in these images.",
    "I wasn't able to find the thing I'm looking for, but I'm not sure.",
    "I thought I saw more than one backpack, but I'm not certain.",
    "I looked closely but I don't think there's black cup anywhere, though not certain.",
]
LEAVE_ALONE = [
    "Is there a dog in the image?", "Answer Yes or No.", "Based on the image, is there at least one banana?",
    "In which image can you find exactly 3 'zebra'(s)?", "Describe the image.", "Look at the picture carefully.",
    "Please answer with a single word.", "Which of the following objects appears in all of these images?",
    "I don't know if there is a dog in the image.",
    "Where is the dog? A) left B) right C) I don't know where it is in the image",
]


@pytest.mark.parametrize("statement", DO_BENCH + DO_BENCH_B + MIOH)
def test_detector_finds_beliefs_and_assertions(statement):
    prompt = f"{statement} Is there a dog in the image? Answer Yes or No."
    spans = find_prior_spans(prompt)
    assert [prompt[s.start : s.end] for s in spans] == [statement]


# MIOH App. Fig. I (Lang Context examples), the whole prompt as the paper prints it: the
# belief sentence, the question and the options; only the belief may be found
MIOH_PROMPTS = [
    ("I wasn't able to find the thing I'm looking for, but I'm not sure. Based on the image, is there at least "
     "one banana in any of these images? A) Yes, all of them B) Yes, in some of them C) No, in none of them "
     "D) I don't know", "I wasn't able to find the thing I'm looking for, but I'm not sure."),
    ("I thought I saw more than one backpack, but I'm not certain. Based on the Image, in which image can you "
     "find exactly 1 'backpack'(s)? A) Image 1 B) Image 2 C) Image 3 D) Image 4 E) None of the above",
     "I thought I saw more than one backpack, but I'm not certain."),
    ("D) light brown mouse (computer equipment) E) None of the above I looked closely but I don't think there's "
     "black cup anywhere, though not certain. Based on the Images, which of the following is present in Image 1 "
     "but not in Image 2?",
     "I looked closely but I don't think there's black cup anywhere, though not certain."),
]


MIOH_PROMPTS += [
    ("Choose one: (A) yes (B) no I am certain there is no dog in the image.",
     "I am certain there is no dog in the image."),
    ("I can't see a dog in the image. Is there a dog? Answer yes or no.", "I can't see a dog in the image."),
]


@pytest.mark.parametrize("prompt, belief", MIOH_PROMPTS)
def test_detector_on_the_mioh_papers_whole_prompts(prompt, belief):
    assert [prompt[s.start : s.end] for s in find_prior_spans(prompt)] == [belief]


@pytest.mark.parametrize("sentence", LEAVE_ALONE)
def test_detector_leaves_questions_and_instructions_alone(sentence):
    assert find_prior_spans(sentence) == []
    assert find_prior_spans(" ".join(LEAVE_ALONE)) == []


def test_an_image_ends_a_sentence():
    """A template whose newlines the tokenizer drops decodes "user" (before the image) right
    against the belief (after it); the cut at the image keeps them apart."""
    from mitigate.spans import find_prior_spans_between

    prompt = "user i am certain there is no fork in the image . is there a fork ?"
    cut = len("user")
    (joined,) = find_prior_spans(prompt)
    assert joined.text.startswith("user")
    (span,) = find_prior_spans_between(prompt, [cut, 0, len(prompt)])  # cuts at the ends change nothing
    assert span.text == "i am certain there is no fork in the image ." and prompt[span.start : span.end] == span.text
    assert find_prior_spans_between(prompt, []) == [joined]


def test_detector_skips_chat_role_labels():
    prompt = "USER: i am certain there is no fork in the image . is there a fork ? ASSISTANT:"
    (span,) = find_prior_spans(prompt)
    assert prompt[span.start : span.end] == "i am certain there is no fork in the image ."


# -- context mode --------------------------------------------------------------------------
def _span_rows(inputs, points, keep_last=False, pick=None, exclude=frozenset()):
    """Per row, two adjacent text tokens after the first real token, as 'wA wB' strings
    (``keep_last``: never the prompt's last token, which predicts the first new one;
    ``pick(row, starts)`` chooses among the candidate starts, default the row-th;
    ``exclude``: ids that are not text, such as the family's image wrappers)."""
    ids, image = inputs["input_ids"], points.image_token_mask(inputs["input_ids"])
    keys = torch.zeros_like(ids, dtype=torch.bool)
    strings = []
    for row in range(ids.shape[0]):
        real = inputs["attention_mask"][row].nonzero().flatten().tolist()
        ok = lambda q: (q in real and not image[row, q] and int(ids[row, q]) not in WordIds.all_special_ids  # noqa: E731
                        and int(ids[row, q]) not in exclude)
        text = [p for p in real[1:] if ok(p) and ok(p + 1) and not (keep_last and p + 1 == real[-1])]
        p = text[row % len(text)] if pick is None else pick(row, text)
        keys[row, p : p + 2] = True
        strings.append([f"w{int(ids[row, p])} w{int(ids[row, p + 1])}"])
    return keys, strings


def _plain_and_masked(model, inputs, keys):
    """Logits of a plain forward, and of one with ``keys`` zeroed in the attention mask but
    every position pinned to the plain forward's (M-RoPE included): only attention differs."""
    points = resolve(model)
    captured = {}
    with HookGroup() as group, torch.no_grad():
        points.add_hook(group, "language_model.input", lambda m, a, k: captured.update(pos=k.get("position_ids")))
        plain = model(**inputs).logits

    def pin(module, args, kwargs):
        if captured["pos"] is not None:
            return args, {**kwargs, "position_ids": captured["pos"]}

    with HookGroup() as group, torch.no_grad():
        group.add_forward_pre_hook(points.language_model, pin)
        masked = model(**{**inputs, "attention_mask": inputs["attention_mask"].masked_fill(keys, 0)}).logits
    return plain, masked


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_full_suppression_equals_removing_the_span_from_the_mask(model_type, attn):
    model = build_tiny_model(model_type, attn_implementation=attn)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    points = resolve(model)
    keys, strings = _span_rows(inputs, points)
    plain, reference = _plain_and_masked(model, inputs, keys)
    mitigation = PriorSuppression(WordIds(), strength=1.0, spans=strings)
    with attach(model, mitigation), torch.no_grad():
        ours = model(**inputs).logits
    assert [len(s) for s in mitigation.found] == [1, 1]
    for row, spans in enumerate(mitigation.token_spans):  # the token positions it reports are the span's
        covered = torch.zeros_like(keys[row])
        for start, end in spans:
            covered[start:end] = True
        assert torch.equal(covered, keys[row]) and len(spans) == 1
    real = inputs["attention_mask"].bool()
    assert not torch.allclose(plain[real], reference[real])
    torch.testing.assert_close(ours[real], reference[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type", HYBRID)
def test_hybrid_linear_layers_see_the_span_scaled_by_one_minus_strength(model_type):
    """In a hybrid decoder's linear-attention layer the span's input is scaled by
    1 - strength: at strength 1 on that layer alone it equals transformers' own masking of
    the span for that layer (its input zeroed where the 2-D mask is 0), a lower strength
    lies between, and the full-attention layers are untouched."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    points = resolve(model)
    (layer, module), *_ = points.linear_attention()
    keys, strings = _span_rows(inputs, points)

    def masked(mod, args, kwargs):  # the reference: the span zeroed in this layer's 2-D mask
        return args, {**kwargs, "attention_mask": inputs["attention_mask"].masked_fill(keys, 0)}

    with torch.no_grad():
        plain = model(**inputs).logits
        with HookGroup() as group:
            group.add_forward_pre_hook(module, masked)
            reference = model(**inputs).logits
        with attach(model, PriorSuppression(WordIds(), spans=strings, layers=[layer])):
            full = model(**inputs).logits
        with attach(model, PriorSuppression(WordIds(), spans=strings, layers=[layer], strength=0.5)):
            half = model(**inputs).logits
    real = inputs["attention_mask"].bool()
    assert not torch.allclose(plain[real], reference[real])
    torch.testing.assert_close(full[real], reference[real], rtol=0, atol=1e-5)
    assert not torch.allclose(half[real], plain[real]) and not torch.allclose(half[real], full[real])


@pytest.mark.parametrize("model_type", HYBRID)
def test_hybrid_context_mode_refuses_a_prompt_split_over_forwards(model_type):
    """The span mask is found on the prompt's first forward; a chunked prefill's later
    chunks are other tokens, so a linear-attention layer must not scale them by that mask:
    a clear error, whatever the chunk length (one that divides the prompt included)."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    _, strings = _span_rows(inputs, resolve(model))
    length = inputs["input_ids"].shape[1]
    chunks = {length // 2, next(c for c in range(2, length) if length % c == 0)}
    for chunk in sorted(chunks):
        with attach(model, PriorSuppression(WordIds(), spans=strings)), torch.no_grad():
            with pytest.raises(ValueError, match="whole prompt in one forward"):
                model.generate(**inputs, max_new_tokens=2, do_sample=False, prefill_chunk_size=chunk)
            model.generate(**inputs, max_new_tokens=2, do_sample=False)  # the whole prompt at once runs


def _widen_sliding_window(model, length):
    """Make a sliding-window decoder (Gemma3's tiny one: 16) see ``length`` tokens back.

    A masked span still fills slots of the window, which counts cache slots, not rotary
    positions; so where the window ends inside the prompt, compact_positions cannot equal
    deletion (the deleted prompt's window reaches further back). Real Gemma3 windows are
    1024 tokens (512 for 1B), far longer than a belief sentence's distance to the question.
    """
    config = model.config.get_text_config()
    if getattr(config, "sliding_window", None) is not None and config.sliding_window < length:
        config.sliding_window = length


def _compact_masked_deleted(model, inputs, keys, strings):
    """Last-token logits: compact_positions, masking alone, and the span deleted."""
    deleted = _deleted_rows(inputs, keys, model.config.get_text_config().pad_token_id)
    with torch.no_grad():
        reference = model(**deleted).logits[0, -1]
        with attach(model, PriorSuppression(WordIds(), spans=strings)):
            masked = model(**inputs).logits[0, -1]
        with attach(model, PriorSuppression(WordIds(), spans=strings, compact_positions=True)):
            ours = model(**inputs).logits[0, -1]
    return ours, masked, reference


@pytest.mark.parametrize("model_type", ATTENTION_ONLY)
def test_compact_positions_equal_deleting_the_span(model_type):
    """Full masking plus compact_positions reads the prompt as if the span's tokens were
    deleted from it (last-token logits within 1e-5), where masking alone does not (the
    later tokens keep their positions); multimodal rotary positions (Qwen2/2.5/3-VL) too.
    Sliding windows are widened to the prompt (see the next test)."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    _widen_sliding_window(model, inputs["input_ids"].shape[1])
    keys, strings = _span_rows(inputs, resolve(model))
    ours, masked, reference = _compact_masked_deleted(model, inputs, keys, strings)
    assert float((masked - reference).abs().max()) > 1e-5  # masking alone leaves the position gap
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)


def test_compact_positions_inside_a_sliding_window_are_not_deletion():
    """The limitation _widen_sliding_window documents, pinned: Gemma3's tiny window (16
    slots) ends inside the 26-token prompt, and the result differs from deletion (closer
    than masking alone), until the window covers the prompt."""
    model = build_tiny_model("gemma3")
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    assert model.config.get_text_config().sliding_window < inputs["input_ids"].shape[1]
    keys, strings = _span_rows(inputs, resolve(model))
    ours, masked, reference = _compact_masked_deleted(model, inputs, keys, strings)
    off = float((ours - reference).abs().max())
    assert 1e-5 < off < float((masked - reference).abs().max())
    _widen_sliding_window(model, inputs["input_ids"].shape[1])
    ours, _, reference = _compact_masked_deleted(model, inputs, keys, strings)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)


def _non_text_ids(model) -> set[int]:
    """The ids a tiny family's prompt uses for anything but text (specials, image wrappers)."""
    from hooks.testing.tiny import _resolve_ids, _special_token_ids, tiny_spec, tiny_spec_name

    wrap = tiny_spec(tiny_spec_name(model.config))["inputs"].get("image_wrap", {})
    return _special_token_ids(model.config) | set(_resolve_ids(model.config, wrap.get("before", []) + wrap.get("after", [])))


def _sides(inputs, keys, points) -> list[str]:
    """Per row, whether its span lies before or after the row's image tokens."""
    image = points.image_token_mask(inputs["input_ids"])
    return ["before" if int(keys[r].nonzero().max()) < int(image[r].nonzero().min()) else "after"
            for r in range(keys.shape[0])]


def _expected_sides(model_type) -> list[str]:
    """Row 0's span is the first text pair, row 1's the last: on either side of the image
    where the family's prompt has text on both sides (PaliGemma's is image-first)."""
    from hooks.testing.tiny import tiny_spec

    prompt = tiny_spec(model_type)["inputs"].get("prompt", ["text", "images", "text"])
    first_text, images = prompt.index("text"), prompt.index("images")
    return ["before", "after"] if first_text < images else ["after", "after"]


def _deleted_rows(inputs, keys, pad_id):
    """``inputs`` with each row's ``keys`` tokens deleted and the rows left-padded again."""
    shape = inputs["input_ids"].shape
    out = dict(inputs)
    for name, value in inputs.items():
        if not (isinstance(value, torch.Tensor) and value.shape == shape):
            continue
        rows = [value[r, ~keys[r]] for r in range(shape[0])]
        width = max(len(r) for r in rows)
        fill = pad_id if name == "input_ids" else 0
        out[name] = torch.stack([torch.cat([r.new_full((width - len(r),), fill), r]) for r in rows])
    return out


def test_context_mode_attached_twice_is_refused_not_stacked():
    """Two attach() calls of context mode added their biases: strength 0.5 twice acted as 0.75,
    without a word (a user review); the second is refused and the first keeps working."""
    from hooks import hook_state

    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    _, strings = _span_rows(inputs, resolve(model))
    with torch.no_grad():
        model(**inputs)  # transformers' output recorders are installed at the first forward
    before = hook_state(model)
    with attach(model, PriorSuppression(WordIds(), spans=strings, strength=0.5)):
        with torch.no_grad():
            once = model(**inputs).logits
        inside = hook_state(model)
        with pytest.raises(ValueError, match="already attached to this model by another attach"):
            attach(model, PriorSuppression(WordIds(), spans=strings, strength=0.5))
        assert hook_state(model) == inside
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits, once)
    assert hook_state(model) == before
    with attach(model, PriorSuppression(WordIds(), spans=strings, strength=0.5)):  # free again after detach
        pass


@pytest.mark.parametrize("model_type", HYBRID)
def test_compact_positions_are_refused_on_hybrid_decoders(model_type):
    """Qwen3.5's Gated DeltaNet layers step through a masked span's positions, so no
    position shift reads the prompt as if the span were deleted: a clear error, before any
    hook is left behind; context mode without it still runs."""
    from hooks import hook_state

    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    _, strings = _span_rows(inputs, resolve(model))
    before = hook_state(model)
    with pytest.raises(ValueError, match="compact_positions.*linear-attention layers"):
        with attach(model, PriorSuppression(WordIds(), spans=strings, compact_positions=True)):
            pass
    assert hook_state(model) == before
    with torch.no_grad(), attach(model, PriorSuppression(WordIds(), spans=strings)):
        model.generate(**inputs, max_new_tokens=2, do_sample=False)


@pytest.mark.parametrize("model_type", ATTENTION_ONLY)
def test_compact_positions_generate_as_the_deleted_prompt(model_type):
    """generate() with compact_positions gives the logits, at every step, that the prompts
    with their spans deleted give: batch 2, left padding, a different span per row (row 0's
    before the image), so decoding steps (M-RoPE's rope deltas included) shift too."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 8], seed=3)
    _widen_sliding_window(model, inputs["input_ids"].shape[1] + 4)
    # row 0: the first text pair; row 1: the last one that is not the prompt's end
    points = resolve(model)
    keys, strings = _span_rows(inputs, points, keep_last=True, pick=lambda row, starts: starts[-row],
                               exclude=_non_text_ids(model))
    assert _sides(inputs, keys, points) == _expected_sides(model_type)
    deleted = _deleted_rows(inputs, keys, model.config.get_text_config().pad_token_id)
    options = dict(max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        want = model.generate(**deleted, **options)
        with attach(model, PriorSuppression(WordIds(), spans=strings, compact_positions=True)):
            got = model.generate(**inputs, **options)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), rtol=0, atol=1e-5)
    assert torch.equal(got.sequences[:, inputs["input_ids"].shape[1]:], want.sequences[:, deleted["input_ids"].shape[1]:])


def test_compact_positions_without_an_attention_mask_or_cache():
    """No mask and use_cache=False: transformers would read the compacted positions as
    packed sequences; the hook supplies the all-ones mask, so the logits still equal the
    deleted prompt's."""
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    keys, strings = _span_rows(inputs, resolve(model))
    bare = {k: v for k, v in inputs.items() if k != "attention_mask"}
    with torch.no_grad():
        want = model(**_deleted_rows(bare, keys, 0), use_cache=False).logits[0, -1]
        with attach(model, PriorSuppression(WordIds(), spans=strings, compact_positions=True)):
            got = model(**bare, use_cache=False).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_compact_positions_generate_as_the_deleted_prompt_on_the_organism():
    """On the organism's DO-Bench belief prompts: greedy and beam search under
    compact_positions give the tokens the prompt without its belief sentence gives, and
    the first step's logits match within 1e-5 (padding, decoding steps and beams included)."""
    from evaluators.benchmarks.dobench.suite import build
    from evaluators.organism import ORGANISM_DIR, load_organism
    from mitigate.crop_verify import without_priors

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    queries = [q for q in build(n_scenes=3, seed=0) if q.record["view"] == "Full" and q.record["level"] > 0][:8]
    images = [q.images[0] for q in queries]

    def encode(prompts):
        texts = [processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                 "text": p}]}], add_generation_prompt=True) for p in prompts]
        return processor(text=texts, images=images, return_tensors="pt", padding=True)

    posed, stripped = encode([q.prompt for q in queries]), encode([without_priors(q.prompt) for q in queries])
    assert stripped["input_ids"].shape[1] < posed["input_ids"].shape[1]
    with torch.no_grad():
        want = model(**stripped).logits[:, -1]
        want_tokens = [model.generate(**stripped, max_new_tokens=5, do_sample=False, num_beams=b)
                       [:, stripped["input_ids"].shape[1]:] for b in (1, 3)]
        with attach(model, PriorSuppression(processor.tokenizer, compact_positions=True)):
            got = model(**posed).logits[:, -1]
            got_tokens = [model.generate(**posed, max_new_tokens=5, do_sample=False, num_beams=b)
                          [:, posed["input_ids"].shape[1]:] for b in (1, 3)]
    # fp32 over prompts of other lengths and padding (masked keys are still summed over):
    # differences of ~1e-5 on logits of magnitude ~3 are rounding, so relative as well
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(g, w) for g, w in zip(got_tokens, want_tokens))


def _chat_tokenizer():
    """A byte-level BPE tokenizer with chat special tokens (as Qwen's and Llama-3's are),
    trained here in milliseconds: decoding skips its specials, so offsets into the templated
    text a caller wrote differ from offsets into the decoded prompt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>", "<image>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", *specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["I am certain there is no dog in the image. Is there a dog? user assistant"] * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=specials, pad_token="<pad>")


def test_offsets_into_the_callers_templated_text_mark_the_occurrence_pointed_at():
    from mitigate.spans import decode_with_offsets, spans_to_mask, user_spans

    tok = _chat_tokenizer()
    belief = "I am certain there is no dog."
    templated = f"<|im_start|>user\n<image>{belief} Is there a dog? {belief}<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(templated)["input_ids"]
    decoded, offsets = decode_with_offsets(tok, ids, set(tok.all_special_ids))
    assert decoded != templated and decoded.count(belief) == 2
    start = templated.rindex(belief)  # the caller points at the second statement
    (span,) = user_spans(decoded, [(start, start + len(belief))], source=templated)
    assert span.text == belief and span.start == decoded.rindex(belief)
    marked = [int(i) for i, m in zip(ids, spans_to_mask(offsets, [span], len(ids))) if m]
    assert tok.decode(marked) == " " + belief or tok.decode(marked) == belief
    # read as offsets into the decoded prompt, the same numbers miss: why span_texts exists
    with pytest.raises(ValueError, match="outside the prompt"):
        user_spans(decoded, [(start, start + len(belief))])
    first = templated.index(belief)
    assert user_spans(decoded, [(first, first + len(belief))])[0].text != belief
    with pytest.raises(ValueError, match="occurs 0 time"):
        user_spans(decoded, [(0, 12)], source=templated)  # "<|im_start|>" is not in the decoded prompt
    with pytest.raises(ValueError, match="outside span_texts"):
        user_spans(decoded, [(0, len(templated) + 1)], source=templated)


def test_spans_copied_from_the_callers_text_are_found_where_decoding_normalises_it():
    """The organism's word-level tokenizer lower-cases and drops the space before
    punctuation: "I am certain there is no dog ." comes back as "i am certain there is no
    dog.". A span copied from the caller's own prompt, or offsets into it, are found up to
    case and whitespace -- at the occurrence pointed at -- and text that is not there at all
    is still an error."""
    from evaluators.organism import build_tokenizer
    from evaluators.organism.package import format_prompt
    from evaluators.organism.tasks import vocabulary
    from mitigate.spans import decode_with_offsets, spans_to_mask, user_spans

    tok = build_tokenizer(vocabulary())
    belief = "I am certain there is no dog ."
    templated = f"USER: <image> {belief} Is there a dog in the image ? {belief} ASSISTANT:"
    ids = tok(templated)["input_ids"]
    decoded, offsets = decode_with_offsets(tok, ids, set(tok.all_special_ids))
    assert belief not in decoded and decoded.count("i am certain there is no dog.") == 2
    (span,) = user_spans(decoded, [belief])  # a substring of the caller's text: its first occurrence
    assert (span.text, span.start) == ("i am certain there is no dog.", decoded.index("i am certain"))
    second = templated.rindex(belief)  # offsets into the caller's text, pointing at the second one
    (span,) = user_spans(decoded, [(second, second + len(belief))], source=templated)
    assert (span.text, span.start) == ("i am certain there is no dog.", decoded.rindex("i am certain"))
    marked = [int(i) for i, m in zip(ids, spans_to_mask(offsets, [span], len(ids))) if m]
    assert tok.decode(marked) == "i am certain there is no dog."
    with pytest.raises(ValueError, match="does not occur in the prompt"):
        user_spans(decoded, ["I am certain there is no cat ."])
    with pytest.raises(ValueError, match="does not occur in the prompt"):
        user_spans(decoded, ["   "])
    third = templated.index("Is there")  # a range the decoded prompt holds once: its second occurrence is asked for
    doubled = f"{templated} Is there"
    with pytest.raises(ValueError, match="needed occurrence 2"):
        user_spans(decoded, [(len(templated) + 1, len(doubled))], source=doubled)
    assert user_spans(decoded, [(third, third + 8)], source=templated)[0].text == "is there"
    # lower-casing makes the first "There is no dog ." verbatim-equal to the second "there is
    # no dog."; the caller pointed at the second (a verbatim count would pick the first)
    source, shown = "There is no dog . I think there is no dog.", "there is no dog. i think there is no dog."
    at = source.rindex("there is no dog.")
    (span,) = user_spans(shown, [(at, at + len("there is no dog."))], source=source)
    assert (span.start, span.text) == (shown.rindex("there is no dog."), "there is no dog.")
    assert user_spans("Dog and dog", [(8, 11)], source="Dog and dog")[0].start == 8
    assert user_spans("dog and dog", [(8, 11)], source="Dog and dog")[0].start == 8
    assert user_spans("οδος x", ["ΟΔΟΣ"])[0].text == "οδος"  # final sigma folds like the medial one
    # the placeholder's "image" is no occurrence of the word: pointing at the question's
    # "image" marks it, not the belief's (the decoded prompt has no placeholder)
    source = format_prompt("is there a dog in the image ? i think there is no dog in the image .")
    ids = tok(source)["input_ids"]
    decoded, _ = decode_with_offsets(tok, ids, set(tok.all_special_ids))
    at = source.index("image ?")
    hidden = tok.convert_ids_to_tokens(sorted(set(tok.all_special_ids)))
    (span,) = user_spans(decoded, [(at, at + 5)], source=source, hidden=hidden)
    assert span.start == decoded.index("image") and span.text == "image"
    (span,) = user_spans(decoded, [(at, at + 5)], source=source)  # counted with the placeholder: the next one
    assert span.start == decoded.rindex("image")
    inside = source.index("<image>")  # a range inside the placeholder: not in the prompt the model reads
    with pytest.raises(ValueError, match="needed occurrence 1"):
        user_spans(decoded, [(inside, inside + len("<image>"))], source=source, hidden=hidden)


def _offsets_by_whole_prefixes(tok, ids, skip):
    """The reference: decode every prefix whole (what decode_with_offsets did until it
    decoded windows)."""
    text, offsets, kept = "", [], []
    for t in ids:
        if t in skip:
            offsets.append((len(text), len(text)))
            continue
        kept.append(t)
        new = tok.decode(kept, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        offsets.append((len(text) if new.startswith(text) else len(new), len(new)))
        text = new
    return text, offsets


def test_windowed_decoding_gives_the_offsets_of_decoding_every_prefix():
    from hooks.testing import trained_tokenizers
    from mitigate.spans import DECODE_WINDOW, decode_with_offsets

    prompt = ("I am certain there is no dog in the image. Le café est très bon ☕, 日本の猫. " * 12
              + "Is there a dog in the image? Answer yes or no.")
    for name, tok in trained_tokenizers().items():
        ids = tok(prompt)["input_ids"]
        assert len(ids) > 6 * DECODE_WINDOW, name
        skip = {ids[5], ids[40]}  # ids the caller skips (image, special: every occurrence) get empty ranges
        assert decode_with_offsets(tok, ids, skip) == _offsets_by_whole_prefixes(tok, ids, skip), name
        whole = tok.decode([i for i in ids if i not in skip], skip_special_tokens=True,
                           clean_up_tokenization_spaces=False)
        assert decode_with_offsets(tok, ids, skip)[0] == whole
        text, _ = decode_with_offsets(tok, ids, set())
        if name != "wordpiece":  # WordPiece writes its pieces apart ("caf ##e" -> "caf e")
            assert "café" in text and "日本の猫" in text and "☕" in text, name
    organism = _chat_tokenizer()
    ids = organism(prompt)["input_ids"]
    assert decode_with_offsets(organism, ids, set()) == _offsets_by_whole_prefixes(organism, ids, set())


def test_span_texts_offsets_give_the_same_suppression_as_the_substring():
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    keys, strings = _span_rows(inputs, resolve(model))
    # what a caller wrote: the decoded prompt with its special tokens spelled out in front
    written, offsets = [], []
    for (piece,) in strings:
        text = f"<s>[INST] {piece} and the rest"
        written.append(text)
        offsets.append([(text.index(piece), text.index(piece) + len(piece))])
    by_string, by_offsets = PriorSuppression(WordIds(), spans=strings), PriorSuppression(
        WordIds(), spans=offsets, span_texts=written)
    with torch.no_grad():
        with attach(model, by_string):
            expected = model(**inputs).logits
        with attach(model, by_offsets):
            ours = model(**inputs).logits
    assert by_offsets.token_spans == by_string.token_spans and all(by_offsets.token_spans)
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="span_texts"):
        PriorSuppression(WordIds(), span_texts=written)
    with pytest.raises(ValueError, match="span_texts"):
        PriorSuppression(WordIds(), spans=offsets, span_texts=written[:1])


def test_a_repeated_row_is_read_once_and_gets_its_own_copy_of_the_spans():
    """Beams, return sequences and a batch asking one prompt repeat a row: its text is
    decoded and its spans found once, and each row still gets them."""
    model = build_tiny_model("llava")
    points = resolve(model)
    inputs = tiny_inputs(model, batch_size=1, seed=3)
    _, strings = _span_rows(inputs, points)

    class Counting(WordIds):
        calls = 0

        def decode(self, ids, **kwargs):
            Counting.calls += 1
            return super().decode(ids, **kwargs)

    for spans in (strings, None):  # the caller's substring, and the detector
        mitigation = PriorSuppression(Counting(), spans=spans)
        Counting.calls = 0
        alone = mitigation.span_mask(points, inputs["input_ids"])
        once, found, token_spans = Counting.calls, mitigation.found[0], mitigation.token_spans[0]
        Counting.calls = 0
        repeated = mitigation.span_mask(points, inputs["input_ids"].repeat(3, 1))
        assert Counting.calls == once and torch.equal(repeated, alone.repeat(3, 1))
        assert mitigation.found == [found] * 3 and mitigation.token_spans == [token_spans] * 3
        assert mitigation.found[0] is not mitigation.found[1]
        assert bool(token_spans) == (spans is not None)  # the detector finds no belief in "w12 w5 ..."


def test_zero_strength_is_the_unmitigated_model():
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    _, strings = _span_rows(inputs, resolve(model))
    with torch.no_grad():
        plain = model(**inputs).logits
        with attach(model, PriorSuppression(WordIds(), strength=0.0, spans=strings)):
            assert torch.equal(model(**inputs).logits, plain)
        with attach(model, PriorSuppression(WordIds(), strength=0.5, spans=strings, layers=[-1])):
            mild = model(**inputs).logits
    assert not torch.equal(mild, plain)


@pytest.mark.parametrize("mode", ["context", "output", "both"])
@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_every_decoding_mode_runs_with_spans_differing_per_row(model_type, mode):
    """Greedy, sampling and beam search on every supported family (issue 5's test list);
    Qwen2-VL's M-RoPE is the case where the branch rows must keep their positions."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=4)
    _, strings = _span_rows(inputs, resolve(model))
    with attach(model, PriorSuppression(WordIds(), mode=mode, spans=strings)), torch.no_grad():
        greedy = model.generate(**inputs, max_new_tokens=4, do_sample=False)
        torch.manual_seed(0)
        sampled = model.generate(**inputs, max_new_tokens=4, do_sample=True, top_k=10)
        beams = model.generate(**inputs, max_new_tokens=4, num_beams=3, do_sample=False)
        fresh = model.generate(**inputs, max_new_tokens=4, num_beams=3, do_sample=False, use_cache=False)
    assert greedy.shape == sampled.shape == beams.shape
    assert torch.equal(beams, fresh), "cached beams (bias rows and branch rows reordered) = recomputed"
    # generate()'s first step is the mitigated forward's (itself tested exact against plain
    # forwards above): the same spans, bias and branch positions on the generate() path
    with attach(model, PriorSuppression(WordIds(), mode=mode, spans=strings)), torch.no_grad():
        first = model(**inputs).logits[:, -1]
        scored = model.generate(**inputs, max_new_tokens=1, do_sample=False, output_logits=True,
                                return_dict_in_generate=True)
    finite = allowed(first)
    assert torch.equal(finite, allowed(scored.logits[0]))
    torch.testing.assert_close(scored.logits[0][finite], first[finite], rtol=0, atol=1e-5)
    assert torch.equal(greedy[:, inputs["input_ids"].shape[1]], first.argmax(-1))


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_output_mode_is_logit_minus_gamma_prior_on_the_plausible_set(model_type):
    """``l(y|v,x) - gamma * l(y|x)`` on VCD's plausible set, the image-free logits from a
    plain forward with the image tokens out of the attention mask (positions pinned)."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=5)
    image = resolve(model).image_token_mask(inputs["input_ids"])
    with_image, prior = _plain_and_masked(model, inputs, image)
    with torch.no_grad():
        with attach(model, PriorSuppression(mode="output", gamma=0.5, beta=0.2)):
            ours = model(**inputs).logits
    expected = (with_image - 0.5 * prior).masked_fill(~plausibility_mask(with_image, 0.2), -math.inf)
    real = inputs["attention_mask"].bool()
    finite = allowed(expected[real])
    assert torch.equal(finite, allowed(ours[real]))
    torch.testing.assert_close(ours[real][finite], expected[real][finite], rtol=0, atol=1e-5)


@pytest.mark.parametrize("compact", [False, True])
def test_a_prefill_from_embeddings_forgets_the_previous_prompts_spans(compact):
    """A new prompt given as embeddings (no ids to find spans in) is run unmitigated, not
    with the spans of the prompt before it, and a warning says so (it had been silent)."""
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    _, strings = _span_rows(inputs, resolve(model))
    embeds = model.get_input_embeddings()(inputs["input_ids"][:, -6:])  # a text-only prompt
    with torch.no_grad():
        plain = model(inputs_embeds=embeds).logits
        with attach(model, PriorSuppression(WordIds(), spans=strings, compact_positions=compact)):
            model(**inputs)  # finds its span
            with pytest.warns(UserWarning, match="inputs_embeds.*runs unsuppressed"):
                after = model(inputs_embeds=embeds).logits
    torch.testing.assert_close(after, plain, rtol=0, atol=0)


def test_composes_with_vcd():
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=6)
    _, strings = _span_rows(inputs, resolve(model))
    with attach(model, VCD(), PriorSuppression(WordIds(), mode="both", spans=strings)) as handle, torch.no_grad():
        assert handle.rows_per_sample == 3
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2


@pytest.mark.parametrize("model_type", ["llava", "qwen2_vl"])
def test_compact_positions_compose_exactly_with_vcd_and_output_mode(model_type):
    """VCD + both modes with compact_positions (three rows per sample: original, VCD's
    noised image, the image-free branch) generate the logits that VCD + output mode give
    on the prompts with the spans deleted, at every step: each branch row's positions are
    closed up the same way (M-RoPE included)."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 8], seed=6)
    points = resolve(model)
    keys, strings = _span_rows(inputs, points, keep_last=True, pick=lambda row, starts: starts[-row],
                               exclude=_non_text_ids(model))
    assert _sides(inputs, keys, points) == ["before", "after"]
    deleted = _deleted_rows(inputs, keys, model.config.get_text_config().pad_token_id)
    options = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        with attach(model, VCD(seed=1), PriorSuppression(mode="output")):
            want = model.generate(**deleted, **options)
        with attach(model, VCD(seed=1), PriorSuppression(WordIds(), mode="both", spans=strings,
                                                         compact_positions=True)) as handle:
            assert handle.rows_per_sample == 3
            got = model.generate(**inputs, **options)
    want_logits, got_logits = torch.stack(want.logits), torch.stack(got.logits)
    assert torch.equal(allowed(got_logits), allowed(want_logits))  # the same plausible sets
    finite = allowed(want_logits)
    torch.testing.assert_close(got_logits[finite], want_logits[finite], rtol=0, atol=1e-5)


def test_bad_input_is_a_clear_error():
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    with pytest.raises(ValueError, match="strength"):
        PriorSuppression(WordIds(), strength=-0.1)
    with pytest.raises(ValueError, match="mode"):
        PriorSuppression(WordIds(), mode="everything")
    with pytest.raises(ValueError, match="compact_positions"):
        PriorSuppression(WordIds(), strength=0.5, compact_positions=True)
    with pytest.raises(ValueError, match="compact_positions"):
        PriorSuppression(mode="output", compact_positions=True)
    with pytest.raises(ValueError, match="every layer"):
        PriorSuppression(WordIds(), layers=[0], compact_positions=True)
    with pytest.raises(ValueError, match="tokenizer"):
        PriorSuppression(mode="context")
    with pytest.raises(ValueError, match="outside the prompt"), attach(
        model, PriorSuppression(WordIds(), spans=[[(0, 10_000)], [(0, 2)]])
    ):
        model(**inputs)
    with pytest.raises(ValueError, match="does not occur"), attach(
        model, PriorSuppression(WordIds(), spans=[["w9999"], ["w9999"]])
    ):
        model(**inputs)
    ids = inputs["input_ids"][0]
    image = resolve(model).image_token_mask(inputs["input_ids"])[0].nonzero().flatten()
    across = f"w{int(ids[image.min() - 1])} w{int(ids[image.max() + 1])}"
    text = " ".join(f"w{int(i)}" for i in ids if int(i) not in (0, 1, 2, resolve(model).image_token_id))
    assert across in text, "tiny llava inputs have text on both sides of the image"
    with pytest.raises(ValueError, match="overlaps the image"), attach(
        model, PriorSuppression(WordIds(), spans=[[across], []])
    ):
        model(**inputs)
    with pytest.raises(ValueError, match="rows"), attach(model, PriorSuppression(WordIds(), spans=[[], [], []])):
        model(**inputs)
    # one entry for two different prompts: not a beam repeat, refused (it was applied to both)
    with pytest.raises(ValueError, match="spans: given for 1 rows, the batch has 2 rows whose prompts differ"), \
            attach(model, PriorSuppression(WordIds(), spans=[[]])):
        model(**inputs)


def test_extra_rows_count_the_image_free_branch():
    from mitigate import PriorSuppression

    assert PriorSuppression(mode="output").extra_rows == 1
    from evaluators.organism import tasks
    from evaluators.organism.package import build_tokenizer

    tokenizer = build_tokenizer(tasks.vocabulary())
    assert PriorSuppression(tokenizer, mode="context").extra_rows == 0
    assert PriorSuppression(tokenizer, mode="both").extra_rows == 1


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_prior_suppression_under_a_static_cache(model_type):
    """Under ``cache_implementation="static"`` (4-D masks built by generate(), a cache of
    fixed length) context mode's bias and the image-free contrast give the default dynamic
    cache's scores at every step. Gemma 4's layers that share another layer's keys read a
    static cache's whole buffer from position 0 (they failed on it)."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    keys, strings = _span_rows(inputs, resolve(model))
    for mode in ("context", "both"):
        scores = {}
        for cache in ("static", None):
            kw = {"cache_implementation": cache} if cache else {}
            with attach(model, PriorSuppression(WordIds(), spans=strings, mode=mode)), torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, pad_token_id=0, do_sample=False,
                                     output_scores=True, return_dict_in_generate=True, **kw)
            scores[cache] = torch.stack(out.scores).nan_to_num(0.0, 0.0, 0.0)
        torch.testing.assert_close(scores["static"], scores[None], rtol=0, atol=1e-4)


def test_context_mode_refuses_a_cache_from_another_call():
    """Context mode's span mask belongs to the last prompt: continuing a first call's cache
    after a second call is a clear error (it applied the second call's spans); a manual
    loop over the model's own cache runs."""
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    other = tiny_inputs(model, batch_size=2, text_lengths=[4, 6], seed=4)
    with attach(model, PriorSuppression(WordIds(), mode="context")), torch.no_grad():
        first = model(**inputs, use_cache=True)
        token = first.logits[:, -1].argmax(-1, keepdim=True)
        mask = torch.cat([inputs["attention_mask"], torch.ones_like(token)], 1)
        model(input_ids=token, attention_mask=mask, cache=first.cache, use_cache=True)  # right after: runs
        first = model(**inputs, use_cache=True)
        model(**other, use_cache=True)
        with pytest.raises(ValueError, match="continues a cache that is not"):
            model(input_ids=token, attention_mask=mask, cache=first.cache, use_cache=True)


def _organism_belief_batch():
    """The organism, and two DO-Bench level-3 prompts whose belief sentence comes right
    after the image ("i am certain there is no <object> ...")."""
    from evaluators.organism import ORGANISM_DIR, load_organism
    from evaluators.organism.package import format_prompt
    from evaluators.organism.tasks import do_prior, existence_question
    from evaluators.world import BIASED, World

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    world, images, prompts = World(BIASED), [], []
    for seed in range(10**9, 10**9 + 400):
        scene = world.scene(seed)
        single = [o for o in scene.objects if scene.count(o.category) == 1]
        if single:
            images.append(scene.render())
            prompts.append(existence_question(single[0].category, do_prior(3, single[0].category, negative=True)))
        if len(images) == 2:
            break
    inputs = processor(text=[format_prompt(p) for p in prompts], images=images, return_tensors="pt", padding=True)
    return model, processor, inputs


def test_context_mode_finds_a_belief_in_a_later_prefill_chunk():
    """``prefill_chunk_size`` sends the prompt in several forwards; the spans were found on
    the first chunk's tokens only, so a belief sentence after the image went unsuppressed,
    silently. The spans are found again over the prompt so far at every chunk: the scores
    equal one forward's. A chunk boundary inside a belief sentence (tokens already run
    without the span) is a clear error."""
    model, processor, inputs = _organism_belief_batch()
    ids = inputs["input_ids"]
    image_end = int((ids == model.config.image_token_id).nonzero()[:, 1].max()) + 1
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    suppression = PriorSuppression(processor.tokenizer, mode="context")
    with torch.no_grad():
        plain = torch.stack(model.generate(**inputs, **kw).logits)
        with attach(model, suppression):
            whole = torch.stack(model.generate(**inputs, **kw).logits)
            spans = suppression.token_spans
            assert all(start >= image_end for row in spans for start, _ in row) and all(spans)
            chunked = torch.stack(model.generate(**inputs, prefill_chunk_size=image_end, **kw).logits)
            assert suppression.token_spans == spans
            with pytest.raises(ValueError, match="prefill_chunk_size cut"):
                model.generate(**inputs, prefill_chunk_size=spans[0][0][0] + 2, **kw)
    assert (whole - plain).abs().max() > 0.5, "the belief moves the answer: the equality says something"
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-4)


def test_context_mode_refuses_new_prompt_tokens_after_decoding_steps():
    """A conversation continued over its cache brings a new turn whose beliefs the spans
    (found on the first prompt) do not cover: a clear error, not a silently unsuppressed
    turn. The model's own decoding steps over that cache run."""
    model, processor, inputs = _organism_belief_batch()
    with attach(model, PriorSuppression(processor.tokenizer, mode="context")), torch.no_grad():
        first = model(**inputs, use_cache=True)
        token = first.logits[:, -1].argmax(-1, keepdim=True)
        mask = torch.cat([inputs["attention_mask"], torch.ones_like(token)], 1)
        step = model(input_ids=token, attention_mask=mask, cache=first.cache, use_cache=True)  # decoding: runs
        turn = inputs["input_ids"][:, -5:]
        mask = torch.cat([mask, torch.ones_like(turn)], 1)
        with pytest.raises(ValueError, match="continued over its cache"):
            model(input_ids=turn, attention_mask=mask, cache=step.cache, use_cache=True)


@pytest.mark.parametrize("model_type", ["llava", "qwen2_vl", "idefics3"])
def test_context_mode_refuses_a_forward_that_enters_below_the_model(model_type):
    """The spans are found in the ids the model's own call receives; ``model.model(...)`` or
    ``model.forward(...)`` skip that hook, and the last prompt's span positions were applied
    to other tokens (hidden states up to 1.7 off, silently). A clear error now; the model's
    own call runs."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    _, strings = _span_rows(inputs, resolve(model))
    with attach(model, PriorSuppression(WordIds(), spans=strings)), torch.no_grad():
        model(**inputs)
        for call in (model.model, model.forward):
            with pytest.raises(ValueError, match="model.model"):
                call(**inputs)
        model(**inputs)


@pytest.mark.parametrize("model_type", ATTENTION_ONLY)
def test_context_mode_under_a_chunked_prefill_equals_one_forward(model_type):
    """Your own spans in the first chunk, the rest of the prompt in later ones: the spans
    are looked up again over each chunk (every family's ids, M-RoPE positions included) and
    the scores equal an unchunked prefill's -- wherever transformers' own chunking leaves
    the plain model's unchanged."""
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[9], seed=3)
    keys, strings = _span_rows(inputs, resolve(model), pick=lambda row, starts: starts[0])
    chunk = int(keys[0].nonzero().max()) + 1

    if chunk >= inputs["input_ids"].shape[1]:
        pytest.skip("the span ends the prompt: nothing left for a second chunk")
    skip_unless_chunking_is_exact(model_type, model, inputs, chunk, max_new_tokens=3)
    suppression = PriorSuppression(WordIds(), spans=strings)
    torch.testing.assert_close(generate_scores(model, inputs, suppression, prefill_chunk_size=chunk, max_new_tokens=3),
                               generate_scores(model, inputs, suppression, max_new_tokens=3), rtol=0, atol=1e-4)


@pytest.mark.parametrize("spans, row", [
    (["I am certain there is no dog."], "row 0"), ("I am certain.", "got"), ([], "got"),
    ([["fine"], "flat"], "row 1"), ([[3]], "holds 3"), ([[(1, 2, 3)]], "holds"), ([[(True, 2)]], "holds"),
])
def test_spans_of_the_wrong_shape_are_a_clear_error(spans, row):
    """A flat list of strings had been read character by character ("' ' does not occur in
    the prompt"); the shape is checked when the mitigation is made."""
    with pytest.raises(ValueError, match=f"one list per row.*{row}"):
        PriorSuppression(WordIds(), spans=spans)
    PriorSuppression(WordIds(), spans=[["I am certain."], [(0, 4)], []])  # each row's own form


def test_context_mode_refuses_a_cache_filled_before_attach():
    """A prompt cached before ``attach()`` (prefix caching: its belief ran unsuppressed)
    and continued by ``generate()`` while attached: context mode found no spans and ran
    every step unsuppressed, silently -- the logits were the plain model's. A clear error
    now; the same prompt generated whole while attached still runs."""
    from transformers import DynamicCache

    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[7], seed=3)
    spans = WordIds.middle_pair(model, inputs)
    ids, mask, cut = inputs["input_ids"], inputs["attention_mask"], inputs["input_ids"].shape[1] - 2
    cache = DynamicCache(config=model.config.get_text_config())
    with torch.no_grad():
        model(input_ids=ids[:, :cut], attention_mask=mask[:, :cut], pixel_values=inputs["pixel_values"], cache=cache,
              use_cache=True)
    with attach(model, PriorSuppression(WordIds(), spans=spans)), torch.no_grad():
        with pytest.raises(ValueError, match="no prompt forward filled while it was attached"):
            model.generate(input_ids=ids, attention_mask=mask, cache=cache, max_new_tokens=3, do_sample=False)
        model.generate(**inputs, max_new_tokens=3, do_sample=False)


def test_context_mode_without_a_cache_never_finds_spans_in_generated_tokens():
    """``generate(use_cache=False)`` runs the prompt again at every step, with the tokens
    generated so far after it. Context mode found the spans anew in that whole sequence, so a
    belief the model itself wrote was suppressed in every later step -- which generate() over
    its cache never does (generated tokens are never in a span): the two disagreed from the
    step after it. On the organism, with a belief in the prompt (suppressed in both) and the
    same belief forced into the answer, the logits are now those of the cached run at every
    step, and the spans found are the prompt's alone."""
    from evaluators.organism import ORGANISM_DIR, load_organism
    from evaluators.organism.package import format_prompt
    from evaluators.world import BIASED, World

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    tok = processor.tokenizer
    inputs = processor(text=[format_prompt("i am sure there is no dog . describe the image .")],
                       images=[World(BIASED).scene(10**9 + 58).render()], return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    forced = tok(" i am sure there is no dog .", add_special_tokens=False).input_ids
    everything = list(range(model.config.get_text_config().vocab_size))

    def allow(row, ids):  # the answer starts with the belief, then the model goes on freely
        return [forced[ids.shape[0] - n]] if ids.shape[0] - n < len(forced) else everything

    options = dict(max_new_tokens=len(forced) + 4, min_new_tokens=len(forced) + 4, do_sample=False,
                   prefix_allowed_tokens_fn=allow, output_logits=True, return_dict_in_generate=True)
    mitigation = PriorSuppression(tok)
    with attach(model, mitigation), torch.no_grad():
        cached = model.generate(**inputs, **options)
        prompt_spans = [list(row) for row in mitigation.found]
        fresh = model.generate(**inputs, use_cache=False, **options)
        assert mitigation.found == prompt_spans and len(prompt_spans[0]) == 1
    with torch.no_grad():
        plain = model.generate(**inputs, **options)
    assert tok.decode(cached.sequences[0, n : n + len(forced)]).strip() == "i am sure there is no dog."
    assert torch.equal(fresh.sequences, cached.sequences)
    for step_cached, step_fresh in zip(cached.logits, fresh.logits):
        torch.testing.assert_close(step_fresh, step_cached, rtol=0, atol=1e-4)
    assert not torch.allclose(cached.logits[-1], plain.logits[-1], atol=1e-3)  # the prompt's belief is suppressed


def _conversation(first_belief: str = "", second_belief: str = "") -> list[dict]:
    def user(text, image=False):
        return {"role": "user", "content": [{"type": "image"}] * image + [{"type": "text", "text": text}]}

    return [user(f"{first_belief}describe the image .", image=True),
            {"role": "assistant", "content": [{"type": "text", "text": "i see a dog in the image ."}]},
            user(f"{second_belief}what colour is the dog ?")]


def test_the_models_own_earlier_answers_are_not_suppressed(organism):
    """In a conversation the prompt holds the model's earlier answers; "i see a dog in the
    image ." read as a belief and was suppressed, so the follow-up lost what it referred to
    (a user review). Assistant turns are told by the chat template (mitigate.turns); the
    users' beliefs in every turn are still found."""
    from evaluators.world import BIASED, World

    model, processor = organism
    image = World(BIASED).scene(0).render()
    for beliefs, expected in ((("", ""), []),
                              (("i think there is a dog in the image . ", "i am sure there is a bird in the image . "),
                               ["i think there is a dog in the image.", "i am sure there is a bird in the image."])):
        prompt = processor.apply_chat_template(_conversation(*beliefs), add_generation_prompt=True)
        enc = processor(text=[prompt], images=[image], return_tensors="pt")
        ps = PriorSuppression(processor.tokenizer)
        with attach(model, ps), torch.no_grad():
            model(**enc)
        assert [s.text for s in ps.found[0]] == expected
    # without a template to read the turns by, the whole prompt is searched, as before
    tokenizer = processor.tokenizer
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        ps = PriorSuppression(tokenizer)
        with attach(model, ps), torch.no_grad():
            model(**processor(text=[processor.apply_chat_template(_conversation(), add_generation_prompt=True)],
                              images=[image], return_tensors="pt"))
        assert [s.text for s in ps.found[0]] == ["i see a dog in the image."]
    finally:
        tokenizer.chat_template = template


def test_assistant_turns_made_of_special_tokens_are_told_apart(tmp_path):
    """Gemma 3's turns open with special tokens (<start_of_turn>model): the markers are
    matched with the special tokens written out, on the family's own tiny checkpoint."""
    import json

    from transformers import AutoProcessor

    from evaluators.organism import ORGANISM_DIR
    from hooks.testing.processors import save_tiny_checkpoint
    from mitigate.turns import turn_markers

    vocab = json.loads((ORGANISM_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    words = [w for w in vocab if not w.startswith("<")] + ["model"]  # the template's role name
    folder = save_tiny_checkpoint("gemma3", tmp_path / "gemma3", words=words)
    processor = AutoProcessor.from_pretrained(folder)
    markers = turn_markers(processor.tokenizer, processor.chat_template)
    assert markers is not None and "<start_of_turn>model" in markers.open and "<start_of_turn>user" in markers.close
    model = build_tiny_model("gemma3")
    prompt = processor.apply_chat_template(_conversation("i think there is a dog in the image . "),
                                           add_generation_prompt=True)
    from evaluators.world import BIASED, World

    enc = processor(text=[prompt], images=[World(BIASED).scene(0).render()], return_tensors="pt")
    ps = PriorSuppression(processor.tokenizer, chat_template=processor.chat_template)
    mask = ps.span_mask(resolve(model), enc["input_ids"])
    assert [s.text.strip() for s in ps.found[0]] == ["i think there is a dog in the image ."] and mask.any()


def test_a_role_name_in_the_users_own_text_hides_nothing(organism):
    """With plain-text role markers (the organism's " ASSISTANT: "), "assistant :" in the
    user's text opened an assistant turn that ran to the end of the prompt, and the belief
    after it went unsuppressed (a review); a turn must be closed by the template's close."""
    from evaluators.world import BIASED, World
    from hooks.prompting import user_prompt
    from mitigate.turns import TurnMarkers, turn_markers

    model, processor = organism
    image = World(BIASED).scene(0).render()
    for question in ("assistant : i think there is a dog in the image . is there a dog ?",
                     "my assistant : said so . i think there is a dog in the image . is there a dog ?"):
        enc = processor(text=[user_prompt(processor, question)], images=[image], return_tensors="pt")
        ps = PriorSuppression(processor.tokenizer)
        with attach(model, ps), torch.no_grad():
            model(**enc)
        assert [s.text for s in ps.found[0]] == ["i think there is a dog in the image."]
    # and in a conversation, role words before the real turn do not stretch it over the user's text
    conversation = _conversation("assistant : i think there is a dog in the image . ")
    enc = processor(text=[processor.apply_chat_template(conversation, add_generation_prompt=True)], images=[image],
                    return_tensors="pt")
    ps = PriorSuppression(processor.tokenizer)
    with attach(model, ps), torch.no_grad():
        model(**enc)
    assert [s.text for s in ps.found[0]] == ["i think there is a dog in the image."]
    # a text template handed the list form prints the list: its markers are not taken from that
    llama_like = ("{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] | string }}<|eot|>{% endfor %}"
                  "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}")
    assert turn_markers(processor.tokenizer, llama_like) == TurnMarkers("<|eot|><|start|>assistant\n",
                                                                        "<|eot|><|start|>user\n")
