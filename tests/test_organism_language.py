"""The organism's language-pretraining stage: truthful, unbiased, in the vocabulary, and it trains."""

import re
from collections import Counter

import numpy as np
import pytest
import torch

from evaluators.organism import language, tasks
from evaluators.organism.package import UNK_TOKEN, build_model_config, build_tokenizer
from evaluators.world import CATEGORIES, COLOURS

ITEM = re.compile(r"(\w+) (" + "|".join(CATEGORIES) + r")\b")


def _parse(prompt: str):
    context = prompt.split("USER: ", 1)[1].split(" is there ")[0]
    return dict((cat, col) for col, cat in ITEM.findall(context)), context


def test_answers_are_true_of_the_listed_objects():
    rng = np.random.default_rng(0)
    kinds = Counter()
    for _ in range(400):
        prompt, answer = language.example(rng, filler=20)
        listed, _ = _parse(prompt)
        assert 1 <= len(listed) <= language.MAX_OBJECTS
        asked = re.search(r"is there a (\w+)", prompt).group(1)
        kinds[answer] += 1
        assert answer == ("yes" if asked in listed else "no"), prompt
    # both answers are drawn (a constant answer could not fail this)
    assert 160 < kinds["yes"] < 240


def test_lists_carry_no_world_bias():
    """Categories and colours are uniform: the stage must not teach the biased world's statistics."""
    rng = np.random.default_rng(1)
    cats, cols = Counter(), Counter()
    for _ in range(3000):
        listed, _ = _parse(language.example(rng, filler=0)[0])
        cats.update(listed.keys())
        cols.update(listed.values())
    assert set(cats) == set(CATEGORIES) and set(cols) == set(COLOURS)
    assert max(cats.values()) / min(cats.values()) < 1.2
    assert max(cols.values()) / min(cols.values()) < 1.25


def test_filler_curriculum_and_bound():
    steps = 1000
    fill = [language.filler_at(s, steps) for s in range(steps)]
    assert all(f == 0 for f in fill[: int(language.SHORT_SHARE * steps)])
    assert fill == sorted(fill) and fill[-1] == language.MAX_FILLER
    rng = np.random.default_rng(2)
    for _ in range(100):
        _, context = _parse(language.example(rng, filler=12)[0])
        assert context.split().count(UNK_TOKEN) <= 12
    assert UNK_TOKEN not in language.example(np.random.default_rng(3), filler=0)[0]


def test_short_share_moves_the_start_of_the_filler_and_keeps_the_schedule_shape():
    steps = 1000
    early = [language.filler_at(s, steps, short_share=0.4) for s in range(steps)]
    assert all(f == 0 for f in early[:400]) and early[420] > 0
    # the ramp takes half of the remaining steps, then the full length to the end
    assert early == sorted(early) and all(f == language.MAX_FILLER for f in early[700:])
    default = [language.filler_at(s, steps) for s in range(steps)]
    assert default == [language.filler_at(s, steps, short_share=language.SHORT_SHARE) for s in range(steps)]
    assert sum(f == language.MAX_FILLER for f in early) >= 2 * sum(f == language.MAX_FILLER for f in default)
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="short_share"):
            language.filler_at(0, steps, short_share=bad)


def test_prompts_stay_in_the_vocabulary():
    tok = build_tokenizer(tasks.vocabulary())
    rng = np.random.default_rng(4)
    for _ in range(50):
        prompt, answer = language.example(rng, filler=5)
        ids = tok(f"{prompt} {answer}", add_special_tokens=False)["input_ids"]
        # <unk> appears only as the written filler token
        assert ids.count(tok.unk_token_id) == prompt.split().count(UNK_TOKEN)


def test_stage_trains_only_the_decoder():
    torch.manual_seed(0)
    tok = build_tokenizer(tasks.vocabulary())
    from transformers import LlavaForConditionalGeneration

    cfg = build_model_config(len(tok), image_size=16, patch_size=8,
                             text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1})
    model = LlavaForConditionalGeneration(cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    language.pretrain_language(model, tok, steps=3, batch=4, seed=0, log=lambda _: None)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert "lm_head.weight" in moved and any(n.startswith("model.language_model.layers.") for n in moved)
    assert not any(n.startswith(("model.vision_tower.", "model.multi_modal_projector.")) for n in moved)
    assert "model.language_model.embed_tokens.weight" not in moved
