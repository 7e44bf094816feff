"""Visual contrastive decoding on a VLM with plain generate().

    python examples/vcd.py                        # the shipped organism, no download
    python examples/vcd.py --model llava-hf/llava-1.5-7b-hf

Asks a few co-occurrence probes (a knife without its fork) with and without VCD, and with
the plausibility constraint alone -- the control that matters for contrastive decoding.
"""

import argparse

import torch

from evaluators.model import load_hf
from hooks.prompting import user_prompt
from evaluators.world import BIASED, World, edits
from mitigate import VCD, Plausibility, attach

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="organism", help="'organism' or an HF model id / path")
parser.add_argument("-n", type=int, default=6)
args = parser.parse_args()

model, processor = load_hf(args.model)
world = World(BIASED)
images, seed = [], 10**9
while len(images) < args.n:  # scenes with a knife and no fork: the fork is expected, not there
    seed += 1
    scene = world.scene(seed)
    if scene.present("knife"):
        images.append((edits.remove_category(scene, "fork") if scene.present("fork") else scene).render())

prompt = user_prompt(processor, "is there a fork in the image ? answer yes or no .")  # the chat template
inputs = processor(text=[prompt] * len(images), images=[[im] for im in images], return_tensors="pt", padding=True)


YES = [i for w in ("yes", "Yes", " yes", " Yes") for i in [processor.tokenizer(w, add_special_tokens=False)["input_ids"]]
       if len(i) == 1]


def answers(*mitigations):
    """The answers, and the mean probability of "yes" at the first step (the distribution
    generate() decoded from: VCD's combined logits under VCD)."""
    kw = dict(max_new_tokens=3, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        if mitigations:
            with attach(model, *mitigations):
                out = model.generate(**inputs, **kw)
        else:
            out = model.generate(**inputs, **kw)
    texts = processor.batch_decode(out.sequences[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    p_yes = torch.softmax(out.scores[0].float(), -1)[:, sorted({i[0] for i in YES})].sum(-1).mean()
    return [a.strip() for a in texts], float(p_yes)


for name, mitigations in (("plain", ()), ("plausibility only", (Plausibility(0.1),)), ("VCD", (VCD(),))):
    got, p_yes = answers(*mitigations)
    print(f"{name:>18}: {got}  (false yes: {sum(a.lower().startswith('yes') for a in got)}/{len(got)}, "
          f"mean p(yes) {p_yes:.2f})")
print("The fork is absent from every image: each 'yes' is the knife -> fork co-occurrence prior. A contrast can\n"
      "move p(yes) either way (arXiv 2504.10020 found VCD shifting answers towards 'yes'); `vlm-report` measures\n"
      "VCD per mechanism against greedy, sampling and the plausibility constraint alone.")
