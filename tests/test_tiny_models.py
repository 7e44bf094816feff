"""Tiny random-weight VLMs: they build, run forward/generate, and their inputs line up with the vision path."""

from __future__ import annotations

import pytest
import torch

from hooks.adapters import get_adapter
from hooks.testing import (
    PIXEL_LAYOUTS, TINY_MODEL_TYPES, build_tiny_model, tiny_adapter, tiny_config, tiny_inputs, tiny_pixel_input_names,
    tiny_spec, tiny_spec_name,
)

EXPECTED = {
    "llava", "llava_next", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
    "idefics3", "smolvlm", "paligemma", "gemma3", "mistral3", "internvl", "glm4v", "glm46v", "qwen3_5", "gemma4", "aya_vision",
    "qwen3_5_moe", "qwen3_vl_moe", "glm4v_moe", "vipllava", "llava_next_video", "video_llava", "llava_pixtral",
}  # fmt: skip
BATCHES = {"single": (1, None), "padded": (3, [3, 9, 5])}
TOKEN_TYPE_NAMES = ("token_type_ids", "mm_token_type_ids")


def _image_vector_count(model, inputs) -> int:
    """Vectors returned by the model's own vision path (the call generate() makes)."""
    encoder = model.base_model.get_image_features
    names = tiny_pixel_input_names(tiny_spec_name(model.config))
    with torch.no_grad():
        pooled = encoder(**{name: inputs[name] for name in names}, return_dict=True).pooler_output
    units = list(pooled) if isinstance(pooled, torch.Tensor) else pooled
    return sum(unit.numel() // unit.shape[-1] for unit in units)


def _forward_capturing_text_embeds(model, inputs):
    """Run forward; also return the ``inputs_embeds`` the language model received."""
    language_model = model.get_submodule(get_adapter(model.config.model_type).language_model)
    seen = {}

    def record(module, args, kwargs):
        seen["embeds"] = kwargs["inputs_embeds"]

    handle = language_model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            output = model(**inputs)
    finally:
        handle.remove()
    return output, seen["embeds"]


def test_registry():
    assert TINY_MODEL_TYPES and set(TINY_MODEL_TYPES) <= EXPECTED
    for model_type in TINY_MODEL_TYPES:
        assert tiny_spec(model_type)["inputs"]["pixel_layout"] in PIXEL_LAYOUTS
    with pytest.raises(ValueError, match="not_a_vlm.*llava"):
        tiny_config("not_a_vlm")


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_build(model_type):
    model = build_tiny_model(model_type)
    assert 40_000 <= model.num_parameters() < 500_000
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.config.image_token_id == tiny_spec(model_type)["config"].get(
        "image_token_id", tiny_spec(model_type)["config"].get("image_token_index")
    )
    for path in (tiny_adapter(model_type).vision_encoder, tiny_adapter(model_type).projector, tiny_adapter(model_type).language_model):
        model.get_submodule(path)  # raises if the recorded module path is wrong

    same = build_tiny_model(model_type, attn_implementation="eager")
    other = build_tiny_model(model_type, seed=1)
    state, same_state, other_state = model.state_dict(), same.state_dict(), other.state_dict()
    assert all(torch.equal(state[k], same_state[k]) for k in state)
    assert not all(torch.equal(state[k], other_state[k]) for k in state)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_forward(model_type, attn, batch):
    model = build_tiny_model(model_type, attn_implementation=attn)
    assert model.config._attn_implementation == attn
    batch_size, text_lengths = BATCHES[batch]
    inputs = tiny_inputs(model, batch_size=batch_size, text_lengths=text_lengths)
    assert set(tiny_pixel_input_names(model_type)) <= set(inputs)

    ids, mask = inputs["input_ids"], inputs["attention_mask"].bool()
    image_id = model.config.image_token_id
    pad_id = model.config.get_text_config().pad_token_id
    assert (ids[~mask] == pad_id).all()
    lengths = mask.sum(1)
    assert mask.flip(1).cummin(1).values.sum(1).equal(lengths), "padding must be on the left"
    if text_lengths:
        assert len(set(lengths.tolist())) > 1
    text_config = model.config.get_text_config()
    eos = text_config.eos_token_id if isinstance(text_config.eos_token_id, list) else [text_config.eos_token_id]
    forbidden = {pad_id, *eos, getattr(model.config, "video_token_id", None)} - {None}
    assert not torch.isin(ids[mask], torch.tensor(sorted(forbidden))).any(), "text ids must avoid special ids"

    output, embeds = _forward_capturing_text_embeds(model, inputs)
    assert output.logits.shape == (*ids.shape, model.config.get_text_config().vocab_size)
    assert torch.isfinite(output.logits).all()

    is_image = ids == image_id
    assert is_image.sum(1).min() > 0
    assert is_image.sum() == _image_vector_count(model, inputs)
    replaced = (embeds != model.get_input_embeddings()(ids)).any(-1)
    assert replaced.equal(is_image), "image features must land on exactly the image-token positions"


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_generate(model_type):
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=3, text_lengths=[3, 9, 5])
    vision = model.get_submodule(tiny_adapter(model_type).vision_encoder)
    calls = []
    handle = vision.register_forward_hook(lambda *args: calls.append(1))
    try:
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    finally:
        handle.remove()
    seq = inputs["input_ids"].shape[1]
    assert seq < out.shape[1] <= seq + 3
    assert out[:, :seq].equal(inputs["input_ids"])
    assert len(calls) == 1, "images are encoded once, before the decoding loop"


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_sdpa_matches_eager(model_type):
    sdpa = build_tiny_model(model_type, attn_implementation="sdpa")
    eager = build_tiny_model(model_type, attn_implementation="eager")
    inputs = tiny_inputs(sdpa)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(**inputs).logits, eager(**inputs).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("images_per_sample", [0, 2])
