"""hooks/: every point resolves and fires on every supported architecture, hooks are owned
and removed exactly, image positions are where the features land, and the attention-bias
injection point is real under sdpa and eager."""

from __future__ import annotations

import math

import pytest
import torch

import hooks
from hooks import HookGroup, HookPointError, hook_state, resolve
from hooks.describe import trace
from hooks.testing import TINY_MODEL_TYPES, build_tiny_model, tiny_adapter, tiny_inputs

ARCHS = list(TINY_MODEL_TYPES)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request):
    model = build_tiny_model(request.param, attn_implementation="sdpa")
    return model, tiny_inputs(model, batch_size=2, text_lengths=[7, 4], seed=1)


def _text_config(model):
    return getattr(model.config, "text_config", None) or model.config


def test_table_covers_the_tiny_architectures():
    """Every tiny model's type has a table (a tower variant, llava_pixtral, its type's)."""
    from hooks.testing import tiny_spec

    assert {tiny_spec(name)["model_type"] for name in ARCHS} <= set(hooks.supported_model_types())
    assert len(ARCHS) >= 10, ARCHS


def test_every_point_resolves(tiny):
    model, _ = tiny
    points = resolve(model)
    assert points.adapter.source.startswith("table:")
    assert points.num_layers == _text_config(model).num_hidden_layers
    assert len(points.attention) == points.num_layers
    assert points.image_token_id == model.config.image_token_id
    assert points.lm_head is model.get_output_embeddings()
    assert points.token_embeddings is model.get_input_embeddings()
    assert points.attn_implementation == "sdpa"
    info = hooks.inspect(model, file=None)
    assert info["model_type"] == model.config.model_type


def test_introspection_finds_the_same_modules(tiny):
    """The fallback for unknown model types agrees with the table on every known family."""
    model, _ = tiny
    table = resolve(model)
    guessed = resolve(model, adapter=hooks.introspect_adapter(model))
    for name in ("vision_encoder", "projector", "language_model", "lm_head", "token_embeddings"):
        assert getattr(guessed, name) is getattr(table, name), name
    assert guessed.decoder_layers == table.decoder_layers
    assert guessed.attention == table.attention


def test_forward_fires_every_point_with_expected_shapes(tiny):
    model, inputs = tiny
    batch, seq = inputs["input_ids"].shape
    hidden = _text_config(model).hidden_size
    vocab = model.get_output_embeddings().out_features
    n = resolve(model).num_layers
    seen = trace(model, inputs)
    assert seen["lm_head.output"] == [(batch, seq, vocab)]
    assert seen["token_embeddings.output"][0] == (batch, seq, hidden)
    assert seen["language_model.input"][0] == (batch, seq, hidden)
    for point in ("decoder_layer.input", "decoder_layer.output"):
        assert seen[point] == [(batch, seq, hidden)] * n, point
    attention = len(resolve(model).attention_layers)  # a hybrid decoder's linear layers have none
    assert attention == n or resolve(model).adapter.linear_attention
    for point in ("attention.input", "attention.output"):
        assert seen[point] == [(batch, seq, hidden)] * attention, point
    assert len(seen["vision_encoder.output"]) >= 1
    assert len(seen["projector.output"]) >= 1
    assert all(shape[-1] == hidden for shape in seen["projector.output"])


def _capture(model, inputs):
    """Projector outputs and the embeddings the decoder receives, from one forward pass."""
    points = resolve(model)
    got = {"proj": []}
    with HookGroup() as group, torch.no_grad():
        points.add_hook(group, "projector.output", lambda m, a, k, out: got["proj"].append(out))
        points.add_hook(group, "language_model.input", lambda m, a, k: got.update(embeds=k["inputs_embeds"]))
        model(**inputs)
    proj = torch.cat([p.reshape(-1, p.shape[-1]) for p in got["proj"]])
    return points, proj, got["embeds"]


def test_image_positions_are_where_the_features_land(tiny):
    model, inputs = tiny
    points, proj, embeds = _capture(model, inputs)
    ids = inputs["input_ids"]
    mask = points.image_token_mask(ids)
    assert mask.any(dim=1).all(), "every row has image tokens"
    with torch.no_grad():
        token_embeds = points.token_embeddings(ids)
    # text positions carry the token embeddings unchanged
    torch.testing.assert_close(embeds[~mask], token_embeds[~mask], rtol=0, atol=0)
    rows = embeds[mask]
    if points.adapter.packed_image_features:
        # anyres / window order: rows are projector rows (a subset, reordered) or the newline vector
        candidates = proj
        if points.adapter.image_newline:
            candidates = torch.cat([proj, model.get_parameter(points.adapter.image_newline).detach()[None]])
        dist = torch.cdist(rows, candidates, compute_mode="donot_use_mm_for_euclid_dist").min(dim=1).values
        assert dist.max() < 1e-5
    else:
        # in order, one row per image token -- up to one global scale (PaliGemma divides by sqrt(hidden))
        assert rows.shape == proj.shape
        scale = (rows * proj).sum() / (proj * proj).sum()
        torch.testing.assert_close(rows, scale * proj, rtol=1e-5, atol=1e-6)
    positions = points.image_token_positions(ids)
    assert [len(p) for p in positions] == mask.sum(dim=1).tolist()


def test_noop_hooks_leave_logits_bit_identical(tiny):
    model, inputs = tiny
    points = resolve(model)
    with torch.no_grad():
        base = model(**inputs).logits
        with HookGroup() as group:
            for name in hooks.POINTS:
                points.add_hook(group, name, lambda *args: None)
            hooked = model(**inputs).logits
    assert torch.equal(base, hooked)


