"""Prior-token suppression cost on the organism: plain generate() vs context mode (the
attention bias on detected belief spans), context mode with compact_positions (plus a
position shift before the decoder) and output mode (an image-free branch).

    python -m pytest benchmarks/test_prior_speed.py --benchmark-enable
"""

from __future__ import annotations

import pytest
import torch

from evaluators.organism.package import format_prompt
from evaluators.organism.tasks import do_prior, existence_question
from evaluators.world import BIASED, World
from mitigate import PriorSuppression, attach

NEW_TOKENS = 32


def _inputs(processor, batch, device="cpu"):
    world = World(BIASED)
    images = [world.scene(10**9 + i).render() for i in range(batch)]
    texts = [format_prompt(existence_question("dog", do_prior(3, "dog", True))) for _ in range(batch)]
    return processor(text=texts, images=images, return_tensors="pt", padding=True).to(device)


def _run(model, inputs):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("mode", ["plain", "context", "compact", "output"])
def test_prior_suppression_speed(benchmark, paired, organism, rounds, batch, mode):
    model, processor = organism
    inputs = _inputs(processor, batch, model.device)
    benchmark.group = f"prior_batch{batch}"
    benchmark.extra_info.update(role="baseline" if mode == "plain" else mode, tokens=batch * NEW_TOKENS)
    if mode == "plain":
        out = benchmark.pedantic(_run, args=(model, inputs), rounds=rounds, warmup_rounds=2)
    else:
        mitigation = (PriorSuppression(processor.tokenizer, mode="context", compact_positions=True) if mode == "compact"
                      else PriorSuppression(processor.tokenizer, mode=mode))
        out = paired(lambda: _run(model, inputs), lambda: _run(model, inputs),
                     attach=lambda: attach(model, mitigation))
        if mode in ("context", "compact"):
            assert all(len(spans) == 1 for spans in mitigation.found), "the DO-Bench A3 sentence was found"
    assert out.shape[0] == batch
