"""The command-line tools' usage errors: a wrong model id or path, a bad flag value, a
mitigation value a mitigation refuses, nothing to evaluate -- each one line (exit 2, no
traceback), and before any model loads where nothing about the model is needed. Also the
text table's alignment and the organism helper's interface. No model is loaded here
beyond the shipped organism."""

from __future__ import annotations

import json
import re

import pytest

from evaluators.organism import ORGANISM_DIR

HAS_ORGANISM = (ORGANISM_DIR / "config.json").exists()


@pytest.fixture
def offline(monkeypatch):
    """The Hub answers at once that it cannot be reached (no retries over a dead network)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def no_loading(monkeypatch):
    """A model load fails the test: every flag must be checked before it."""
    import evaluators.model as model_module

    def loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(model_module, "load_hf", loading)


def _usage_error(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line and not line.startswith(("usage:", " "))]
    assert len(lines) == 1, err  # one line of error under the usage
    return lines[0]


# -- 1. a wrong model id or path ---------------------------------------------------------------

@pytest.mark.parametrize("tool", ["vlm-eval", "vlm-report"])
def test_a_missing_model_folder_is_one_line_naming_it(tool, tmp_path, capsys, no_loading):
    from evaluators.cli import main as vlm_eval
    from evaluators.report.main import main as vlm_report

    main = {"vlm-eval": vlm_eval, "vlm-report": vlm_report}[tool]
    for spec in ("./nosuchdir", str(tmp_path / "nosuchdir"), "~/nosuchdir-vlm", "a/b/c"):
        line = _usage_error(main, ["--model", spec, "--tasks", "dobench", "--output_path", str(tmp_path / "o")],
                            capsys)
        assert "--model: no such folder" in line and repr(spec) in line
    (tmp_path / "file.txt").write_text("x")
    line = _usage_error(main, ["--model", str(tmp_path / "file.txt"), "--output_path", str(tmp_path / "o")], capsys)
    assert "--model:" in line and "is a file, not a model folder" in line


def test_a_hub_id_that_cannot_be_loaded_is_one_line_with_the_reason(tmp_path, capsys, offline):
    from evaluators.cli import main
    from evaluators.model import ModelSpecError, load_hf

    line = _usage_error(main, ["--model", "nosuch-org/nosuch-model", "--tasks", "dobench", "--limit", "2",
                               "--output_path", str(tmp_path / "o"), "--no_progress"], capsys)
    assert "--model: 'nosuch-org/nosuch-model' is neither a local folder nor loadable from the Hugging Face Hub (" \
        in line
    with pytest.raises(ModelSpecError, match="neither a local folder"):  # the library says it too, in one line
        load_hf("nosuch-org/nosuch-model")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSpecError, match="the folder .* holds no model AutoModelForImageTextToText can load"):
        load_hf(str(empty))
    (empty / "config.json").write_text("{}")  # a config of no known model
    with pytest.raises(ModelSpecError, match="holds no model AutoModelForImageTextToText can load"):
        load_hf(str(empty))


def test_hub_ids_and_paths_are_told_apart():
    from evaluators.model import is_hub_id

    assert all(map(is_hub_id, ["gpt2", "llava-hf/llava-1.5-7b-hf", "Qwen/Qwen2.5-VL-3B-Instruct", "a_b/c.d"]))
    assert not any(map(is_hub_id, ["./x", "../x", "/x", "~/x", "a/b/c", "-a/b", "a/b.", "a b", "a\\b", ""]))


def test_vlm_hooks_inspects_the_organism_and_names_a_missing_folder(tmp_path, capsys):
    from hooks.cli import main

    line = _usage_error(main, ["inspect", str(tmp_path / "nosuchdir")], capsys)
    assert "no such folder" in line and "nosuchdir" in line
    line = _usage_error(main, ["inspect", "tiny:nosuch"], capsys)
    assert "no tiny model 'tiny:nosuch'" in line and "tiny:llava" in line
    if not HAS_ORGANISM:
        pytest.skip("organism checkpoint missing")
    assert main(["inspect", "organism"]) == 0
    assert capsys.readouterr().out.startswith("== organism  (LlavaForConditionalGeneration")


# -- 2. bad flag values, before the model loads -----------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--gen_kwargs", "num_beams=two"], "--gen_kwargs: num_beams must be an integer, got 'two'"),
    (["--gen_kwargs", "temperature=hot"], "--gen_kwargs: temperature must be a number, got 'hot'"),
    (["--gen_kwargs", "do_sample=1"], "--gen_kwargs: do_sample must be true or false, got 1"),
    (["--gen_kwargs", "num_beams=0"], "--gen_kwargs: num_beams must be at least 1"),
    (["--gen_kwargs", "max_new_tokens=4"], "give max_new_tokens as --max_new_tokens"),
    (["--gen_kwargs", "early_stopping=sometimes"], "--gen_kwargs: generate() would refuse"),
    (["--model_args", "foo=1"], "--model_args: unknown argument(s) ['foo']"),
    (["--model_args", "dtype=bf17"], "--model_args: dtype must be one of"),
    (["--model_args", "device=gpu"], "--model_args: device must be a torch device"),
    (["--model_args", "device=cpu,device_map=auto"], "--model_args: give device (one device) or device_map"),
    (["--batch_size", "0"], "--batch_size must be a positive integer, got 0"),
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    (["--max_new_tokens", "0"], "--max_new_tokens must be a positive integer, got 0"),
    (["--mitigations", "vcd:alpha=-1"], "--mitigations: vcd: alpha must be"),
    (["--mitigations", "vcd:blur_sigma=x"], "--mitigations: vcd: blur_sigma must be a number (positive), got 'x'"),
    (["--mitigations", "plausibility:beta=2"], "--mitigations: plausibility: beta"),
    (["--mitigations", "prior_suppression:mode=x"], "--mitigations: prior_suppression: mode must be one of"),
    (["--mitigations", "crop_verify:tau=2"], "--mitigations: crop_verify: tau must be in [0, 1]"),
    (["--mitigations", "crop_verify:views=crop+nope"], "--mitigations: crop_verify: views must be"),
    (["--tasks", ""], "nothing to evaluate: give --tasks and/or --data"),
    (["--gen_kwargs", "do_sampel=true"], "unknown generate() argument 'do_sampel'. Did you mean ['do_sample']?"),
    (["--model_args", "attn_implementation=eagr"], "unknown attn_implementation 'eagr'. Did you mean ['eager']?"),
    (["--model", "organsim"], "no such folder: 'organsim'. Did you mean 'organism'"),
    (["--tasks", " , "], "nothing to evaluate: give --tasks and/or --data"),
])
def test_vlm_eval_flag_values_are_usage_errors_before_the_model_loads(flags, message, tmp_path, capsys, no_loading):
    from evaluators.cli import main

    line = _usage_error(main, ["--tasks", "dobench", "--limit", "2", "--output_path", str(tmp_path / "o"),
                               "--no_progress", *flags], capsys)
    assert message in line
    assert not (tmp_path / "o").exists()


def test_good_mitigation_values_pass_the_early_check():
    """The early check makes each mitigation with a stand-in processor: valid specs pass,
    CropVerify's and context-mode PriorSuppression's included."""
    from evaluators.cli import check_mitigations

    check_mitigations("vcd:alpha=1;beta=0.1,prior_suppression:mode=context,crop_verify:views=crop+cluster;tau=0.4")
    check_mitigations("plausibility,prior_suppression:mode=output,crop_verify:generic_prompt=none")


@pytest.mark.parametrize("flags, message", [
    (["--model_args", "foo=1"], "--model_args: unknown argument(s) ['foo']"),
    (["--model_args", "dtype=bf17"], "--model_args: dtype must be one of"),
    (["--batch_size", "0"], "--batch_size must be a positive integer"),
    (["--seed", "-1"], "--seed must be a non-negative integer"),
    (["--resamples", "0"], "--resamples must be a positive integer"),
    # one resample made a "95% interval" of one delta ("FIXES +23.6 [+19.4,+19.4]")
    (["--resamples", "1"], "--resamples must be at least 100 for a 95% interval, got 1"),
    (["--resamples", "99"], "--resamples must be at least 100"),
])
def test_vlm_report_flag_values_are_usage_errors_before_the_model_loads(flags, message, tmp_path, capsys,
                                                                        no_loading):
    from evaluators.report.main import main

    line = _usage_error(main, ["--tasks", "dobench", "--output_path", str(tmp_path / "r"), *flags], capsys)
    assert message in line


# -- 6. wording ------------------------------------------------------------------------------

class _Scripted:
    """A stand-in for HFModel (no weights: this is about the CLI's messages)."""

    def __init__(self, model, processor, mitigations=(), generate_kwargs=None, max_new_tokens=8, name="scripted",
                 box_frame=None, grounding_format=None):
        from evaluators.grounding_formats import get_grounding_format

        self.mitigations, self.generate_kwargs, self.name = list(mitigations), generate_kwargs or {}, name
        self.grounding, self.box_frame = get_grounding_format(grounding_format or "toolkit"), box_frame or "pixels"

    def describe(self):
        return {"model": self.name, "generate_kwargs": self.generate_kwargs}

    def __call__(self, queries):
        return ["yes" for _ in queries]


def test_a_refused_resume_names_the_flag_output_path(tmp_path, capsys, monkeypatch):
    import evaluators.model as model_module
    from evaluators.cli import main

    monkeypatch.setattr(model_module, "HFModel", _Scripted)
    monkeypatch.setattr(model_module, "load_hf", lambda name, **kw: (object(), type("P", (), {"tokenizer": None})()))
    common = ["--tasks", "dobench", "--limit", "10", "--no_progress", "--output_path", str(tmp_path / "o")]
    assert main(common) == 0
    capsys.readouterr()
    line = _usage_error(main, [*common, "--gen_kwargs", "do_sample=false"], capsys)
    assert "--output_path" in line and "holds answers from a different run" in line
    assert "output_dir" not in line


def test_a_folder_another_run_is_writing_is_a_usage_error_naming_the_flag(tmp_path, capsys, monkeypatch,
                                                                          held_elsewhere):
    import evaluators.model as model_module
    from evaluators.cli import main

    monkeypatch.setattr(model_module, "HFModel", _Scripted)
    monkeypatch.setattr(model_module, "load_hf", lambda name, **kw: (object(), type("P", (), {"tokenizer": None})()))
    holder = held_elsewhere(tmp_path / "o")
    line = _usage_error(main, ["--tasks", "dobench", "--limit", "10", "--no_progress",
                               "--output_path", str(tmp_path / "o")], capsys)
    assert f"--output_path {tmp_path / 'o'} is being written by another run (pid {holder.pid}" in line


def test_include_names_what_it_could_not_import(tmp_path, capsys, no_loading):
    from evaluators.cli import main

    line = _usage_error(main, ["--include", "no_such_module_xyz", "--output_path", str(tmp_path)], capsys)
    assert "--include: could not import 'no_such_module_xyz': ModuleNotFoundError" in line
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('my plugin is broken')\n")
    line = _usage_error(main, ["--include", str(broken), "--output_path", str(tmp_path)], capsys)
    assert "RuntimeError: my plugin is broken" in line
    line = _usage_error(main, ["--include", str(tmp_path / "missing.py"), "--output_path", str(tmp_path)], capsys)
    assert "no such file" in line


def test_include_loads_a_plugin_split_over_files_and_a_package_beside_a_folder(tmp_path, monkeypatch):
    """--include of a folder-named package was read as a missing file; a plugin whose second
    file imports the first ran the first twice under two names ("registered already") or
    could not find it (a review). Files are imported by their own module name, folder on sys.path."""
    import sys

    from evaluators.cli import include
    from mitigate.base import MITIGATIONS

    plugin = tmp_path / "plugins"
    plugin.mkdir()
    (plugin / "s45_mits.py").write_text(
        "from dataclasses import dataclass\nimport mitigate\n\n@mitigate.register\n@dataclass\n"
        "class Nop(mitigate.Mitigation):\n    name = 's45_nop'\n")
    (plugin / "s45_arms.py").write_text("from s45_mits import Nop\nUSED = Nop\n")
    package = tmp_path / "s45_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("LOADED = True\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        include(f"{plugin / 's45_mits.py'},{plugin / 's45_arms.py'},s45_pkg")
        assert MITIGATIONS["s45_nop"] is sys.modules["s45_mits"].Nop is sys.modules["s45_arms"].USED  # loaded once
        include(str(plugin / "s45_mits.py"))  # again, as a notebook re-runs it: replaced, not refused
        assert MITIGATIONS["s45_nop"] is sys.modules["s45_mits"].Nop
        assert sys.modules["s45_pkg"].LOADED
        (tmp_path / "json.py").write_text("")
        with pytest.raises(ValueError, match="a module named 'json' is imported already"):
            include(str(tmp_path / "json.py"))
    finally:
        MITIGATIONS.pop("s45_nop", None)
        for name in ("s45_mits", "s45_arms", "s45_pkg"):
            sys.modules.pop(name, None)
        if str(plugin) in sys.path:
            sys.path.remove(str(plugin))


def test_help_says_each_tools_default_scale(capsys):
    from evaluators.cli import main as vlm_eval
    from evaluators.report.main import main as vlm_report

    for main, default in ((vlm_report, "small"), (vlm_eval, "full")):
        with pytest.raises(SystemExit) as exit_:
            main(["--help"])
        assert exit_.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert re.search(rf"--scale {{full,large,small}} built-in suite sizes .*default: {default}", text)


# -- 4. the text table -----------------------------------------------------------------------

def _result(arms: list[str], cell: dict) -> dict:
    from evaluators.metrics import MECHANISMS

    names = ["baseline (greedy)", *arms]
    return {
        "arms": [{"name": a, "baseline": None if a == names[0] else names[0]} for a in names],
        "verdicts": {a: {m: cell["verdict"] for m in MECHANISMS} for a in arms},
        "comparisons": {a: [{"mechanism": m, **cell} for m in MECHANISMS] for a in arms},
        "yes_ratio": {a: {"dobench": 51.2, "causal_halbench": 36.9} for a in names},
        "cost": {a: {"forward_rows_per_token": 2, "wall_clock_vs_baseline": 1.5} for a in names},
        "explained_by_control": {},
    }


def test_the_text_table_keeps_every_column_apart():
    """Every label and cell is followed by at least two spaces, and each column starts at
    the same place on every line (a long label ran into its value:
    "yes-ratio (Causal-HalBench)36.9%")."""
    from evaluators.report.table import text_table

    wide = {"verdict": "breaks", "delta": -50.0, "low": -100.0, "high": -0.5}  # "BREAKS -50.0 [-100.0,-0.5]"
    table = text_table(_result(["VCD (greedy)", "prior suppression: context, compact"], wide))
    lines = table.splitlines()
    yes = next(line for line in lines if line.startswith("yes-ratio (Causal-HalBench)"))
    assert re.match(r"yes-ratio \(Causal-HalBench\) {2,}36\.9% {2,}36\.9%$", yes)
    starts = {tuple(m.start() for m in re.finditer(r"(?<=  )\S", line)) for line in lines}
    assert len(starts) == 1, table  # the same column starts on every line
    assert all(re.search(r"BREAKS -50\.0 \[-100\.0,-0\.5\]( {2,}|$)", line) for line in lines
               if line.startswith("perception"))


# -- 6. the organism helper ------------------------------------------------------------------

def test_image_dependence_has_a_command_line_interface(tmp_path, capsys):
    from evaluators.organism.image_dependence import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "checkpoint" in out and "--n_scenes" in out
    line = _usage_error(main, [str(tmp_path / "none")], capsys)
    assert "No organism checkpoint at" in line
    assert "--n_scenes must be a positive" in _usage_error(main, ["--n_scenes", "0"], capsys)
    if not HAS_ORGANISM:
        pytest.skip("organism checkpoint missing")
    assert main([str(ORGANISM_DIR), "--n_scenes", "1"]) == 0  # the positional checkpoint, as before
    printed = capsys.readouterr().out
    assert "clean_existence_accuracy" in printed and "mean_image_effect" in printed
    json.loads(printed.replace("'", '"'))  # the dict, as before


def test_generate_arguments_pass_unless_spelt_like_a_known_one():
    """A typo of a generate() name is refused before the model loads; names generate()
    hands on (the model's forward: ``vision_feature_layer``; a Hub recipe:
    ``trust_remote_code``) pass, as they did before the typo check."""
    from evaluators.model import check_generate_kwargs

    check_generate_kwargs({"vision_feature_layer": -1, "trust_remote_code": True, "penalty_alpha": 0.6, "top_k": 4})
    with pytest.raises(ValueError, match=r"'temprature'. Did you mean \['temperature'\]"):
        check_generate_kwargs({"temprature": 0.7})