def test_removal_restores_hook_state_even_on_error(tiny):
    model, inputs = tiny
    points = resolve(model)
    calls = []
    foreign = points.lm_head.register_forward_hook(lambda m, a, out: calls.append("foreign"))
    try:
        before = hook_state(model)
        with pytest.raises(RuntimeError, match="boom"):
            with HookGroup() as group:
                for name in hooks.POINTS:
                    points.add_hook(group, name, lambda *args: None)
                assert hook_state(model) != before
                raise RuntimeError("boom")
        assert hook_state(model) == before
        assert not group.active
        with torch.no_grad():
            model(**inputs)
        assert calls == ["foreign"], "a hook registered by someone else still fires"
    finally:
        foreign.remove()


def test_group_run_removes_when_the_call_raises(tiny):
    model, inputs = tiny
    points = resolve(model)
    before = hook_state(model)
    group = HookGroup()
    points.add_hook(group, "lm_head.output", lambda *a: None)

    def bad():
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        group.run(bad)
    assert hook_state(model) == before


def test_attribute_patch_is_owned_and_restored_exactly():
    model = build_tiny_model("llava")
    owner = model.model
    pixels = torch.zeros(1, 3, 32, 32)
    owner.get_image_features(pixel_values=pixels)  # transformers installs its output recorders once
    before = hook_state(model)
    original = owner.get_image_features
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    with HookGroup() as group:
        group.patch_attribute(owner, "get_image_features", wrapped)
        assert owner.get_image_features is wrapped and hook_state(model) != before, "a patch shows in hook_state"
        with pytest.raises(ValueError, match="already patched"):
            group.patch_attribute(owner, "get_image_features", wrapped)
        owner.get_image_features(pixel_values=pixels)
    assert calls == [1]
    assert "get_image_features" not in vars(owner), "the instance has no attribute of its own again"
    assert hook_state(model) == before
    # removed out of order, a patch refuses to clobber the later one; in order, all is restored
    first, second = HookGroup("first"), HookGroup("second")
    first.patch_attribute(owner, "get_image_features", wrapped)
    second.patch_attribute(owner, "get_image_features", original)
    with pytest.raises(RuntimeError, match="replaced after this patch"):
        first.remove()
    assert owner.get_image_features is original
    assert first.active, "the patch that could not be removed is still owned by its group"
    second.remove()
    assert owner.get_image_features is wrapped
    first.remove()  # retried, now in order
    assert "get_image_features" not in vars(owner) and hook_state(model) == before
    # an instance attribute that existed before is put back, not deleted
    owner.custom = "mine"
    with HookGroup() as group:
        group.patch_attribute(owner, "custom", "theirs")
        assert owner.custom == "theirs"
    assert owner.custom == "mine"


def _removable_positions(ids, image_mask, attention_mask):
    """Per row, two text positions to drop: one early in the real tokens, one after the image."""
    keys = torch.zeros_like(ids, dtype=torch.bool)
    for row in range(ids.shape[0]):
        real = attention_mask[row].nonzero().flatten().tolist()
        text = [p for p in real[1:-1] if not image_mask[row, p]]
        assert len(text) >= 2, "tiny_inputs should put text around the image"
        keys[row, text[0]] = True
        keys[row, text[-1]] = True
    return keys


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("model_type", ARCHS)
def test_attention_bias_of_minus_inf_equals_removing_keys_from_the_mask(model_type, attn, batch):
    model = build_tiny_model(model_type, attn_implementation=attn)
    lengths = None if batch == 1 else [7, 4]
    inputs = tiny_inputs(model, batch_size=batch, text_lengths=lengths, seed=2)
    points = resolve(model)
    assert points.attn_implementation == attn
    keys = _removable_positions(inputs["input_ids"], points.image_token_mask(inputs["input_ids"]), inputs["attention_mask"])

    # Pin the decoder's position ids to the unmasked run's, so only attention differs
    # (Qwen's M-RoPE positions are computed from the 2-D mask).
    captured = {}
    with HookGroup() as group, torch.no_grad():
        points.add_hook(group, "language_model.input", lambda m, a, k: captured.update(pos=k.get("position_ids")))
        plain = model(**inputs).logits

    def pin(module, args, kwargs):
        if captured["pos"] is not None:
            return args, {**kwargs, "position_ids": captured["pos"]}

    def unmasked(module, args, kwargs):  # a hybrid decoder's linear layers read the keys as before
        return args, {**kwargs, "attention_mask": inputs["attention_mask"]}

    masked_inputs = {**inputs, "attention_mask": inputs["attention_mask"].masked_fill(keys, 0)}
    with HookGroup() as group, torch.no_grad():
        group.add_forward_pre_hook(points.language_model, pin)
        for _, module in points.linear_attention():
            group.add_forward_pre_hook(module, unmasked)
        reference = model(**masked_inputs).logits

    with HookGroup() as group, torch.no_grad():
        hooks.add_attention_bias(group, points, hooks.key_bias(keys, -math.inf))
        assert len(group) == len(points.attention_layers)  # every layer, but a hybrid's linear ones
        biased = model(**inputs).logits

    real = inputs["attention_mask"].bool()
    assert not torch.allclose(plain[real], reference[real]), "removing the keys must matter"
    torch.testing.assert_close(biased[real], reference[real], rtol=0, atol=1e-5)


