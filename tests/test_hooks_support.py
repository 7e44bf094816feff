"""``vlm-hooks support``: how each VLM family of the installed transformers resolves, from
its default config on the meta device."""

import pytest

from hooks import adapters
from hooks.cli import main
from hooks.support import STATUSES, markdown, support, support_matrix


def test_each_status_is_read_from_how_resolve_treats_the_family():
    rows = {r.model_type: r for r in support_matrix(["llava", "idefics2", "blip-2", "florence2", "shieldgemma2"])}
    assert rows["llava"].status == "table" and "'grid'" in rows["llava"].detail
    assert rows["idefics2"].status == "introspected" and "localisation refuses" in rows["idefics2"].detail
    assert rows["blip-2"].status == "refused" and "projector" in rows["blip-2"].detail
    assert rows["florence2"].status == "refused" and "encoder-decoder" in rows["florence2"].detail
    assert rows["shieldgemma2"].status == "class" and "Gemma3ForConditionalGeneration" in rows["shieldgemma2"].detail
    assert {r.model_class for r in rows.values()} >= {"LlavaForConditionalGeneration", "Blip2ForConditionalGeneration"}


def test_an_adapter_registered_at_run_time_is_reported_as_such(monkeypatch):
    import dataclasses

    llava = adapters.get_adapter("llava")
    monkeypatch.setitem(adapters._REGISTRY, "vipllava", adapters.get_adapter("vipllava"))  # restored after
    # a copy of a table adapter, as a user would make one: reported as registered, not as a table file
    adapters.register_adapter(dataclasses.replace(llava, model_type="vipllava"), overwrite=True)
    row = support("vipllava")
    # VipLLaVA keeps LLaVA's module paths, so LLaVA's facts resolve it (in place of its own file)
    assert row.status == "registered" and "'grid'" in row.detail and "from table:llava.json" in row.detail


def test_a_family_that_does_not_build_is_reported_with_the_reason(monkeypatch):
    import transformers

    def fail(model_type, *args, **kwargs):
        raise ImportError("this family needs the timm library")

    monkeypatch.setattr(transformers.AutoConfig, "for_model", fail)
    row = support("llava")
    assert row.status == "not built" and row.model_class == "" and "timm" in row.detail


def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(ValueError, match="Did you mean.*llava"):
        support("lava")


def test_markdown_counts_every_status_present():
    rows = support_matrix(["llava", "blip-2"])
    text = markdown(rows)
    assert "| `llava` | table |" in text and text.rstrip().endswith("table: 1, refused: 1 (of 2)")
    assert all(r.status in STATUSES for r in rows)


def test_cli(capsys):
    assert main(["support", "llava", "idefics2"]) == 0
    out = capsys.readouterr().out
    assert "| `idefics2` | introspected |" in out and "| `llava` | table |" in out
    with pytest.raises(SystemExit) as exc:
        main(["support", "lava"])
    assert exc.value.code == 2
    assert "Did you mean" in capsys.readouterr().err
