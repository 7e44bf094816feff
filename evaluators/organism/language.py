"""Language pretraining of the organism's decoder: answering questions about things named in context.

Real VLMs start from a pretrained language model that can already retrieve a fact named
earlier in its context (induction / associative-recall heads). The organism's decoder
starts from random weights, and reading the image is the same retrieval: find the image
token that matches the question's word. Measured on the organism (session 4, 4-layer
decoder, batch 32, lr 1e-3 / 5e-4):

* from scratch, existence over *oracle* image tokens (each object patch replaced by the
  decoder's own ``emb(colour) + emb(category)``, background zero) stayed at chance for
  900 steps, and over the real tokens for 600 steps (the yes/no loss at ln 2 per token);
* the same question over a short text list ("red cup blue fork") was learned in ~1,500
  steps (94% held out), but not with 40 uninformative tokens scattered around the list
  (57% after 2,000 steps);
* after the short lists, the scattered lists were learned in 100 steps (92%) and the
  circuit transferred: 77% on oracle image tokens after 200 steps, against chance.

So this stage trains the decoder (word embeddings frozen, see :func:`train.instruct`) on
text only, with a curriculum from short lists to lists spread over up to
:data:`MAX_FILLER` uninformative ``<unk>`` tokens -- standing for background patches. The
lists are drawn uniformly (every category and colour equally likely, no co-occurrence),
so this stage carries none of the biased world's statistics; the answers are always right.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..world import CATEGORIES, COLOURS
from .package import UNK_TOKEN
from .tasks import existence_question

#: Most uninformative tokens around the list at the end of the curriculum (the image has
#: 64 patches, most of them background).
MAX_FILLER = 48
#: Share of the steps on short lists before the filler starts to grow (organism v10's
#: recipe; ``train --language-short-share`` changes it). With 2100 steps the decoder spends
#: only the last 315 at the full length, and v15's log read 84.0 / 90.6% held-out there
#: (steps 2000 / 2099), while short lists were at 96% by step 500.
SHORT_SHARE = 0.7
MAX_OBJECTS = 4


def example(rng: np.random.Generator, filler: int) -> tuple[str, str]:
    """(prompt, answer): an existence question about a list of coloured objects, with up to
    ``filler`` filler tokens around the list.

    Only existence: the retrieval circuit it builds is what reading the image needs (the
    colour is read during instruction tuning). The first run of this stage, with 30%
    colour questions and a cosine-decayed rate, stayed at 48-58% held-out accuracy for
    1,500 steps; this one (existence only, constant rate) reached 95% in 500."""
    cats, cols = list(CATEGORIES), list(COLOURS)
    k = int(rng.integers(1, MAX_OBJECTS + 1))
    objects = [cats[int(i)] for i in rng.choice(len(cats), size=k, replace=False)]
    items = [f"{cols[int(rng.integers(len(cols)))]} {c}" for c in objects]
    n_fill = int(rng.integers(0, filler + 1)) if filler else 0
    context = [UNK_TOKEN] * n_fill
    for item, slot in zip(items, sorted(rng.integers(0, n_fill + 1, size=k))[::-1]):
        context.insert(int(slot), item)
    present = rng.random() < 0.5
    pool = objects if present else [c for c in cats if c not in objects]
    question = existence_question(pool[int(rng.integers(len(pool)))])
    return f"USER: {' '.join(context)} {question} ASSISTANT:", "yes" if present else "no"


def filler_at(step: int, steps: int, short_share: float = SHORT_SHARE) -> int:
    """The curriculum: no filler for the first ``short_share`` of the steps, then linear to the
    max over half of the rest, then the max."""
    if not 0.0 <= short_share < 1.0:
        raise ValueError(f"short_share must be in [0, 1), got {short_share!r}")
    start = int(short_share * steps)
    if step < start:
        return 0
    return int(round(MAX_FILLER * min(1.0, (step - start + 1) / max(1, (steps - start) // 2))))


def decoder_parameters(model) -> list:
    """The decoder's weights and the LM head, without the word embeddings (the projector is
    aligned to them, so every decoder-only stage keeps them fixed)."""
    return [p for n, p in model.named_parameters()
            if n.startswith(("model.language_model.", "lm_head.")) and "embed_tokens" not in n]


def train_decoder_only(model) -> list:
    """Freeze every weight but :func:`decoder_parameters`, which are returned trainable: the
    set-up of the decoder-only fine-tunes (stage 2c and the diagnostic probes)."""
    trainable = decoder_parameters(model)
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    return trainable


def pretrain_language(model, tokenizer, steps: int, batch: int, seed: int, log, lr: float = 1e-3,
                      short_share: float = SHORT_SHARE) -> None:
    """Train the decoder (not the embeddings, vision tower or projector) on :func:`example`,
    with the filler curriculum of :func:`filler_at`."""
    filler_at(0, steps, short_share)  # a bad share fails before any training
    trainable = decoder_parameters(model)
    opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)
    base = lr
    rng = np.random.default_rng([seed, 31])
    model.train()
    start = time.time()
    for step in range(steps):
        for g in opt.param_groups:  # constant after a short warm-up, as in the diagnosis runs that learned
            g["lr"] = base * min(1.0, (step + 1) / 100)
        filler = filler_at(step, steps, short_share)
        pairs = [example(rng, filler) for _ in range(batch)]
        texts = [f"{p} {a} {tokenizer.eos_token}" for p, a in pairs]
        enc = tokenizer(texts, return_tensors="pt", padding=True)
        labels = torch.full_like(enc["input_ids"], -100)
        labels[:, -2:] = enc["input_ids"][:, -2:]  # the one-word answer and </s> (left padding)
        loss = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        if step % 250 == 0 or step == steps - 1:
            log(f"language {step:5d} {time.time() - start:5.0f}s filler {filler:2d} "
                f"loss {loss.item():.3f} held-out accuracy {accuracy(model, tokenizer, filler):.3f}")


@torch.no_grad()
def accuracy(model, tokenizer, filler: int, n: int = 256) -> float:
    """Share of held-out examples whose answer is the argmax next token."""
    was = model.training
    model.eval()
    rng = np.random.default_rng(10**6)
    pairs = [example(rng, filler) for _ in range(n)]
    enc = tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True)
    pred = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, -1].argmax(-1)
    want = torch.tensor(tokenizer.convert_tokens_to_ids([a for _, a in pairs]))
    model.train(was)
    return (pred == want).float().mean().item()