def test_finite_bias_changes_logits_and_zero_bias_does_not(tiny):
    model, inputs = tiny
    points = resolve(model)
    keys = _removable_positions(inputs["input_ids"], points.image_token_mask(inputs["input_ids"]), inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        plain = model(**inputs).logits
        with HookGroup() as group:
            hooks.add_attention_bias(group, points, hooks.key_bias(keys, 0.0))
            zero = model(**inputs).logits
        with HookGroup() as group:
            hooks.add_attention_bias(group, points, hooks.key_bias(keys, -2.0), layers=[-1])
            mild = model(**inputs).logits
    torch.testing.assert_close(zero[real], plain[real], rtol=0, atol=1e-5)
    assert not torch.allclose(mild[real], plain[real], atol=1e-6)


def test_the_cache_is_found_under_either_name():
    """transformers 5.24 renamed the cache keyword (past_key_values -> cache); the hooks read
    both, and the running version's attention modules name one of them."""
    from hooks.cache import CACHE_NAMES, cache_of, cache_parameter, output_cache

    def old(hidden_states, attention_mask=None, past_key_values=None): ...

    def new(hidden_states, position_embeddings=None, attention_mask=None, cache=None): ...

    assert cache_parameter(old) == ("past_key_values", 2) and cache_parameter(new) == ("cache", 3)
    assert cache_parameter(lambda hidden_states: None) == (None, None)
    marker = object()
    assert cache_of({"past_key_values": marker}) is marker and cache_of({"cache": marker}) is marker
    assert cache_of({"cache": None, "past_key_values": None}) is None
    assert output_cache({"past_key_values": marker}) is marker and output_cache({"cache": marker}) is marker
    model = build_tiny_model("llava")
    points = resolve(model)
    assert cache_parameter(points.attention[0].forward)[0] in CACHE_NAMES
    with torch.no_grad():
        out = model(**tiny_inputs(model, batch_size=1, seed=0), use_cache=True)
    assert output_cache(out) is not None and output_cache(out).get_seq_length() > 0


def test_bias_follows_generation_steps():
    """During generate() the bias sees absolute positions growing by one per step."""
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=1, seed=3)
    points = resolve(model)
    seen = []

    def record(ctx):
        if ctx.layer == 0:
            seen.append((ctx.query_positions.tolist(), len(ctx.key_positions)))
        # the int offset a bias slices with (no device sync) is the first key's index
        assert ctx.key_offset == int(ctx.key_positions[0])
        assert ctx.key_positions.tolist() == list(range(ctx.key_offset, ctx.key_offset + len(ctx.key_positions)))
        return None

    prompt = inputs["input_ids"].shape[1]
    with HookGroup() as group, torch.no_grad():
        hooks.add_attention_bias(group, points, record)
        model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert seen[0] == (list(range(prompt)), prompt)
    assert seen[1:] == [([prompt], prompt + 1), ([prompt + 1], prompt + 2)]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type, masks", [("llava", 1), ("gemma3", 2)])  # gemma3: sliding + full masks
def test_a_layer_independent_bias_is_built_once_per_forward_with_the_same_result(model_type, masks, attn):
    model = build_tiny_model(model_type, attn_implementation=attn)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3], seed=5)
    points = resolve(model)
    keys = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
    keys[:, 1] = True
    calls = []
    base = hooks.key_bias(keys, -2.0)

    def counted(ctx):
        calls.append(ctx.layer)
        return base(ctx)

    outputs = {}
    for shared in (False, True):
        calls.clear()
        with HookGroup() as group, torch.no_grad():
            hooks.add_attention_bias(group, points, counted, same_for_all_layers=shared)
            outputs[shared] = (model(**inputs).logits, len(calls))
            model(**inputs)  # a second forward must rebuild, not reuse the first one's mask
            outputs[shared] += (len(calls),)
    (per_layer, n_per_layer, _), (memo, n_memo, n_memo2) = outputs[False], outputs[True]
    assert torch.equal(per_layer, memo)
    assert n_per_layer == points.num_layers
    assert n_memo == masks and n_memo2 == 2 * n_memo


SHARED_MASK = [t for t in ARCHS if tiny_adapter(t).shared_causal_mask]


@pytest.mark.parametrize("cache", [None, "static"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", SHARED_MASK)
def test_one_biased_mask_on_the_language_model_equals_a_bias_per_layer(model_type, attn, cache):
    """A layer-independent bias on every layer is folded into the mask the language model
    builds once (one hook, none on the attention modules): the same greedy tokens and scores
    as the per-layer hooks, at the padded prefill and at every decoding step. A static
    cache holds slots past the current token, which the mask keeps out of attention; for
    text configs with layer types (Qwen2's) generate() then hands the language model its
    masks prepared per layer type, which the shared mask takes too."""
    from hooks.attention import shares_one_mask

    model = build_tiny_model(model_type, attn_implementation=attn)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 4], seed=4)
    points = resolve(model)
    keys = _removable_positions(inputs["input_ids"], points.image_token_mask(inputs["input_ids"]), inputs["attention_mask"])
    runs = {}
    for shared in (False, True):
        with HookGroup() as group, torch.no_grad():
            hooks.add_attention_bias(group, points, hooks.key_bias(keys, -1.5), same_for_all_layers=shared)
            state = hook_state(model)
            on_attention = [name for name, module in model.named_modules()
                            if any(module is a for a in points.attention) and state[name]["_forward_pre_hooks"]]
            out = model.generate(**inputs, max_new_tokens=4, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, cache_implementation=cache)
            runs[shared] = (out.sequences, torch.stack(out.scores), len(group), on_attention)
    with torch.no_grad():
        plain = torch.stack(model.generate(**inputs, max_new_tokens=4, do_sample=False, output_scores=True,
                                           return_dict_in_generate=True, cache_implementation=cache).scores)
    (seq, scores, n, attention), (seq_shared, scores_shared, n_shared, attention_shared) = runs[False], runs[True]
    assert n == len(points.attention_layers) and len(attention) == n
    if shares_one_mask(points, points.attention_layer_indices(None)):
        assert n_shared == 1 and attention_shared == [], "one hook on the language model, none per layer"
    else:  # Aya Vision's Cohere2 decoder has sliding-window layers: a hook per layer, the mask memoised
        assert model_type == "aya_vision" and n_shared == n + 1
    assert not torch.allclose(scores, plain, atol=1e-4), "the bias must matter"
    assert torch.equal(seq, seq_shared)
    torch.testing.assert_close(scores_shared, scores, rtol=0, atol=1e-5)


