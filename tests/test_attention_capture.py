"""hooks.capture: attention weights recomputed from the q/k a layer's attention call receives.

Checked on every supported family (tiny random models): the captured rows equal the
weights eager attention returns with ``output_attentions`` (within 1e-5), under sdpa and
eager, with left padding; the model's output is bit-for-bit what it is without the
capture, so a capture can ride along the caller's ``generate()``; detach restores the
attention modules' configs.
"""

from __future__ import annotations

import pytest
import torch

from hooks import HookGroup, resolve
from hooks.capture import AttentionCapture, attention_probabilities
from hooks.testing import TINY_MODEL_TYPES, build_tiny_model, tiny_inputs

def _layers(points):
    """The first and the last layer with softmax attention (every layer but a hybrid
    decoder's linear-attention ones)."""
    return [points.attention_layers[0], points.attention_layers[-1]]


def _eager_reference(model_type, inputs):
    """Per chosen layer, eager attention's full (B, H, S, S) weights (same weights as sdpa)."""
    eager = build_tiny_model(model_type, attn_implementation="eager")
    with torch.no_grad():
        out = eager(**inputs, output_attentions=True, use_cache=False)
    points = resolve(eager)
    # transformers returns the weights of the attention layers only, in layer order
    return [out.attentions[points.attention_layers.index(i)] for i in _layers(points)]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_captured_rows_equal_eager_weights(model_type, impl):
    model = build_tiny_model(model_type, attn_implementation=impl)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[3, 7], seed=1)  # left padding on row 0
    reference = _eager_reference(model_type, inputs)
    points = resolve(model)
    rows, seq = inputs["input_ids"].shape
    # a question-style weighting: the last four positions, unequal weights per row
    weights = torch.zeros(rows, seq)
    weights[0, -4:] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    weights[1, -2:] = 0.5
    for w in (None, weights):
        capture = AttentionCapture(points, _layers(points))
        with HookGroup("capture") as group, torch.no_grad():
            capture.attach(group)
            capture.arm(rows, seq, w)
            model(**inputs, use_cache=False)
            got = capture.take()  # (rows, layers * heads, seq)
        heads = reference[0].shape[1]
        for n, ref in enumerate(reference):
            mine = got[:, n * heads : (n + 1) * heads]
            expected = ref[:, :, -1] if w is None else torch.einsum("bq,bhqk->bhk", w, ref.float())
            torch.testing.assert_close(mine, expected.float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_capture_leaves_generate_unchanged_and_detaches(model_type):
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[2, 5], seed=3)
    points = resolve(model)
    attention = [m for m in points.attention if m is not None]
    configs = [m.config for m in attention]
    kwargs = dict(max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        plain = model.generate(**inputs, **kwargs)
        capture = AttentionCapture(points, _layers(points))
        with HookGroup("capture") as group:
            capture.attach(group)
            capture.arm(*inputs["input_ids"].shape)
            captured = model.generate(**inputs, **kwargs)
            maps = capture.take()  # the prefill was recorded, the decoding steps ignored
        again = model.generate(**inputs, **kwargs)
    assert torch.equal(plain.sequences, captured.sequences)
    for a, b in zip(plain.scores, captured.scores):
        assert torch.equal(a, b)
    assert maps.shape[-1] == inputs["input_ids"].shape[1]
    assert torch.allclose(maps.sum(-1), torch.ones(()), atol=1e-4)  # each head's row is a distribution
    assert [m.config for m in attention] == configs and all(
        a is b for a, b in zip((m.config for m in attention), configs))
    assert torch.equal(plain.sequences, again.sequences)


def test_probabilities_follow_each_mask_form():
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)  # grouped-query: 2 key heads
    positions = torch.tensor([1, 4])
    pad = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])  # row 0 left-padded
    causal = torch.ones(5, 5).tril().bool()
    boolean = (causal[None, None] & pad[:, None, None, :].bool())
    additive = torch.zeros(boolean.shape).masked_fill(~boolean, torch.finfo(torch.float32).min)
    by_bool = attention_probabilities(q, k, boolean, positions)
    assert torch.allclose(by_bool, attention_probabilities(q, k, additive, positions), atol=1e-6)
    assert torch.allclose(by_bool, attention_probabilities(q, k, pad, positions), atol=1e-6)  # flash's 2-D mask
    # reference: repeat the key heads, mask, softmax
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / 8 ** 0.5
    expected = torch.softmax(scores.masked_fill(~boolean, float("-inf")), -1)[:, :, positions]
    assert torch.allclose(by_bool, expected, atol=1e-6)
    assert torch.all(by_bool[0, :, :, 0] == 0)  # the padded key gets nothing
    no_mask = attention_probabilities(q[:1], k[:1], None, positions)  # sdpa's is_causal: causal only
    assert torch.all(no_mask[0, :, 0, 2:] == 0) and torch.allclose(no_mask.sum(-1), torch.ones(()))


