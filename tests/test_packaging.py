"""The README and the adapter table say the same thing as the tests."""

from __future__ import annotations

import re
from pathlib import Path

import hooks
from hooks.testing import TINY_MODEL_TYPES, tiny_adapter

ROOT = Path(__file__).resolve().parents[1]


def _readme_table() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- architectures -->")[1].split("<!-- /architectures -->")[0]
    return re.findall(r"^\| `([a-z0-9_]+)` \|", block, flags=re.M)


def test_readme_architecture_table_matches_the_tested_list():
    assert sorted(_readme_table()) == sorted(TINY_MODEL_TYPES)


def test_readme_table_rows_match_the_adapters():
    text = (ROOT / "README.md").read_text()
    for model_type in _readme_table():
        adapter = tiny_adapter(model_type)
        row = next(line for line in text.splitlines() if line.startswith(f"| `{model_type}` |"))
        assert f"`{adapter.vision_encoder}`" in row and f"`{adapter.projector}`" in row, model_type
        assert row.rstrip().endswith(f"`{adapter.token_layout}` |"), (model_type, adapter.token_layout)
        for name in adapter.pixel_inputs[:1] + tuple(n for n in adapter.image_inputs if "video" not in n):
            assert f"`{name}`" in row, (model_type, name)


def test_every_adapter_and_tower_variant_has_a_tiny_model():
    """One tiny model per table model type, and one per vision-tower variant a table names
    (``llava_pixtral``: its spec builds model_type llava on a Pixtral tower)."""
    from hooks.testing import tiny_spec

    variants = [(t, v) for t in hooks.supported_model_types() for v in hooks.get_adapter(t).vision_variants]
    built = {(tiny_spec(n)["model_type"], tiny_spec(n)["config"].get("vision_config", {}).get("model_type"))
             for n in TINY_MODEL_TYPES}
    assert sorted({tiny_spec(n)["model_type"] for n in TINY_MODEL_TYPES}) == sorted(hooks.supported_model_types())
    assert all(v in built for v in variants) and len(TINY_MODEL_TYPES) == len(hooks.supported_model_types()) + len(variants)


def test_readme_test_command_is_what_ci_runs():
    text = (ROOT / "README.md").read_text()
    after = text.split("<!-- test-command -->")[1].strip().splitlines()
    assert after[0] == "```bash" and "pytest" in after[1]
    assert "test-command" in (ROOT / ".ci" / "run").read_text()


def test_the_use_snippets_run_as_written():
    """A user's walkthrough (session 39) found it could not run: ``path`` and ``inputs``
    were never defined, and nothing said where the shipped organism is. It now runs on
    the organism as it stands in the README, and its answer is a yes or a no."""
    import torch

    from evaluators.answers import parse_yes_no

    text = (ROOT / "README.md").read_text().split("## Use", 1)[1].split("\n## ", 1)[0]
    snippets = [block.split("```", 1)[0] for block in text.split("```python")[1:]]
    assert len(snippets) == 2  # the mitigations, then the hooks on the same model and inputs
    scope: dict = {}
    with torch.no_grad():
        exec(compile(snippets[0], "README.md (## Use, first snippet)", "exec"), scope)
        answer = scope["processor"].batch_decode(scope["out"][:, scope["inputs"]["input_ids"].shape[1]:],
                                                 skip_special_tokens=True)[0]
        assert parse_yes_no(answer) is not None, answer
        before = {name: p.clone() for name, p in scope["model"].named_parameters()}
        hooks_before = _hooks(scope["model"])  # transformers' own output-capturing hooks among them
        exec(compile(snippets[1], "README.md (## Use, second snippet)", "exec"), scope)
    # the hooks tour leaves no hook behind and the weights untouched
    assert _hooks(scope["model"]) == hooks_before
    assert all(torch.equal(p, before[name]) for name, p in scope["model"].named_parameters())


def _hooks(model) -> dict:
    return {name: (list(m._forward_hooks), list(m._forward_pre_hooks)) for name, m in model.named_modules()}
