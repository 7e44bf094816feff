"""The organism's packaging: tokenizer, processor, config, and the standard HF entry points.

A randomly initialised organism stands in for the trained one: these tests check the
plumbing (save/load round trip, image-token counts, batched generation, pipeline), not
what the model says.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, LlavaForConditionalGeneration, pipeline

from evaluators.organism import (
    LABELLED_CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    build_model_config,
    build_processor,
    build_tokenizer,
    chat_prompt,
    format_prompt,
    load_organism,
    num_image_tokens,
    save_organism,
)

WORDS = ["is", "there", "a", "red", "blue", "dog", "cat", "?", ".", "yes", "no", "image", "do", "not"]
WORDS += [f"<c{i}>" for i in range(16)]
N_IMAGE_TOKENS = num_image_tokens(32, 4)  # 8x8 patches + CLS ("full" strategy)


def _image(width: int, height: int, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _chat(question: str, n_images: int = 1, images: list | None = None) -> list[dict]:
    content = [{"type": "image", **({"image": images[i]} if images else {})} for i in range(n_images)]
    return [{"role": "user", "content": [*content, {"type": "text", "text": question}]}]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(WORDS)


@pytest.fixture(scope="module")
def organism(tmp_path_factory):
    """(model, processor, saved path) for a seeded random organism."""
    processor = build_processor(build_tokenizer(WORDS))
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(build_model_config(len(processor.tokenizer))).eval()
    path = save_organism(model, processor, tmp_path_factory.mktemp("organism"))
    return model, processor, path


# --- tokenizer --------------------------------------------------------------------------


def test_special_token_ids(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert tokenizer.image_token_id == 4


def test_round_trip_with_bos_and_punctuation_split(tokenizer):
    ids = tokenizer.encode("Is there a RED dog?")
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.convert_ids_to_tokens(ids[1:]) == ["is", "there", "a", "red", "dog", "?"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "is there a red dog?"
    assert tokenizer.tokenize("image.") == ["image", "."]
    assert tokenizer.decode(tokenizer.encode("no. do not", add_special_tokens=False)) == "no. do not"


def test_coordinate_tokens_are_single_ids(tokenizer):
    tokens = tokenizer.tokenize("dog <c12> <c1><c15>")
    assert tokens == ["dog", "<c12>", "<c1>", "<c15>"]
    assert all(tokenizer.convert_tokens_to_ids(t) != tokenizer.unk_token_id for t in tokens)
    ids = tokenizer.encode("a <c0> dog", add_special_tokens=False)
    assert tokenizer.decode(ids) == "a <c0> dog"


def test_unknown_word_maps_to_unk(tokenizer):
    assert tokenizer.encode("zebra", add_special_tokens=False) == [tokenizer.unk_token_id]


def test_words_are_lowercased_deduplicated_and_validated():
    tok = build_tokenizer(["Dog", "dog", "cat"])
    assert len(tok) == len(SPECIAL_TOKENS) + 3 + 2  # specials, user/assistant/":", dog, cat
    with pytest.raises(ValueError, match="don't"):
        build_tokenizer(["don't"])


def test_left_padding(tokenizer):
    batch = tokenizer(["is there", "is there a red dog?"], padding=True, return_tensors="pt")
    assert batch.input_ids[0, :4].tolist() == [tokenizer.pad_token_id] * 4
    assert batch.attention_mask[0].tolist() == [0, 0, 0, 0, 1, 1, 1]


# --- prompt format ----------------------------------------------------------------------


def test_chat_template_matches_format_prompt(organism):
    _, processor, _ = organism
    for n in (0, 1, 2):
        rendered = processor.apply_chat_template(_chat("is there a dog?", n), add_generation_prompt=True)
        assert rendered == format_prompt("is there a dog?", n) == chat_prompt(processor, "is there a dog?", n)
    assert format_prompt("is there a dog?", 2) == "USER: <image> <image> is there a dog? ASSISTANT:"


def test_labelled_chat_template_matches_format_prompt(organism):
    """The labelled template (``train --image-labels``) labels two or more images and leaves
    a single image, or none, exactly as the plain one."""
    _, processor, _ = organism
    for n in (0, 1, 2, 3, 4):
        rendered = processor.apply_chat_template(_chat("is there a dog?", n), add_generation_prompt=True,
                                                 chat_template=LABELLED_CHAT_TEMPLATE)
        assert rendered == format_prompt("is there a dog?", n, image_labels=True)
        if n < 2:
            assert rendered == format_prompt("is there a dog?", n)
    assert format_prompt("q ?", 3, image_labels=True) == "USER: image 1 <image> image 2 <image> image 3 <image> q ? ASSISTANT:"
    labelled = build_processor(build_tokenizer(["dog"], image_labels=True), image_labels=True)
    assert labelled.chat_template == LABELLED_CHAT_TEMPLATE == labelled.tokenizer.chat_template


def test_chat_template_multi_turn_and_bad_role(organism):
    _, processor, _ = organism
    messages = _chat("is there a dog?") + [
        {"role": "assistant", "content": [{"type": "text", "text": "yes"}]},
        {"role": "user", "content": [{"type": "text", "text": "is there a cat?"}]},
    ]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert rendered == "USER: <image> is there a dog? ASSISTANT: yes </s> USER: is there a cat? ASSISTANT:"
    with pytest.raises(Exception, match="system"):
        processor.apply_chat_template([{"role": "system", "content": "be nice"}, *messages])


# --- processor and model ----------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[(200, 150)], [(200, 150), (128, 128)]])
def test_processor_images_and_token_expansion(organism, sizes):
    model, processor, _ = organism
    images = [_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    inputs = processor(images=images, text=format_prompt("is there a dog?", len(images)), return_tensors="pt")
    assert inputs.pixel_values.shape == (len(images), 3, 32, 32)
    assert inputs.pixel_values.min() >= -1 and inputs.pixel_values.max() <= 1
    assert (inputs.input_ids == SPECIAL_TOKENS["<image>"]).sum() == len(images) * N_IMAGE_TOKENS
    assert inputs.input_ids[0, 0] == SPECIAL_TOKENS["<s>"]
    features = model.get_image_features(pixel_values=inputs.pixel_values).pooler_output
    assert [f.shape[0] for f in features] == [N_IMAGE_TOKENS] * len(images)
    with torch.no_grad():
        logits = model(**inputs).logits  # the model checks tokens == features itself
    assert logits.shape == (*inputs.input_ids.shape, len(processor.tokenizer))


def test_save_load_round_trip(organism):
    model, processor, path = organism
    inputs = processor(images=[_image(200, 150)], text=format_prompt("is there a red dog?"), return_tensors="pt")
    reloaded = AutoModelForImageTextToText.from_pretrained(path).eval()
    reprocessor = AutoProcessor.from_pretrained(path)
    assert type(reloaded) is LlavaForConditionalGeneration
    assert reprocessor.chat_template == processor.chat_template
    reinputs = reprocessor(images=[_image(200, 150)], text=format_prompt("is there a red dog?"), return_tensors="pt")
    assert all(torch.equal(inputs[k], reinputs[k]) for k in inputs)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, reloaded(**reinputs).logits)
        loaded_model, _ = load_organism(path)
        torch.testing.assert_close(loaded_model(**inputs).logits, model(**inputs).logits)


def test_checkpoint_is_small(organism):
    model, _, path = organism
    n_params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 < n_params < 5_000_000
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert (path / "model.safetensors").stat().st_size < 20 * 2**20
    assert sum(f.stat().st_size for f in path.iterdir()) < 20 * 2**20


def test_missing_checkpoint_says_how_to_train(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m evaluators.organism.train"):
        load_organism(tmp_path / "nowhere")


def test_batched_generation_with_left_padding(organism):
    model, processor, _ = organism
    texts = [format_prompt("is there a red dog?"), format_prompt("dog?")]
    images = [_image(200, 150, seed=1), _image(128, 128, seed=2)]
    batch = processor(images=images, text=texts, padding=True, return_tensors="pt")
    assert batch.attention_mask[1, 0] == 0 and batch.attention_mask[:, -1].all()  # left padded
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=5, do_sample=False)
        assert out.shape[0] == 2 and 1 <= out.shape[1] - batch.input_ids.shape[1] <= 5
        assert torch.equal(out[:, : batch.input_ids.shape[1]], batch.input_ids)
        # the padded row predicts what it predicts alone
        alone = processor(images=images[1:], text=texts[1:], return_tensors="pt")
        torch.testing.assert_close(model(**batch).logits[1, -1], model(**alone).logits[0, -1], atol=1e-4, rtol=1e-4)


def test_image_text_to_text_pipeline(organism):
    model, processor, _ = organism
    pipe = pipeline("image-text-to-text", model=model, processor=processor)
    result = pipe(text=_chat("is there a dog?", images=[_image(200, 150)]), max_new_tokens=5, return_full_text=False)
    assert isinstance(result[0]["generated_text"], str)
