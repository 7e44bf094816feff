"""Train the model organism on CPU from the biased world (deterministic).

    python -m evaluators.organism.train                      # the recipe: 1500 + 3000 steps (37 min measured, 2 cores)
    python -m evaluators.organism.train --max-steps 300 --vision-steps 200 --out /tmp/organism   # a quick look

Two stages, as real VLMs are built (a prototype trained end to end from scratch learned
only the text priors for 25 minutes):

1. **Vision pretraining** on dense per-patch labels (the category and colour of the object
   covering each patch, or background), like starting from a pretrained CLIP; then the
   feature standardisation is folded into the projector (see :func:`standardise_projector`).
2. **Instruction tuning** of the whole LLaVA on the task mix of :mod:`.tasks`, loss on the
   answer tokens only. Each batch holds one task (so image counts match).

The answers are always the scenes' ground truth. The organism's hallucinations come from
:data:`evaluators.world.BIASED` and from belief prompts that are right most of the time.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..world import BIASED, CATEGORIES, COLOURS, World
from . import tasks
from .package import (
    ORGANISM_DIR, build_model_config, build_processor, build_tokenizer, format_prompt, save_organism,
)

IMAGE_SIZE, PATCH = 64, 8
GRID = IMAGE_SIZE // PATCH
CAT_IDS = {c: i + 1 for i, c in enumerate(CATEGORIES)}  # 0 = background
COL_IDS = {c: i + 1 for i, c in enumerate(COLOURS)}


def patch_labels(scene, min_cover: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """Per patch of the model input, the category / colour of the object covering most of it."""
    r = scene.resolution
    cell = r // GRID
    cats = np.zeros((GRID, GRID), dtype=np.int64)
    cols = np.zeros((GRID, GRID), dtype=np.int64)
    best = np.zeros((GRID, GRID))
    for obj in scene.objects:
        cover = scene.masks()[obj.uid].reshape(GRID, cell, GRID, cell).mean(axis=(1, 3))
        win = (cover > best) & (cover >= min_cover)
        cats[win], cols[win], best[win] = CAT_IDS[obj.category], COL_IDS[obj.colour], cover[win]
    return cats.reshape(-1), cols.reshape(-1)


def pretrain_vision(model, processor, world: World, steps: int, batch: int, seed: int, log) -> None:
    vision = model.model.vision_tower
    hidden = vision.config.hidden_size
    heads = nn.ModuleDict({"cat": nn.Linear(hidden, len(CAT_IDS) + 1), "col": nn.Linear(hidden, len(COL_IDS) + 1)})
    opt = torch.optim.AdamW(list(vision.parameters()) + list(heads.parameters()), lr=2e-3, weight_decay=0.01)
    vision.train()
    for step in range(steps):
        scenes = [world.scene(seed * 1_000_003 + step * batch + i) for i in range(batch)]
        pixels = processor.image_processor([s.render() for s in scenes], return_tensors="pt")["pixel_values"]
        labels = [patch_labels(s) for s in scenes]
        cat = torch.tensor(np.stack([c for c, _ in labels]))
        col = torch.tensor(np.stack([c for _, c in labels]))
        feats = vision(pixel_values=pixels).last_hidden_state[:, -GRID * GRID:]
        lc, lo = heads["cat"](feats), heads["col"](feats)
        # weight object patches up: most patches are background
        w = torch.where(cat > 0, 4.0, 1.0)
        loss = (nn.functional.cross_entropy(lc.transpose(1, 2), cat, reduction="none") * w).mean() + \
               (nn.functional.cross_entropy(lo.transpose(1, 2), col, reduction="none") * w).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            obj = cat > 0
            acc = (lc.argmax(-1)[obj] == cat[obj]).float().mean().item()
            log(f"vision {step:5d} loss {loss.item():.3f} object-patch acc {acc:.3f}")
    vision.eval()


@torch.no_grad()
def standardise_projector(model, processor, world: World, seed: int, n_images: int = 256) -> None:
    """Fold feature standardisation into the projector's first linear layer.

    The raw last-layer CLIP features LLaVA feeds its projector carry a large common
    component (here: std ~10 and ~1000x the text embeddings' norm after the projector),
    which drowns the differences between images and makes the decoder learn to ignore
    them -- the first training run did exactly that. ``W x + b`` on standardised features
    ``(x - mu) / sigma`` is the same layer as ``(W / sigma) x + (b - W mu / sigma)``, so
    the projector starts on a well-scaled input without changing the architecture (real
    LLaVA starts from a CLIP whose features are already well conditioned).
    """
    vision = model.model.vision_tower
    images = [world.scene(seed * 1_000_003 + 900_000 + i).render() for i in range(n_images)]
    pixels = processor.image_processor(images, return_tensors="pt")["pixel_values"]
    feats = torch.cat([vision(pixel_values=pixels[i : i + 64]).last_hidden_state for i in range(0, n_images, 64)])
    feats = feats.reshape(-1, feats.shape[-1])
    mu, sigma = feats.mean(0), feats.std(0).clamp(min=1e-3)
    linear = model.model.multi_modal_projector.linear_1
    linear.bias.sub_(linear.weight @ (mu / sigma))
    linear.weight.div_(sigma[None, :])


def make_batch(processor, examples: list[tasks.Example]):
    """Left-padded prompt+answer sequences with labels on the answer tokens (and </s>)."""
    tok = processor.tokenizer
    texts = [f"{format_prompt(ex.question, len(ex.images))} {ex.answer} {tok.eos_token}" for ex in examples]
    images = [img for ex in examples for img in ex.images]
    enc = processor(text=texts, images=images, return_tensors="pt", padding=True)
    labels = torch.full_like(enc["input_ids"], -100)
    for i, ex in enumerate(examples):
        n = len(tok(f"{ex.answer} {tok.eos_token}", add_special_tokens=False)["input_ids"])
        labels[i, -n:] = enc["input_ids"][i, -n:]
    enc["labels"] = labels
    return enc


def task_schedule(rng: np.random.Generator) -> str:
    names = list(tasks.MIX)
    p = np.array([tasks.MIX[n] for n in names])
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def instruct(model, processor, world: World, seconds: float, batch: int, seed: int, log, max_steps: int) -> int:
    vision_params = list(model.model.vision_tower.parameters())
    vision_ids = {id(p) for p in vision_params}
    rest = [p for p in model.parameters() if id(p) not in vision_ids]
    opt = torch.optim.AdamW([{"params": rest, "lr": 1.5e-3}, {"params": vision_params, "lr": 3e-4}], weight_decay=0.01)
    base = [g["lr"] for g in opt.param_groups]
    rng = np.random.default_rng([seed, 21])
    model.train()
    start, step, running = time.time(), 0, None
    # Time-budgeted cosine schedule: progress is measured in wall-clock seconds so the recipe
    # fits its budget on any machine; --max-steps pins the step count for reproducibility.
    while step < max_steps:
        progress = min(1.0, (time.time() - start) / seconds) if max_steps == math.inf else step / max_steps
        if progress >= 1.0:
            break
        warm = min(1.0, (step + 1) / 100)
        for g, b in zip(opt.param_groups, base):
            g["lr"] = b * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        task = task_schedule(rng)
        examples = [tasks.sample(world, seed * 7_000_003 + step * batch + i, task) for i in range(batch)]
        enc = make_batch(processor, examples)
        loss = model(**enc).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 100 == 0:
            log(f"instruct {step:6d} {time.time() - start:7.0f}s loss {running:.3f} ({task} {loss.item():.3f})")
        step += 1
    model.eval()
    return step


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ORGANISM_DIR)
    parser.add_argument("--max-steps", type=int, default=3000, help="stage 2 steps (0: use --minutes)")
    parser.add_argument("--minutes", type=float, default=36.0, help="wall-clock budget of stage 2 with --max-steps 0")
    parser.add_argument("--vision-steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    log_lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_lines.append(msg)

    world = World(BIASED)
    tokenizer = build_tokenizer(tasks.vocabulary())
    processor = build_processor(tokenizer, image_size=IMAGE_SIZE, patch_size=PATCH)
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration(build_model_config(len(tokenizer), image_size=IMAGE_SIZE, patch_size=PATCH))
    log(f"organism: {sum(p.numel() for p in model.parameters()):,} parameters, vocab {len(tokenizer)}")
    t0 = time.time()
    pretrain_vision(model, processor, world, args.vision_steps, 64, args.seed, log)
    log(f"vision pretraining: {time.time() - t0:.0f}s")
    standardise_projector(model, processor, world, args.seed)
    t1 = time.time()
    steps = instruct(model, processor, world, args.minutes * 60, args.batch, args.seed, log,
                     args.max_steps if args.max_steps else math.inf)
    log(f"instruction tuning: {steps} steps, {time.time() - t1:.0f}s")
    path = save_organism(model, processor, args.out)
    (Path(path) / "training.json").write_text(json.dumps({
        "parameters": sum(p.numel() for p in model.parameters()),
        "seed": args.seed, "vision_steps": args.vision_steps, "instruct_steps": steps, "batch": args.batch,
        "minutes_budget": args.minutes, "threads": args.threads, "world": "evaluators.world.BIASED",
        "mix": tasks.MIX, "belief_reliability": {str(k): v for k, v in tasks.BELIEF_RELIABILITY.items()},
        "seconds": {"vision": round(t1 - t0), "instruct": round(time.time() - t1)},
    }, indent=2))
    log(f"saved to {path}")


if __name__ == "__main__":
    main()