def test_the_shared_mask_reads_the_cache_under_either_keyword():
    """A language model called directly with the pre-5.24 ``past_key_values`` keyword: the
    decoding step's query is at its cached position, not at 0."""
    from transformers import DynamicCache

    model = build_tiny_model("llava", attn_implementation="eager")
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 4], seed=4)
    points = resolve(model)
    keys = _removable_positions(inputs["input_ids"], points.image_token_mask(inputs["input_ids"]), inputs["attention_mask"])
    ids = inputs["input_ids"].masked_fill(points.image_token_mask(inputs["input_ids"]), 5)  # text only
    step = torch.full((2, 1), 6)
    mask = torch.cat([inputs["attention_mask"], torch.ones(2, 1, dtype=torch.long)], 1)
    states = {}
    for shared in (False, True):
        with HookGroup() as group, torch.no_grad():
            hooks.add_attention_bias(group, points, hooks.key_bias(keys, -1.5, query_from=3), same_for_all_layers=shared)
            cache = DynamicCache(config=model.config.text_config)
            points.language_model(input_ids=ids, attention_mask=inputs["attention_mask"], past_key_values=cache)
            states[shared] = points.language_model(input_ids=step, attention_mask=mask, past_key_values=cache).last_hidden_state
    torch.testing.assert_close(states[True], states[False], rtol=0, atol=1e-5)


def test_the_shared_mask_refuses_to_guess_how_a_multimodal_rope_model_reads_2d_positions():
    model = build_tiny_model("qwen2_vl")
    points = resolve(model)
    keys = torch.zeros(1, 6, dtype=torch.bool)
    keys[0, 2] = True
    with HookGroup() as group, torch.no_grad():
        hooks.add_attention_bias(group, points, hooks.key_bias(keys, -1.5), same_for_all_layers=True)
        with pytest.raises(ValueError, match="2-D position_ids, no cache and no attention mask"):
            points.language_model(input_ids=torch.full((1, 6), 5), position_ids=torch.arange(6)[None], use_cache=False)
        # with a mask, or the 4-row positions, nothing is left to guess
        points.language_model(input_ids=torch.full((1, 6), 5), position_ids=torch.arange(6)[None], use_cache=False,
                              attention_mask=torch.ones(1, 6, dtype=torch.long))
        points.language_model(input_ids=torch.full((1, 6), 5), position_ids=torch.arange(6).expand(4, 1, 6),
                              use_cache=False)


def test_the_shared_mask_is_used_only_where_one_mask_serves_every_layer():
    from hooks.attention import shares_one_mask

    points = resolve(build_tiny_model("mistral3"))
    every = points.attention_layer_indices(None)
    assert shares_one_mask(points, every)
    assert not shares_one_mask(points, every[:-1]), "a bias on some layers needs a hook on each"
    points.language_model.config.sliding_window = 16  # Mistral's window: its mask is not a full layer's
    assert not shares_one_mask(points, every)
    gemma = resolve(build_tiny_model("gemma3"))  # the wrapper builds the masks (image blocks, sliding layers)
    assert not shares_one_mask(gemma, gemma.attention_layer_indices(None))
    with HookGroup() as group:  # so the bias goes on through a hook per attention module
        hooks.add_attention_bias(group, points, lambda ctx: None, same_for_all_layers=True)
        assert len(group) == 1 + len(every)  # the memo's reset on the language model, one per layer


def test_bias_refuses_flash_attention():
    model = build_tiny_model("llava")
    points = resolve(model)
    config = points.attention[0].config
    old = config._attn_implementation
    try:
        config._attn_implementation = "flash_attention_2"
        with pytest.raises(ValueError, match="flash_attention_2"):
            hooks.add_attention_bias(HookGroup(), points, lambda ctx: None)
    finally:
        config._attn_implementation = old


def test_key_bias_rejects_bad_input():
    with pytest.raises(ValueError, match="key_mask"):
        hooks.key_bias(torch.zeros(3), -1.0)
    with pytest.raises(ValueError, match="value"):
        hooks.key_bias(torch.zeros(1, 3, dtype=torch.bool), 1.0)


def test_bad_point_and_layer_names_are_clear():
    model = build_tiny_model("llava")
    points = resolve(model)
    with pytest.raises(ValueError, match="Did you mean"):
        points.add_hook(HookGroup(), "lm_head.outptu", lambda *a: None)
    with pytest.raises(ValueError, match="out of range"):
        points.add_hook(HookGroup(), "decoder_layer.output", lambda *a: None, layers=[99])
    # "all" was read letter by letter ("layer index 'a' out of range"); True was taken as layer 1
    with pytest.raises(ValueError, match="layers must be None .* got 'all'"):
        points.layer_indices("all")
    with pytest.raises(ValueError, match="layer indices must be ints, got True"):
        points.layer_indices([True])
    import numpy as np

    assert points.layer_indices(np.array([0, -1])) == [0, points.num_layers - 1]
    with pytest.raises(ValueError, match="not per-layer"):
        points.add_hook(HookGroup(), "lm_head.output", lambda *a: None, layers=[0])


def test_a_part_of_a_model_or_a_processor_gets_a_clear_error():
    """resolve(model.model.vision_tower) raised AttributeError "has no attribute ``" (an empty
    path from introspection); resolve(model.model) listed every path without saying to pass
    the whole model; attach(processor, ...) failed on 'named_modules' (a user review)."""
    import warnings

    from hooks import HookPointError
    from mitigate import VCD, attach

    model = build_tiny_model("llava")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # introspection warns that it guesses
        with pytest.raises(HookPointError, match="introspection could not find"):
            resolve(model.model.vision_tower)
    with pytest.raises(HookPointError, match=r"pass the whole model with its LM head"):
        resolve(model.model)
    with pytest.raises(TypeError, match="attach\\(\\) takes the model .* got Processor"):
        attach(type("Processor", (), {})(), VCD())


def test_a_text_only_model_gets_a_clear_error():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(HookPointError, match=r"'llama'.*vision_encoder"):
        resolve(model)
    with pytest.raises(HookPointError):
        hooks.inspect(model, file=None)


