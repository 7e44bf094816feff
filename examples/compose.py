"""Mitigations compose: VCD and prior-token suppression (both modes) attached together,
then crop-and-verify on top -- all on the unmodified model, all removed on exit.

    python examples/compose.py                    # the shipped organism, no download
    python examples/compose.py --model <hf id or path>

The prompts carry DO-Bench's strongest prior ("i am certain there is no X in the image .")
about an object that *is* there; each row adds one mitigation.
"""

import argparse
import contextlib

import torch

from evaluators.model import load_hf
from evaluators.organism.tasks import do_prior, existence_question
from evaluators.world import BIASED, World
from hooks import hook_state
from mitigate import VCD, CropVerify, PriorSuppression, attach

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="organism")
parser.add_argument("-n", type=int, default=6)
args = parser.parse_args()

model, processor = load_hf(args.model)
world = World(BIASED)
images, prompts = [], []
for seed in range(10**9, 10**9 + 400):
    scene = world.scene(seed)
    objs = [o for o in scene.objects if scene.count(o.category) == 1]
    if objs:
        images.append(scene.render())
        prompts.append(existence_question(objs[0].category, do_prior(3, objs[0].category, negative=True)))
    if len(images) == args.n:
        break
verify = CropVerify(processor, tau=0.5, gate=0.9)

for name, make in (
    ("plain", lambda: []),
    ("prior suppression (context)", lambda: [PriorSuppression(processor.tokenizer, mode="context")]),
    ("+ output mode", lambda: [PriorSuppression(processor.tokenizer, mode="both")]),
    ("+ VCD", lambda: [PriorSuppression(processor.tokenizer, mode="both"), VCD()]),
):
    mitigations = make()
    with torch.no_grad(), (attach(model, *mitigations) if mitigations else contextlib.nullcontext()):
        answers = [r["answer"] for r in CropVerify(processor, tau=1.0).answer(model, images, prompts, max_new_tokens=3)]
        if name == "+ VCD":  # and crop-and-verify, re-asking under the same hooks
            verified = [r["answer"] for r in verify.answer(model, images, prompts, max_new_tokens=3)]
    if name == "plain":  # after a first call: transformers adds its own output-recording hooks then
        before = hook_state(model)
    print(f"{name:>30}: {answers}  (yes, the truth: {sum(a.startswith('yes') for a in answers)}/{len(answers)})")
print(f"{'+ crop-and-verify':>30}: {verified}  (yes: {sum(a.startswith('yes') for a in verified)}/{len(verified)}; "
      f"verified {verify.stats['verified']}, overturned {verify.stats['overturned']})")
assert hook_state(model) == before, "every hook removed"
