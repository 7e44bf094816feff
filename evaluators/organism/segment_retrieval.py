"""Can the organism's decoder learn "in which image is there an X?" -- in text? (issue 3; bears on issue 5)

    python -m evaluators.organism.segment_retrieval --labels --curriculum --steps 1500
    python -m evaluators.organism.segment_retrieval --curriculum --steps 1500       # no labels
    python -m evaluators.organism.segment_retrieval --labels --steps 600            # no curriculum

v17 answers its own ``which_image`` training template no better than a constant answer
(``docs/results/organism_skills.md``). Reading the images is not the obstacle (it answers
each image's existence question), so this isolates the step the multi-image choice adds:
binding an object to the segment it sits in. It fine-tunes a copy of a checkpoint's decoder
(:func:`language.train_decoder_only`: word embeddings, vision tower and projector frozen,
as in stage 2b) on text only, in the multi-image question's own words, with each "image" a
list of coloured objects (stage 2b's stand-in for image tokens)::

    USER: image 1 red cup blue fork image 2 green dog in which image is there a dog ?
    a ) image 1 b ) image 2 c ) none of the above ASSISTANT: b

* ``--labels`` writes ``image N`` before each list; without it the lists come back to back,
  as the organism's chat template puts images (``<image> <image>``);
* ``--curriculum``: the first 30% of the steps on two one-object lists, the next 30% on two
  lists of 1-3 objects, the rest on the full form (2-4 lists of 1-3 objects, as
  ``tasks.which_image`` has 2-4 images); without it, the full form throughout.

The target is present in one list 80% of the time, else "none of the above" (as in
``tasks.which_image``). Every ``--every`` steps it prints the held-out accuracy (the argmax
next token, 256 questions from a fixed seed) on the current stage's form and on the full
form. Nothing is saved.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ..world import CATEGORIES, COLOURS
from .language import train_decoder_only
from .tasks import OPTION_LETTERS

#: (most lists, most objects per list) of the full form: ``tasks.which_image``'s 2-4 images.
FULL = (4, 3)
#: The curriculum: (share of the steps where the stage ends, (most lists, most objects)).
CURRICULUM = ((0.3, (2, 1)), (0.6, (2, 3)), (1.0, FULL))


def example(rng: np.random.Generator, form: tuple[int, int], labels: bool) -> tuple[str, str]:
    """(prompt, answer letter) of one question with 2..``form[0]`` lists of 1..``form[1]`` objects."""
    most_lists, most_objects = form
    n = int(rng.integers(2, most_lists + 1))
    cats, colours = list(CATEGORIES), list(COLOURS)
    target = cats[int(rng.integers(len(cats)))]
    where = int(rng.integers(n)) if rng.random() < 0.8 else None
    others = [c for c in cats if c != target]
    words = []
    for i in range(n):
        k = int(rng.integers(1, most_objects + 1))
        objects = [others[int(j)] for j in rng.choice(len(others), size=k, replace=False)]
        if i == where:
            objects[int(rng.integers(k))] = target
        words += (["image", str(i + 1)] if labels else []) + [f"{colours[int(rng.integers(len(colours)))]} {c}"
                                                               for c in objects]
    options = " ".join(f"{OPTION_LETTERS[i]} ) image {i + 1}" for i in range(n))
    question = f"in which image is there a {target} ? {options} {OPTION_LETTERS[n]} ) none of the above"
    return f"USER: {' '.join(words)} {question} ASSISTANT:", OPTION_LETTERS[n if where is None else where]


def form_at(step: int, steps: int, curriculum: bool) -> tuple[int, int]:
    """The form of ``step``: the curriculum's stage, or the full form."""
    if not curriculum:
        return FULL
    return next(form for end, form in CURRICULUM if step < end * steps)


@torch.no_grad()
def accuracy(model, tokenizer, form: tuple[int, int], labels: bool, n: int = 256) -> float:
    """Held-out accuracy (%) of the argmax next token on ``n`` questions of ``form``."""
    was = model.training
    model.eval()
    rng = np.random.default_rng(10**6)
    pairs = [example(rng, form, labels) for _ in range(n)]
    enc = tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True)
    pred = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, -1].argmax(-1)
    want = torch.tensor(tokenizer.convert_tokens_to_ids([a for _, a in pairs]))
    model.train(was)
    return 100.0 * (pred == want).float().mean().item()


def run(model, tokenizer, steps: int, labels: bool, curriculum: bool, lr: float = 1e-3, batch: int = 32,
        every: int = 100, seed: int = 0, log=print) -> list[dict]:
    """Fine-tune ``model``'s decoder in place; returns the held-out figures at each report."""
    if steps < 1 or every < 1:
        raise ValueError(f"steps and every must be >= 1, got {steps} and {every}")
    trainable = train_decoder_only(model)
    opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)
    rng = np.random.default_rng([seed, 41])
    rows = [{"step": 0, "form": form_at(0, steps, curriculum), "stage": accuracy(model, tokenizer, form_at(0, steps, curriculum), labels),
             "full": accuracy(model, tokenizer, FULL, labels)}]
    log(rows[-1])
    model.train()
    start = time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 50)
        form = form_at(step, steps, curriculum)
        pairs = [example(rng, form, labels) for _ in range(batch)]
        enc = tokenizer([f"{p} {a} {tokenizer.eos_token}" for p, a in pairs], return_tensors="pt", padding=True)
        target = torch.full_like(enc["input_ids"], -100)
        target[:, -2:] = enc["input_ids"][:, -2:]  # the answer letter and </s> (left padding)
        loss = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=target).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            rows.append({"step": step + 1, "seconds": round(time.time() - start), "form": form,
                         "loss": round(loss.item(), 3), "stage": accuracy(model, tokenizer, form, labels),
                         "full": accuracy(model, tokenizer, FULL, labels)})
            log(rows[-1])
    model.eval()
    return rows


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default=None, help="checkpoint folder (default: the shipped organism)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--labels", action="store_true", help="write 'image N' before each list")
    parser.add_argument("--curriculum", action="store_true", help="two short lists first (CURRICULUM)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, processor = load_organism(args.path)
    run(model, processor.tokenizer, args.steps, args.labels, args.curriculum, lr=args.lr, every=args.every)


if __name__ == "__main__":
    main()