def test_register_adapter_for_a_new_model_type():
    model = build_tiny_model("llava")
    row = {**hooks.get_adapter("llava").to_dict(), "model_type": "my_llava"}
    row.pop("source")
    adapter = hooks.Adapter.from_dict(row)
    points = resolve(model, adapter=adapter)
    assert points.model_type == "my_llava"
    with pytest.raises(ValueError, match="unknown field"):
        hooks.Adapter.from_dict({**row, "vision_towr": "x"})
    with pytest.raises(ValueError, match="pixel_layout"):
        hooks.Adapter.from_dict({**row, "pixel_layout": "weird"})
    with pytest.raises(ValueError, match="pixel_grids is for the patch layouts and padded batch_chw images"):
        hooks.Adapter.from_dict({**row, "pixel_layout": "batch_images_chw", "pixel_grids": {"pixel_values": "image_sizes"},
                                 "image_inputs": ["image_sizes"]})
    with pytest.raises(ValueError, match="pixel_grids must map pixel inputs"):  # batch_chw: a per-image input it has
        hooks.Adapter.from_dict({**row, "pixel_grids": {"pixel_values": "image_sizes"}})
    with pytest.raises(ValueError, match="pixel_range"):
        hooks.Adapter.from_dict({**row, "pixel_range": "0-255"})
    with pytest.raises(ValueError, match="linear_attention"):
        hooks.Adapter.from_dict({**row, "linear_attention": ""})
    qwen = {**hooks.get_adapter("qwen2_vl").to_dict(), "model_type": "my_qwen"}
    qwen.pop("source")
    with pytest.raises(ValueError, match="pixel_grids must map"):
        hooks.Adapter.from_dict({**qwen, "pixel_grids": {"pixel_values": "nope"}})
    bad = hooks.Adapter.from_dict({**row, "projector": "model.nope"})
    with pytest.raises(HookPointError, match=r"projector \(model.nope\)"):
        resolve(model, adapter=bad)
    # a researcher's slips: a string split into letters, a missing field, a token that is not the image's
    with pytest.raises(ValueError, match=r"image_token_id must be a list of names, got 'image_token_id' \(write"):
        hooks.Adapter.from_dict({**row, "image_token_id": "image_token_id"})
    with pytest.raises(ValueError, match=r"adapter 'my_llava': missing field\(s\) \['lm_head'\]"):
        hooks.Adapter.from_dict({k: v for k, v in row.items() if k != "lm_head"})
    for wrong in ("bos_token_id", "pad_token_id"):  # VCD hid BOS, or nothing, silently
        with pytest.raises(HookPointError, match="image token"):
            resolve(model, adapter=hooks.Adapter.from_dict({**row, "image_token_id": [wrong]}))
    with pytest.raises(KeyError, match="Did you mean"):
        hooks.get_adapter("lava")


def test_groups_on_lists_the_live_groups_acting_on_a_models_forward():
    from hooks import groups_on

    model = build_tiny_model("llava")
    other = build_tiny_model("llava", seed=1)
    points = resolve(model)
    assert groups_on(model) == []  # transformers' own hooks (output recorders) are not groups
    with HookGroup("a") as a, HookGroup("b") as b, HookGroup("patch") as patch:
        points.add_hook(a, "lm_head.output", lambda m, args, kwargs, out: None)
        b.add_forward_pre_hook(resolve(other).projector, lambda m, args, kwargs: None)
        patch.patch_attribute(model, "generate", lambda *args, **kwargs: None)  # not a forward hook
        assert groups_on(model) == [a] and groups_on(other) == [b]
        a.remove()
        assert groups_on(model) == []
    assert groups_on(other) == []


def test_hybrid_decoder_attention_points_skip_its_linear_layers():
    """Qwen3.5's Gated DeltaNet layers have no attention scores: the attention points, the
    bias and the capture use its full-attention layers, and asking for a linear layer by
    index is an error naming the attention layers; the linear mixers are listed apart."""
    from hooks.capture import AttentionCapture

    model = build_tiny_model("qwen3_5")
    points = resolve(model)
    assert points.attention_layers == [1, 3] and points.num_layers == 4
    assert [i for i, _ in points.linear_attention()] == [0, 2]
    assert all(type(m).__name__.endswith("GatedDeltaNet") for _, m in points.linear_attention())
    assert points.attention_layer_indices(None) == [1, 3] and points.attention_layer_indices([-1]) == [3]
    assert "layers [1, 3] only" in points.describe()["attention"]
    with pytest.raises(ValueError, match=r"layers \[0\] .*linear_attn.*attention layers are \[1, 3\]"):
        points.attention_layer_indices([0, 1])
    with HookGroup() as group:
        with pytest.raises(ValueError, match="linear attention"):
            hooks.add_attention_bias(group, points, lambda ctx: None, layers=[2])
        with pytest.raises(ValueError, match="linear attention"):
            points.add_hook(group, "attention.input", lambda i, m, a, k: None, layers=[0])
        with pytest.raises(ValueError, match="linear attention"):
            AttentionCapture(points, [0])
        assert len(points.add_hook(group, "decoder_layer.input", lambda i, m, a, k: None)) == 4
    assert resolve(model, adapter=hooks.introspect_adapter(model)).attention == points.attention


def test_a_class_registered_under_another_model_type_gets_its_table_adapter():
    """transformers maps several model types to one class (``shieldgemma2`` is Gemma 3's):
    the class carries the table's facts, where introspection guessed a grid and no inputs."""
    model = build_tiny_model("gemma3")
    model.config.model_type = "shieldgemma2"
    points = resolve(model)
    table = hooks.get_adapter("gemma3")
    assert points.adapter.model_type == "shieldgemma2" and "Gemma3ForConditionalGeneration" in points.adapter.source
    assert (points.adapter.token_layout, points.adapter.image_inputs) == (table.token_layout, table.image_inputs)

    class MyLlava(type(build_tiny_model("llava"))):  # a user's subclass under its own type name
        pass

    mine = MyLlava(build_tiny_model("llava").config)
    mine.config.model_type = "my_llava"
    assert resolve(mine).adapter.token_layout == hooks.get_adapter("llava").token_layout
    # the class's table brings its tower variants: a subclass of pixtral-12b's class on its tower
    pixtral = MyLlava(build_tiny_model("llava_pixtral").config)
    pixtral.config.model_type = "my_llava"
    assert (resolve(pixtral).adapter.token_layout, resolve(pixtral).adapter.image_inputs) == ("pixtral", ("image_sizes",))


