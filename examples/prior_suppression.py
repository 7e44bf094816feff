"""Prior-token suppression: a belief in the prompt ("I am certain there is no ...") should
not override what the image shows.

    python examples/prior_suppression.py          # the shipped organism
    python examples/prior_suppression.py --model <hf id or path>
"""

import argparse

import torch

from evaluators.model import load_hf
from hooks.prompting import user_prompt
from evaluators.organism.tasks import do_prior, existence_question
from evaluators.world import BIASED, World
from mitigate import PriorSuppression, attach

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="organism")
parser.add_argument("-n", type=int, default=6)
args = parser.parse_args()

model, processor = load_hf(args.model)
world = World(BIASED)
rows = []
for seed in range(10**9, 10**9 + 200):  # a large object that is there, and a prompt that denies it
    scene = world.scene(seed)
    big = [o for o in scene.objects if o.size > 0.15 * scene.resolution]
    if big:
        rows.append((scene.render(), existence_question(big[0].category, do_prior(3, big[0].category, True))))
    if len(rows) == args.n:
        break

prompts = [user_prompt(processor, q) for _, q in rows]  # the chat template (PaliGemma: none)
inputs = processor(text=prompts, images=[[img] for img, _ in rows], return_tensors="pt", padding=True)  # one list per prompt
print("prompt:", rows[0][1])

mitigation = PriorSuppression(processor.tokenizer, mode="context")
for name, active in (("plain", False), ("context suppression", True)):
    with torch.no_grad():
        if active:
            with attach(model, mitigation):
                out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
        else:
            out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    got = [a.strip() for a in processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)]
    print(f"{name:>20}: {got}  (right: {sum(a.startswith('yes') for a in got)}/{len(got)})")
print("suppressed spans:", [s.text for s in mitigation.found[0]])
