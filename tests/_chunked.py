"""Shared by the chunked-prefill tests (test_vcd.py, test_prior.py): the scores of a greedy
generate() with or without a mitigation, and the skip for families whose plain scores
transformers' own chunking changes (or refuses), so the comparison says something."""

from __future__ import annotations

import pytest
import torch

from mitigate import attach


def generate_scores(model, inputs, mitigation=None, **kw) -> torch.Tensor:
    """The stacked step scores of a greedy ``generate()`` (-inf / nan zeroed), under
    ``mitigation`` when one is given."""
    kw = {"max_new_tokens": 5, "pad_token_id": 0, "do_sample": False, "output_scores": True,
          "return_dict_in_generate": True, **kw}
    with torch.no_grad():
        if mitigation is None:
            out = model.generate(**inputs, **kw)
        else:
            with attach(model, mitigation):
                out = model.generate(**inputs, **kw)
    return torch.stack(out.scores).nan_to_num(0.0, 0.0, 0.0)


def skip_unless_chunking_is_exact(model_type: str, model, inputs, chunk: int, **kw) -> None:
    """Skip where transformers refuses ``prefill_chunk_size`` for this family or changes the
    plain model's scores with it."""
    try:
        plain = generate_scores(model, inputs, prefill_chunk_size=chunk, **kw)
    except Exception as error:  # noqa: BLE001 -- the family's own refusal, without us
        pytest.skip(f"{model_type}: no chunked prefill in transformers ({type(error).__name__})")
    if not torch.allclose(plain, generate_scores(model, inputs, **kw), rtol=0, atol=1e-4):
        pytest.skip(f"{model_type}: transformers' chunked prefill changes the plain model's scores")