def test_an_architecture_known_only_by_introspection_is_said_so_and_not_mapped(monkeypatch):
    """Introspection finds modules, not facts: resolve() warns once, naming the guesses, and
    where the image tokens lie is refused rather than read as a square grid (a perceiver's
    64 latents had been mapped as an 8x8 grid)."""
    import hooks.points as points_module

    model = build_tiny_model("llava")
    model.config.model_type = "mystery_vlm"
    monkeypatch.setattr(points_module, "adapter_for_class", lambda m: None)
    monkeypatch.setattr(points_module, "_WARNED", set())
    with pytest.warns(UserWarning, match="mystery_vlm.*introspection.*guesses"):
        points = resolve(model)
    assert points.adapter.source == "introspection"
    with pytest.raises(ValueError, match="no adapter stating where its image tokens lie"):
        points.token_regions(16)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve(model)  # once per model type


def test_several_images_in_one_row_are_refused_not_mapped_as_one():
    """Four LLaVA images of 16 tokens in one row make 64 tokens, a perfect square: it was
    mapped as one 8x8 image."""
    model = build_tiny_model("llava")
    points = resolve(model)
    inputs = {"input_ids": torch.zeros(1, 80, dtype=torch.long), "pixel_values": torch.zeros(4, 3, 8, 8)}
    with pytest.raises(ValueError, match="4 images for 1 rows"):
        points.token_regions(64, inputs, row=0)
    with pytest.raises(ValueError, match="pan-and-scan"):
        points.token_regions(64, {"num_crops": torch.tensor([3])}, row=0)
    one = {"input_ids": torch.zeros(2, 80, dtype=torch.long), "pixel_values": torch.zeros(2, 3, 8, 8)}
    assert len(points.token_regions(64, one, row=1)) == 1


def test_gemma3_pan_and_scan_through_its_processor_is_refused_saying_so():
    """Gemma3Processor drops ``num_crops`` from its output, so its pan-and-scan crops reach
    the layout only as more images than rows: the refusal says what they are (from a
    helper's audit: the dedicated message was unreachable through the processor)."""
    from PIL import Image

    from hooks.testing import tiny_processor

    model = build_tiny_model("gemma3")
    processor = tiny_processor("gemma3", model.config)
    prompt = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                                           add_generation_prompt=True)
    enc = dict(processor(text=[prompt], images=[[Image.new("RGB", (1200, 400), (1, 2, 3))]], return_tensors="pt",
                         do_pan_and_scan=True, pan_and_scan_min_crop_size=32))
    assert "num_crops" not in enc and len(enc["pixel_values"]) > 1
    points = resolve(model)
    with pytest.raises(ValueError, match="images for 1 rows.*Gemma 3's pan-and-scan"):
        points.token_regions(int(points.image_token_mask(enc["input_ids"])[0].sum()), enc, 0, (1200, 400))


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_images_that_do_not_pair_with_rows_are_refused_for_every_adapter_that_counts_them(model_type):
    """Row 0 with two images beside row 1 with one: per-image entries are read by row, so
    row 1 read row 0's second image (Qwen2-VL: a 48x64 image's 8x6 raster for its own 6x8,
    silently; a reviewer's finding). Every input the adapter says counts images is checked."""
    from hooks.layout import token_regions

    adapter = tiny_adapter(model_type)  # tower variants included
    assert set(adapter.image_count_inputs) <= {*adapter.pixel_inputs, *adapter.image_inputs}
    ids = torch.zeros(2, 40, dtype=torch.long)
    for name in adapter.image_count_inputs:
        with pytest.raises(ValueError, match=f"3 images for 2 rows \\('{name}'"):
            token_regions(adapter.token_layout, None, 16, {"input_ids": ids, name: torch.zeros(3, 3)}, 1,
                          (32, 32), adapter.image_count_inputs)


def test_qwen_rows_with_their_own_images_map_and_mixed_rows_are_refused():
    model = build_tiny_model("qwen2_vl")
    points = resolve(model)
    merge = model.config.vision_config.spatial_merge_size
    paired = {"input_ids": torch.zeros(2, 60, dtype=torch.long),
              "image_grid_thw": torch.tensor([[1, 4 * merge, 6 * merge], [1, 6 * merge, 4 * merge]])}
    assert [(r.rows, r.cols) for r in points.token_regions(24, paired, 1, (32, 48))] == [(6, 4)]
    mixed = {**paired, "image_grid_thw": torch.tensor([[1, 4 * merge, 6 * merge]] * 2 + [[1, 6 * merge, 4 * merge]])}
    with pytest.raises(ValueError, match="3 images for 2 rows"):
        points.token_regions(24, mixed, 1, (32, 48))


def test_layers_may_be_any_iterable():
    """A generator was read twice (modules, then indices): no hook was attached, silently."""
    model = build_tiny_model("llava")
    points = resolve(model)
    fired = []
    with HookGroup("gen") as group:
        handles = points.add_hook(group, "decoder_layer.output", lambda i, *a: fired.append(i),
                                  layers=(i for i in [0, 1]))
        assert len(handles) == 2
        with torch.no_grad():
            model(**tiny_inputs(model, batch_size=1, text_lengths=[4], seed=0))
    assert sorted(set(fired)) == [0, 1]


def test_a_bias_after_a_capture_sees_the_real_implementation():
    from hooks.capture import AttentionCapture

    model = build_tiny_model("llava", attn_implementation="sdpa")
    points = resolve(model)
    with HookGroup("both") as group:
        AttentionCapture(points, [0]).attach(group)
        assert points.attn_implementation == "sdpa"
        hooks.add_attention_bias(group, points, hooks.key_bias(torch.zeros(1, 1, dtype=torch.bool), 0.0), layers=[-1])


