"""Span detection's cost on a long prompt: reading the decoded prompt and each token's
character range back from the ids (``mitigate.spans.decode_with_offsets``), against decoding
the prompt once (the baseline: the least any reading of the text costs) and against decoding
every prefix whole (what it did before it decoded windows). Subword tokenizers in the
styles of real checkpoints, trained in milliseconds (``hooks.testing.trained_tokenizers``).

    python -m pytest benchmarks/test_span_speed.py --benchmark-enable
"""

from __future__ import annotations

import pytest

from hooks.testing import trained_tokenizers
from mitigate.spans import decode_with_offsets

#: ~2,300 byte-level tokens: a long system prompt, as chat templates give
PROMPT = "I am certain there is no dog in the image. Le café est très bon ☕, 日本の猫. " * 60
TOKENIZERS = trained_tokenizers()


@pytest.mark.parametrize("how", ["decode-once", "windows", "whole-prefixes"])
@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_reading_offsets_from_ids(benchmark, rounds, name, how):
    tok = TOKENIZERS[name]
    ids = tok(PROMPT)["input_ids"]
    benchmark.group = f"span_offsets_{name.replace(' ', '_').replace('-', '_')}"
    benchmark.extra_info.update(role="baseline" if how == "decode-once" else how, prompt_tokens=len(ids))
    run = {"decode-once": lambda: tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False),
           "windows": lambda: decode_with_offsets(tok, ids, set()),
           "whole-prefixes": lambda: decode_with_offsets(tok, ids, set(), window=None)}[how]
    out = benchmark.pedantic(run, rounds=rounds if how != "whole-prefixes" else 3, warmup_rounds=1)
    if how == "windows":
        assert out == decode_with_offsets(tok, ids, set(), window=None)
