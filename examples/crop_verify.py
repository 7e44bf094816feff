"""Crop-and-verify: re-ask about small objects on DO-Bench's Crop and Cluster views, cut
from the original image where the model's own attention points.

    python examples/crop_verify.py                # the shipped organism, no download
    python examples/crop_verify.py --model <hf id or path>

No ground truth is used at inference: the box comes from last-token attention normalised
by a generic prompt (ViCrop); pass ``localizer=`` to plug in a detector instead.
"""

import argparse

from evaluators.model import load_hf
from evaluators.world import BIASED, World
from mitigate import CropVerify

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="organism")
parser.add_argument("-n", type=int, default=6)
parser.add_argument("--question", default="is there a {object} in the image ? answer yes or no .")
args = parser.parse_args()

model, processor = load_hf(args.model)
world = World(BIASED)
images, prompts = [], []
for seed in range(10**9, 10**9 + 400):  # scenes with a small object that is there
    scene = world.scene(seed)
    small = [o for o in scene.objects if o.size < 0.1 * scene.resolution and scene.count(o.category) == 1]
    if small:
        images.append(scene.render())
        prompts.append(args.question.format(object=small[0].category))
    if len(images) == args.n:
        break

cv = CropVerify(processor, tau=0.5, gate=0.9, margin=0.1)
for prompt, result in zip(prompts, cv.answer(model, images, prompts, max_new_tokens=3)):
    views = ", ".join(f"{v}: {r['answer']} (p_yes {r['p_yes']:.2f})" for v, r in result["views"].items())
    print(f"{prompt!r}: {result['first_answer']} -> {result['answer']}" + (f"   [{views}]" if views else ""))
print(f"stats: {cv.stats}  (truth: every object asked about is present)")