def test_the_users_exception_leaves_the_block_when_removal_also_fails():
    """Two groups patching one attribute, left out of order while an error is leaving: the
    user's error propagates (a removal RuntimeError had replaced it), with a warning."""
    import types

    target = types.SimpleNamespace(value=1)
    outer = HookGroup("outer")
    outer.patch_attribute(target, "value", 2)
    inner = HookGroup("inner")
    inner.patch_attribute(target, "value", 3)
    with pytest.raises(KeyError), pytest.warns(RuntimeWarning, match="KeyError"):
        with outer:
            raise KeyError("the user's")
    inner.remove()
    outer.remove()
    assert target.value == 1


def test_a_subclass_that_renames_a_part_is_found_by_introspection():
    """The class's table adapter serves only where its paths exist; a user's subclass with a
    renamed projector had failed to resolve where introspection finds it."""
    import warnings

    base = build_tiny_model("llava")

    class Renamed(type(base)):
        pass

    model = Renamed(base.config)
    model.config.model_type = "renamed_llava"
    model.model.mm_projector = model.model.multi_modal_projector
    del model.model.multi_modal_projector
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        points = resolve(model)
    assert points.adapter.source == "introspection" and points.projector is model.model.mm_projector


def test_a_group_whose_block_has_ended_refuses_new_hooks():
    """A hook added to a group after its ``with`` block had nothing left to remove it (it
    fired on every later forward); now refused until the group is entered again."""
    model = build_tiny_model("llava")
    points = resolve(model)
    before = hook_state(model)
    group = HookGroup("ended")
    with group:
        points.add_hook(group, "projector.output", lambda m, a, k, out: None)
    with pytest.raises(RuntimeError, match="with-block has ended"):
        points.add_hook(group, "projector.output", lambda m, a, k, out: None)
    with pytest.raises(RuntimeError, match="with-block has ended"):
        group.patch_attribute(model, "generate", lambda *a, **k: None)
    assert hook_state(model) == before
    with group:  # entered again: registers, and removes on exit
        points.add_hook(group, "projector.output", lambda m, a, k, out: None)
        assert hook_state(model) != before
    assert hook_state(model) == before
    explicit = HookGroup("explicit")  # never entered: remove() then reuse, as documented
    points.add_hook(explicit, "projector.output", lambda m, a, k, out: None)
    explicit.remove()
    points.add_hook(explicit, "projector.output", lambda m, a, k, out: None)
    explicit.remove()
    assert hook_state(model) == before


def test_removal_callbacks_run_once_in_reverse_order_and_a_failing_one_is_retried():
    """``HookGroup.on_remove``: state a hook leaves outside the model is released with the
    hooks -- once, in reverse order of registration; one that raises stays owned and the
    next ``remove()`` retries it, as a hook that could not be removed does."""
    calls, fail = [], [True]
    group = HookGroup("callbacks")
    group.on_remove(lambda: calls.append("first"))

    def second():
        if fail[0]:
            raise OSError("not yet")
        calls.append("second")

    group.on_remove(second)
    with pytest.raises(RuntimeError, match="1 hook"):
        group.remove()
    assert calls == ["first"] and group.active
    fail[0] = False
    group.remove()
    group.remove()
    assert calls == ["first", "second"] and not group.active


