"""A tour of hooks/: resolve the points of a VLM, watch them fire, bias attention, clean up.

    python examples/hooks_tour.py                  # a tiny random LLaVA, no download
    python examples/hooks_tour.py --model tiny:qwen2_vl
"""

import argparse
import math

import torch

from hooks import HookGroup, add_attention_bias, hook_state, key_bias, resolve
from hooks.testing import build_tiny_model, tiny_inputs

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="tiny:llava", help="tiny:<model_type> (see `vlm-hooks inspect tiny:all`)")
args = parser.parse_args()

model = build_tiny_model(args.model.removeprefix("tiny:"))
inputs = tiny_inputs(model, batch_size=2, text_lengths=[6, 3])
points = resolve(model)
before = hook_state(model)

image = points.image_token_mask(inputs["input_ids"])
print(f"{points.model_type}: {points.num_layers} decoder layers, image tokens per row {image.sum(1).tolist()}")

with HookGroup() as group, torch.no_grad():
    points.add_hook(group, "projector.output", lambda m, a, k, out: print("image embeddings", tuple(out.shape)))
    plain = model(**inputs).logits[:, -1]
    # hide the image from the last two layers' attention: the answer must change
    add_attention_bias(group, points, key_bias(image, -math.inf), layers=[-2, -1])
    blind = model(**inputs).logits[:, -1]
print("next-token logits moved by", f"{(plain - blind).abs().max().item():.4f}", "when the image is hidden")
print("hook state restored:", hook_state(model) == before)