def test_bad_use_is_a_clear_error():
    model = build_tiny_model("llava")
    points = resolve(model)
    with pytest.raises(ValueError, match="layers"):
        AttentionCapture(points, [])
    capture = AttentionCapture(points, [0])
    with pytest.raises(ValueError, match="weights has shape"):
        capture.arm(2, 5, torch.ones(2, 4))
    with pytest.raises(RuntimeError, match="saw no prompt forward"):
        capture.arm(1, 5)
        capture.take()
    with HookGroup("a") as group:
        capture.attach(group)
        with pytest.raises(ValueError, match="already being captured"):
            AttentionCapture(points, [0]).attach(HookGroup("b"))


def test_kv_shared_layers_capture_the_last_query_at_the_prefill():
    """Gemma 4's KV-shared layers compute only the last query at generate()'s prefill: the
    capture reads that row (equal to a full forward's last row on the same layer), and asks
    for any other query rows with a clear error; the default layers pass them over."""
    from mitigate.localize import default_layers

    model = build_tiny_model("gemma4")
    points = resolve(model)
    shared = points.kv_shared_layers
    assert shared and not set(shared) & set(default_layers(points))
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[3, 7], seed=1)
    rows, seq = inputs["input_ids"].shape
    with torch.no_grad():
        reference = AttentionCapture(points, shared)
        with HookGroup("capture") as group:
            reference.attach(group)
            reference.arm(rows, seq)
            model(**inputs, use_cache=False)  # a plain forward computes every query
            full = reference.take()
        capture = AttentionCapture(points, shared)
        with HookGroup("capture") as group:
            capture.attach(group)
            capture.arm(rows, seq)
            model.generate(**inputs, max_new_tokens=2, do_sample=False)
            torch.testing.assert_close(capture.take(), full, atol=1e-5, rtol=1e-4)
            weights = torch.zeros(rows, seq)
            weights[:, -2:] = 0.5
            capture.arm(rows, seq, weights)
            with pytest.raises(ValueError, match="queries='last'"):
                model.generate(**inputs, max_new_tokens=1, do_sample=False)


def test_capture_over_a_cache_filled_earlier_is_refused():
    """A prompt continued over a cache filled by an earlier forward: the keys hold the
    earlier turn's positions too, and reading the first ones as the prompt's gave wrong
    maps without an error (a static cache's empty slots are cut; these are not empty)."""
    from transformers import DynamicCache

    from mitigate.localize import capture_first_pass

    model = build_tiny_model("llava", attn_implementation="eager")
    first = tiny_inputs(model, batch_size=1, text_lengths=[6], seed=1)
    second = tiny_inputs(model, batch_size=1, text_lengths=[6], seed=2)
    mask = torch.ones(1, first["input_ids"].shape[1] + second["input_ids"].shape[1], dtype=torch.long)
    with torch.no_grad():
        cache = DynamicCache()
        model(**first, cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="cached positions"):
            with capture_first_pass(model, second, queries="last"):
                model(input_ids=second["input_ids"], pixel_values=second["pixel_values"], attention_mask=mask,
                      cache=cache, use_cache=True)


@pytest.mark.parametrize("cache", [None, "static"])
def test_kv_shared_layer_under_a_static_cache(cache):
    """Gemma 4's last layers share an earlier layer's keys; at the prefill transformers
    computes only their last query, over the keys -- under a static cache the whole buffer,
    whose empty slots are cut: the same map as a forward of its own."""
    from mitigate.localize import capture_first_pass, image_attention_maps

    model = build_tiny_model("gemma4", attn_implementation="eager")
    config = model.config.get_text_config()
    assert getattr(config, "num_kv_shared_layers", 0) > 0
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[6], seed=1)
    layers = [config.num_hidden_layers - 1]
    with torch.no_grad():
        separate = image_attention_maps(model, inputs, layers=layers, queries="last")
        with capture_first_pass(model, inputs, layers=layers, queries="last") as captured:
            model.generate(**inputs, max_new_tokens=2, do_sample=False, **({"cache_implementation": cache} if cache else {}))
    torch.testing.assert_close(captured["maps"][0], separate[0], atol=1e-5, rtol=1e-4)