@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_images_per_sample(model_type, images_per_sample):
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[2, 5], images_per_sample=images_per_sample)
    is_image = inputs["input_ids"] == model.config.image_token_id
    if images_per_sample:
        assert is_image.sum() == _image_vector_count(model, inputs)
    else:
        assert not is_image.any() and not set(tiny_pixel_input_names(model_type)) & set(inputs)
    with torch.no_grad():
        assert torch.isfinite(model(**inputs).logits).all()


@pytest.mark.parametrize(
    "model_type", [t for t in TINY_MODEL_TYPES if "token_types" in tiny_spec(t)["inputs"]]
)
def test_token_types_matter(model_type):
    """Dropping the family's token-type input raises or changes logits under sdpa or eager.

    Qwen2-VL / Qwen3-VL raise; Qwen2.5-VL silently falls back to 1-D RoPE; Gemma3 loses
    bidirectional image blocks; PaliGemma changes under eager only (its sdpa pass is already
    fully bidirectional without a mask).
    """
    inputs = tiny_inputs(build_tiny_model(model_type))
    bare = {k: v for k, v in inputs.items() if k not in TOKEN_TYPE_NAMES}
    changed = []
    for attn in ("sdpa", "eager"):
        model = build_tiny_model(model_type, attn_implementation=attn)
        with torch.no_grad():
            full = model(**inputs).logits
            try:
                changed.append(not torch.allclose(model(**bare).logits, full, atol=1e-5))
            except ValueError:
                changed.append(True)
    assert any(changed)


@pytest.mark.parametrize("model_type", [t for t in TINY_MODEL_TYPES if tiny_adapter(t).multimodal_rope])
def test_multimodal_rope_families_use_it(model_type):
    """A 2x3 merged grid spans max(2, 3) = 3 positions for 6 tokens: rope_deltas < 0 proves M-RoPE ran."""
    model = build_tiny_model(model_type)
    with torch.no_grad():
        model(**tiny_inputs(model, batch_size=3, text_lengths=[3, 9, 5]))
    assert (model.model.rope_deltas < 0).all()
