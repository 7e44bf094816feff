"""ViCrop's generic-prompt map at a real model's image-token count: a forward of its own
against a read over the first answer's KV cache (:mod:`mitigate.localize_prefix`).

    python -m pytest benchmarks/test_localize_speed.py --benchmark-enable

The organism has 65 image tokens, so there the generic row was never the main cost. A
LLaVA-1.5 image is 576 tokens (336 px, patch 14) and its decoder has 32 layers; the cost of
this step grows with both. The model here is random (cost depends on shapes, not weights):
LLaVA-1.5's image geometry and vocabulary size on a narrow 8-layer decoder, so that a round
takes a fraction of a second on 2 CPU cores. Four queries; ``layers`` are
:func:`mitigate.localize.default_layers` (ViCrop's middle layers).

Roles: ``baseline`` = :func:`mitigate.localize.image_attention_maps` over the generic rows
(the vision tower and the decoder up to the last captured layer, which is what the fallback
runs); ``from_cache`` = :func:`mitigate.localize_prefix.generic_maps_from_cache`. Both
return the same maps (asserted here, and across architectures in ``tests/``).
"""

from __future__ import annotations

import pytest
import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

from hooks.cache import output_cache
from mitigate.localize import image_attention_maps
from mitigate.localize_prefix import generic_maps_from_cache

IMAGE_TOKEN, BOS, PAD = 31999, 1, 0
ROWS, QUESTION, GENERIC = 4, 14, 9


@pytest.fixture(scope="module")
def llava_shaped():
    torch.set_num_threads(2)
    vision = CLIPVisionConfig(image_size=336, patch_size=14, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=2)
    text = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=8,
                       num_attention_heads=8, num_key_value_heads=8, pad_token_id=PAD, bos_token_id=BOS)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN,
                         vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(1)
    n_image = (336 // 14) ** 2  # "default" drops CLS: 576 image tokens
    opening = torch.randint(100, 30000, (3,), generator=g).tolist()
    generic_text = torch.randint(100, 30000, (GENERIC,), generator=g).tolist()
    rows, generic_rows = [], []
    for _ in range(ROWS):
        question = torch.randint(100, 30000, (QUESTION,), generator=g).tolist()
        prefix = [BOS, *opening, *[IMAGE_TOKEN] * n_image]
        rows.append(prefix + question)
        generic_rows.append(prefix + generic_text)
    pixels = torch.randn(ROWS, 3, 336, 336, generator=g)
    inputs = {"input_ids": torch.tensor(rows), "attention_mask": torch.ones(ROWS, len(rows[0]), dtype=torch.long),
              "pixel_values": pixels}
    generic = {"input_ids": torch.tensor(generic_rows),
               "attention_mask": torch.ones(ROWS, len(generic_rows[0]), dtype=torch.long), "pixel_values": pixels}
    with torch.no_grad():
        cache = output_cache(model.generate(**inputs, max_new_tokens=1, do_sample=False, return_dict_in_generate=True))
    return model, inputs, generic, cache


@pytest.mark.parametrize("role", ["baseline", "from_cache"])
def test_generic_map_speed(benchmark, rounds, llava_shaped, role):
    model, inputs, generic, cache = llava_shaped
    rows = list(range(ROWS))
    full = lambda: image_attention_maps(model, generic)  # noqa: E731
    cached = lambda: generic_maps_from_cache(model, cache, inputs, rows, generic)  # noqa: E731
    got, want = cached(), full()
    assert got is not None and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
    benchmark.group = "generic_map_576_image_tokens"
    benchmark.extra_info.update(role=role)
    benchmark.pedantic(full if role == "baseline" else cached, rounds=rounds, warmup_rounds=1)