def _unregistered(model_type: str, **config):
    """A tiny random model of a family transformers ships and the adapter table does not
    have (so resolve() introspects it)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(AutoConfig.for_model(model_type, **config)).float().eval()


_LLAMA = dict(model_type="llama", vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)


def test_an_encoder_decoder_model_is_refused_by_name():
    """Florence-2 (a BART language model): introspection took the encoder's layers for the
    decoder's, with only the generic warning, and every contrast branch then failed with
    "need input_ids or inputs_embeds" (generate() hands the forward decoder ids only). Now a
    HookPointError that says encoder-decoder models are not supported."""
    bart = dict(model_type="bart", vocab_size=256, d_model=32, encoder_layers=1, decoder_layers=1,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                max_position_embeddings=256, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    vision = dict(depths=[1, 1], patch_size=[7, 3], patch_stride=[4, 2], patch_padding=[3, 1],
                  patch_prenorm=[False, True], embed_dim=[16, 32], num_heads=[1, 2], num_groups=[1, 2], window_size=2,
                  projection_dim=32, max_temporal_embeddings=4, max_position_embeddings=16)
    model = _unregistered("florence2", text_config=bart, vision_config=vision, image_token_id=250)
    with pytest.raises(HookPointError, match="encoder-decoder"):
        resolve(model)


def test_introspection_reads_the_pixel_and_per_image_inputs_from_the_forward(monkeypatch):
    """Video-LLaVA's images come as ``pixel_values_images`` and Aria's with a ``pixel_mask``:
    introspection had guessed ``pixel_values`` and no per-image input, so a contrast branch
    left them at the caller's batch size (a raw shape error inside the vision tower, or a
    distorted branch that never encoded its pixels). Now both are read from the forward's
    parameters (and named in the warning); VCD at alpha 0 gives the plain logits and
    tokens, and the distorted branch runs under generate()."""
    import hooks.points as points_module
    from hooks import adapters
    from mitigate import VCD, attach

    monkeypatch.setattr(points_module, "_WARNED", set())
    # Video-LLaVA has a table file since session 41 (pixel_values_images among its pixel
    # inputs); without it, introspection must find that name by itself
    monkeypatch.delitem(adapters._REGISTRY, "video_llava")
    clip = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, projection_dim=32,
                num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
    video = _unregistered("video_llava", text_config=_LLAMA, vision_config=clip, image_token_index=250,
                          video_token_index=251, image_seq_length=16, vision_feature_layer=-2)
    ids = torch.tensor([[1, 5, 6] + [250] * 16 + [7, 8]] * 2)
    video_inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                    "pixel_values_images": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))}
    aria = _unregistered(
        "aria", image_token_index=250, projector_patch_to_query_dict={16: 4}, max_value_projector_patch_to_query_dict=16,
        text_config=dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, moe_num_experts=2, moe_topk=1, moe_num_shared_experts=1,
                         max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(model_type="idefics3_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=8))
    ids = torch.tensor([[1, 5, 6] + [250] * 4 + [7, 8]] * 2)
    aria_inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": torch.randn(2, 3, 32, 32),
                   "pixel_mask": torch.ones(2, 32, 32, dtype=torch.bool)}
    for model, inputs, pixels, per_image in ((video, video_inputs, "pixel_values_images", None),
                                             (aria, aria_inputs, "pixel_values", "pixel_mask")):
        with pytest.warns(UserWarning, match=rf"pixel inputs \[.*'{pixels}'"):
            points = resolve(model)
        assert pixels in points.pixel_inputs and (per_image is None or per_image in points.adapter.image_inputs)
        with torch.no_grad():
            plain = model(**inputs).logits
            tokens = model.generate(**inputs, max_new_tokens=3, do_sample=False, pad_token_id=0)
        for distortion in ("no_image", "diffusion_noise"):
            with attach(model, VCD(alpha=0, distortion=distortion)), torch.no_grad():
                torch.testing.assert_close(model(**inputs).logits, plain, rtol=0, atol=1e-5)
                assert torch.equal(model.generate(**inputs, max_new_tokens=3, do_sample=False, pad_token_id=0), tokens)
        with attach(model, VCD()), torch.no_grad():
            model.generate(**inputs, max_new_tokens=3, do_sample=False, pad_token_id=0)


def test_introspection_says_what_it_found_instead_of_what_it_missed(monkeypatch):
    """A refusal names what was there: Mllama's cross-attention layers and LFM2-VL's
    convolution layers were refused as "could not find: self_attention", BLIP-2's Q-Former
    as "could not find: projector", with nothing to go on."""
    import hooks.points as points_module

    monkeypatch.setattr(points_module, "adapter_for_class", lambda m: None)
    model = build_tiny_model("llava")
    model.config.model_type = "mystery_vlm"
    layer = model.model.language_model.layers[1]
    layer.mixer = layer.self_attn
    del layer.self_attn
    with pytest.raises(HookPointError, match=r"decoder layer 1 \(LlamaDecoderLayer\) has none of .*its modules: "
                                             r"[^)]*mixer.*1 of 2 layers"):
        resolve(model)
    model = build_tiny_model("llava")
    model.config.model_type = "mystery_vlm"
    model.model.qformer = model.model.multi_modal_projector
    del model.model.multi_modal_projector
    with pytest.raises(HookPointError, match=r"could not find: projector\. Found: .*top-level modules: .*qformer"):
        resolve(model)
    model = build_tiny_model("llava")  # images as VQ tokens: no encoder whose features a projector maps
    model.config.model_type = "mystery_vlm"
    model.model.vqmodel = model.model.vision_tower
    del model.model.vision_tower
    with pytest.raises(HookPointError, match=r"No vision encoder was found.*VQ tokenizer.*top-level modules: .*vqmodel"):
        resolve(model)


def test_a_llava_checkpoint_on_a_pixtral_tower_resolves_to_its_variant_not_the_grid():
    """pixtral-12b is model_type "llava" with a Pixtral tower: its tokens follow each image's
    size, so the llava table's square grid would place a 16:9 image's 36 x 64 tokens as 48 x
    48 without a word. The table's ``vision_variants`` say what differs for that tower, and
    resolve() uses them (a CLIP-tower LLaVA keeps the grid); a tower a table refuses is
    refused by name; an adapter the caller passes is used as given; a variant that names a
    field no adapter has, or a tower both refused and varied, is refused as data."""
    import dataclasses

    from hooks import get_adapter
    from hooks.adapters import Adapter

    model = build_tiny_model("llava_pixtral")
    points = resolve(model)
    assert points.adapter.token_layout == "pixtral" and points.adapter.image_inputs == ("image_sizes",)
    assert "pixtral tower variant" in points.adapter.source and points.adapter.model_type == "llava"
    # its image tokens map to each image's own patch grid: 32 x 48 px at 8 px patches is 4 x 6
    inputs = tiny_inputs(model, batch_size=2)  # 32 x 48 and 48 x 40 px
    for row, (rows, cols) in enumerate([(4, 6), (6, 5)]):
        (region,) = points.token_regions(rows * cols, inputs, row)
        assert (region.rows, region.cols, region.stride) == (rows, cols, cols)
    assert resolve(build_tiny_model("llava")).adapter.token_layout == "grid"
    base = get_adapter("llava")
    refusing = dataclasses.replace(base, vision_variants={}, refused_vision_towers={"pixtral": "tokens follow image_sizes"})
    with pytest.raises(HookPointError, match="'llava' with a 'pixtral' vision tower.*image_sizes"):
        from hooks.adapters import _REGISTRY

        saved, _REGISTRY["llava"] = _REGISTRY["llava"], refusing
        try:
            resolve(model)
        finally:
            _REGISTRY["llava"] = saved
    mine = dataclasses.replace(get_adapter("mistral3"), model_type="llava")
    assert resolve(model, adapter=mine).adapter is mine
    data = {**base.to_dict(), "vision_variants": {"pixtral": {"token_layuot": "pixtral"}}}
    data.pop("source")
    with pytest.raises(ValueError, match="vision_variants must map vision model types to field overrides"):
        Adapter.from_dict(data)
    data["vision_variants"] = {"pixtral": {"token_layout": "pixtral"}}
    data["refused_vision_towers"] = {"pixtral": "no"}
    with pytest.raises(ValueError, match="both refused and a variant"):
        Adapter.from_dict(data)
