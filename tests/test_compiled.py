"""Hooks and torch.compile (hooks/compiled.py).

On a GPU, ``generate()`` with a static cache compiles the model's forward by itself, and a
compiled graph does not see hooks added after it (TorchDynamo does not guard on module
hooks). Found on an H100 in session 32: ``tests/test_cuda.py``'s static-cache test, a plain
compiled run first, then the mitigations. Here the same path runs on the CPU:
``CompileConfig._compile_all_devices`` (transformers' own switch for compiling off an
accelerator) and the ``eager`` backend, which traces with TorchDynamo without generating code.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import CompileConfig

from hooks import HookGroup, hook_state, resolve
from hooks.compiled import NoAutoCompile, compiled_modules
from hooks.testing import WordIds, build_tiny_model, tiny_inputs
from mitigate import VCD, PriorSuppression, attach

NEW = 4


def _compile_config() -> CompileConfig:
    config = CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True  # compile on the CPU as generate() does on a GPU
    return config


def _scores(model, inputs, **kwargs) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True, **kwargs)
    return [s.float() for s in out.logits]


@pytest.mark.parametrize("model_type", ["llava", "gemma3", "qwen2_vl"])
def test_a_forward_compiled_before_attach_does_not_skip_the_mitigation(model_type):
    model = build_tiny_model(model_type)
    inputs = tiny_inputs(model, batch_size=2, text_lengths=[7, 5], seed=3)
    spans = WordIds.middle_pair(model, inputs)
    static = dict(cache_implementation="static", compile_config=_compile_config())
    plain = _scores(model, inputs)
    before = hook_state(model)
    torch.testing.assert_close(_scores(model, inputs, **static), plain, rtol=0, atol=1e-5)  # compiles the steps
    for make in (lambda: PriorSuppression(WordIds(), spans=spans), lambda: VCD(seed=3)):
        with attach(model, make()):
            want = _scores(model, inputs)
        with attach(model, make()), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _scores(model, inputs, **static)
        # with the graph compiled before attach, context-mode prior suppression's steps were 0.02 off
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert any("uncompiled while hooks are attached" in str(w.message) for w in caught)
        assert max((g - p).abs().max().item() for g, p in zip(got[1:], plain[1:])) > 1e-3  # it acts on the steps
    assert hook_state(model) == before and "_valid_auto_compile_criteria" not in vars(model)
    torch.testing.assert_close(_scores(model, inputs, **static), plain, rtol=0, atol=1e-5)  # compiled again after


def test_handles_on_one_model_detach_in_any_order():
    model = build_tiny_model("llava")
    original = vars(model).get("_valid_auto_compile_criteria", "absent")
    first, second = HookGroup("a"), HookGroup("b")
    first.keep_generate_uncompiled(model)
    second.keep_generate_uncompiled(model)
    config = model.generation_config
    config.compile_config = _compile_config()
    static_kwargs = {"cache": type("C", (), {"is_compileable": True})()}
    try:
        assert model._valid_auto_compile_criteria({}, config) is False
        first.remove()  # the first holder goes; the second still keeps generate() uncompiled
        with pytest.warns(RuntimeWarning, match="uncompiled"):
            assert model._valid_auto_compile_criteria(static_kwargs, config) is False
        second.remove()
        assert vars(model).get("_valid_auto_compile_criteria", "absent") == original
        assert model._valid_auto_compile_criteria(static_kwargs, config) is True  # transformers' own rule again
    finally:
        config.compile_config = None
        first.remove(), second.remove()


def test_a_compiled_model_is_refused_with_its_module_named():
    model = build_tiny_model("llava")
    before = hook_state(model)
    points = resolve(model)
    cases = {
        "torch.compile(model)": lambda: (torch.compile(model, backend="eager"), "'OptimizedModule'"),
        "module.compile()": lambda: (points.language_model.compile(backend="eager") or model, "model.language_model"),
        "forward replaced": lambda: (setattr(points.lm_head, "forward", torch.compile(points.lm_head.forward, backend="eager"))
                                     or model, "lm_head"),
    }
    for what, make in cases.items():
        target, name = make()
        with pytest.raises(ValueError, match=f"{name}.*compiled by torch.compile.*_orig_mod"):
            attach(target, VCD())
        with pytest.raises(ValueError, match="compiled by torch.compile"):
            HookGroup().keep_generate_uncompiled(target)
        points.language_model._compiled_call_impl = None
        vars(points.lm_head).pop("forward", None)
        assert compiled_modules(model) == [], what
    assert hook_state(model) == before
    # torch.compiler.disable keeps code out of compilation: not refused
    points.lm_head.forward = torch.compiler.disable(points.lm_head.forward)
    assert compiled_modules(model) == [] and compiled_modules(torch.compiler.disable(model)) == []
    vars(points.lm_head).pop("forward")


def test_a_module_without_generate_gets_no_handle():
    group = HookGroup()
    assert group.keep_generate_uncompiled(torch.nn.Linear(2, 2)) is None and not group.active
    with pytest.raises(ValueError, match="no generate"):
        NoAutoCompile(torch.nn.Linear(2, 2))


def test_plain_generate_is_untouched_without_hooks():
    """Nothing attached: transformers compiles as it always did (no warning, same scores)."""
    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[6], seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = _scores(model, inputs, cache_implementation="static", compile_config=_compile_config())
    torch.testing.assert_close(got, _scores(model, inputs), rtol=0, atol=1e-5)


def test_crop_and_verify_captures_keep_generate_uncompiled_while_they_run():
    """Crop-and-verify's captures hook the user's own generate() (without attach());
    a compiled step would run without them, or keep them once traced."""
    from mitigate.localize import capture_first_pass
    from mitigate.localize_embedding import capture_embeddings

    model = build_tiny_model("llava")
    inputs = tiny_inputs(model, batch_size=1, text_lengths=[6], seed=1)
    before = hook_state(model)
    image = resolve(model).image_token_mask(inputs["input_ids"])
    for capture in (lambda: capture_first_pass(model, inputs),
                    lambda: capture_embeddings(model, inputs, image)):
        with capture():
            assert "_valid_auto_compile_criteria" in vars(model)
            with torch.no_grad():
                model(**inputs)
        assert hook_state(model) == before and "_valid_auto_compile_criteria" not in vars(model)
