"""Crop-and-verify: re-ask about small objects on DO-Bench's Crop and Cluster views, cut
from the original image where the model's own attention points.

    python examples/crop_verify.py                # the shipped organism, no download
    python examples/crop_verify.py --locate zoom  # find the object on 2x2 tiles by its name
    python examples/crop_verify.py --model <hf id or path>

No ground truth is used at inference: by default the box comes from last-token attention
normalised by a generic prompt (ViCrop); ``--locate embedding`` / ``zoom`` read where the
image tokens look like the object's name (docs/report_organism.md, "Where the views are cut"); pass
``localizer=`` to plug in a detector instead.

Two ways to use it, with the same answers: ``CropVerify.answer(model, images, prompts)``,
which reports what each view said, and ``attach(model, CropVerify(processor))``, under
which the caller's own ``processor(...)`` + ``model.generate()`` (or a pipeline) verify
themselves. Multi-image "in which image is there an X?" questions (MIOH) go through
``answer_which_image``; with ``which_image="decompose"`` every unconfident answer is
re-derived from the images asked one by one (MIOH Sec. 5.5).
"""

import argparse

from evaluators.model import load_hf
from hooks.prompting import user_prompt
from evaluators.world import BIASED, World
from mitigate import CropVerify, attach

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="organism")
parser.add_argument("-n", type=int, default=6)
parser.add_argument("--question", default="is there a {object} in the image ? answer yes or no .")
parser.add_argument("--locate", default="attention", choices=["attention", "embedding", "zoom"])
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

cv = CropVerify(processor, tau=0.5, gate=0.9, margin=0.1, locate=args.locate)
for prompt, result in zip(prompts, cv.answer(model, images, prompts, max_new_tokens=3)):
    views = ", ".join(f"{v}: {r['answer']} (p_yes {r['p_yes']:.2f})" for v, r in result["views"].items())
    print(f"{prompt!r}: {result['first_answer']} -> {result['answer']}" + (f"   [{views}]" if views else ""))
print(f"stats: {cv.stats}  (truth: every object asked about is present)")

# the same through plain generate(): preprocess while attached, so the originals are known
verified = CropVerify(processor, tau=0.5, gate=0.9, margin=0.1, locate=args.locate)
with attach(model, verified):
    texts = [user_prompt(processor, p) for p in prompts]  # the chat template (PaliGemma: none)
    enc = processor(text=texts, images=[[im] for im in images], return_tensors="pt", padding=True).to(model.device)
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
answers = [t.strip() for t in processor.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)]
print(f"generate() under attach: {answers}  stats: {verified.stats}")

# multi-image "in which image is there an X?" questions (MIOH's built-in suite), answered
# image by image where the first answer is not confident
from evaluators.benchmarks.mioh.suite import build  # noqa: E402

multi = [q for q in build(n_per_condition=1, seed=0) if len(q.images) > 1 and q.record["qtype"] == "selective"
         and q.record["condition"] in ("easy", "NI")][:4]
decompose = CropVerify(processor, which_image="decompose", locate=args.locate)
for q, result in zip(multi, decompose.answer_which_image(model, [q.images for q in multi], [q.prompt for q in multi])):
    print(f"{len(q.images)} images, {q.prompt[:40]!r}...: {result['first_answer']} -> {result['answer']}"
          f" (truth: {q.truth})")
print(f"multi-image stats: {decompose.stats['which_image']}")
