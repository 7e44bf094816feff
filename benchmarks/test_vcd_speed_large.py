"""VCD cost at a real model's size, on a GPU: plain generate(), the two naive two-pass
references and ours, on a model of LLaVA-1.5-7B's shape with random weights in bf16.

    VLM_BENCH_DEVICE=cuda python -m pytest benchmarks/test_vcd_speed_large.py --benchmark-enable

``LlavaConfig()``'s defaults are LLaVA-1.5-7B's architecture (CLIP ViT-L/14 at 336 px:
576 image tokens; a 32-layer Llama decoder of width 4096); the vocabulary is LLaVA-1.5's
32064. No weights can be downloaded here and none are needed: the cost of a forward does
not depend on the weights' values, and ``min_new_tokens`` forces all 32 tokens. Batch 1
and 8, 32 new tokens, the same roles and pairing as ``test_vcd_speed.py`` (the organism's
benchmark). Skips unless ``VLM_BENCH_DEVICE`` names a CUDA device that is there: on a CPU
such a model is neither fast enough to time nor small enough for a laptop's memory.
"""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, device_type
from .test_vcd_speed import ROLES, time_role

pytestmark = pytest.mark.skipif(not (device_type(DEVICE) == "cuda" and torch.cuda.is_available()),
                                reason="a 7B-shaped model is timed on a GPU: VLM_BENCH_DEVICE=cuda")

VOCAB = 32064  # LLaVA-1.5's (32000 + the image token + padding to a multiple of 64)
IMAGE_TOKEN = 32000
TEXT_TOKENS = 24  # a short question after the image
# CLIP ViT-L/14 at 336 px, as LlavaConfig() builds it when given no vision config (a dict
# given instead starts from CLIP's own defaults: 224 px, ViT-B)
LLAVA_15_VISION = dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                       num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768)


def build_llava_shaped(device: str, dtype=torch.bfloat16, text_config: dict | None = None,
                       vision_config: dict | None = None):
    """A random-weight ``LlavaForConditionalGeneration`` of LLaVA-1.5-7B's shape (sizes in
    ``text_config`` / ``vision_config`` override it, for a smaller check of the plumbing)."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(text_config={"model_type": "llama", "vocab_size": VOCAB, **(text_config or {})},
                         vision_config={**LLAVA_15_VISION, **(vision_config or {})},
                         image_token_id=IMAGE_TOKEN)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlavaForConditionalGeneration._from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    return model


def llava_shaped_inputs(model, batch: int) -> dict:
    """BOS, LLaVA-1.5's 576 image tokens, a random question; random pixels."""
    vision = model.config.vision_config
    per_image = (vision.image_size // vision.patch_size) ** 2
    g = torch.Generator().manual_seed(batch)
    ids = torch.cat([torch.ones(batch, 1, dtype=torch.long), torch.full((batch, per_image), IMAGE_TOKEN),
                     torch.randint(3, IMAGE_TOKEN, (batch, TEXT_TOKENS), generator=g)], 1)
    pixels = torch.randn(batch, 3, vision.image_size, vision.image_size, generator=g)
    return {"input_ids": ids.to(model.device), "attention_mask": torch.ones_like(ids).to(model.device),
            "pixel_values": pixels.to(model.device, model.dtype)}


@pytest.fixture(scope="module")
def llava7b():
    model = build_llava_shaped(DEVICE)
    yield model
    del model
    torch.cuda.empty_cache()


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("role", ROLES)
def test_vcd_speed_llava7b_shape(benchmark, paired, llava7b, rounds, batch, role):
    time_role(benchmark, paired, rounds, llava7b, llava_shaped_inputs(llava7b, batch), role,
              f"vcd_llava7b_shape_batch{batch}")
