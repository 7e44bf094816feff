"""report.html renders in a real browser: headless Chromium screenshots a small report on
the organism, and the page is neither blank nor cut short. Slow (a report run), and
skipped where Chromium is not installed (``apt-get install chromium``)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from evaluators.organism import ORGANISM_DIR

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.slow
@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium installed")
@pytest.mark.skipif(not (ORGANISM_DIR / "config.json").exists(), reason="organism checkpoint missing")
def test_report_html_renders_in_chromium(tmp_path):
    from evaluators.report.main import main

    assert main(["--tasks", "dobench,mioh", "--arms", "VCD (greedy)", "--resamples", "100", "--no_progress",
                 "--output_path", str(tmp_path)]) == 0
    html = tmp_path / "report.html"
    text = html.read_text()
    assert 'src="http' not in text and 'href="http' not in text, "self-contained: nothing fetched"
    shot = tmp_path / "shot.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1200,1600", html.as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.std() > 10, "the page rendered blank"
    dark = (pixels < 128).mean(axis=1)  # text and plot lines per pixel row
    assert (dark[: len(dark) // 2] > 0).mean() > 0.2, "little drawn in the upper half: table and curves missing"


def test_cell_number_is_the_metric_that_decides_the_verdict():
    from evaluators.report.table import headline

    rows = [
        {"mechanism": "language_prior", "metric": "mioh.lc_s", "delta": -50.0, "low": -100.0, "high": 0.0,
         "verdict": "no detectable effect"},
        {"mechanism": "language_prior", "metric": "dobench.prior_robust", "delta": 11.1, "low": 1.4, "high": 21.5,
         "verdict": "fixes"},
        {"mechanism": "cooccurrence", "metric": "x", "delta": 3.0, "low": -1.0, "high": 7.0,
         "verdict": "no detectable effect"},
    ]
    assert headline(rows, "language_prior") == "+11.1 [+1.4,+21.5]"
    # nothing decided: the largest effect, whatever its interval
    assert headline(rows[:1] + rows[2:], "language_prior") == "-50.0 [-100.0,+0.0]"
    assert headline(rows, "perception") == ""
    gap = {"mechanism": "multi_image", "metric": "mioh.decomposition_gap", "delta": -31.2, "low": -54.1,
           "high": -7.3, "verdict": "no detectable effect", "higher_is_better": None}
    ni = {"mechanism": "multi_image", "metric": "mioh.ni", "delta": 12.5, "low": -3.4, "high": 30.8,
          "verdict": "no detectable effect", "higher_is_better": True}
    assert headline([gap, ni], "multi_image") == "+12.5 [-3.4,+30.8]"  # the gap has no direction
    assert headline([gap], "multi_image") == "-31.2 [-54.1,-7.3]"  # unless it is all there is


def test_report_usage_errors_are_messages_not_tracebacks(tmp_path, capsys):
    """A bad --model_args value is a usage error (exit 2, before any model loads)."""
    from evaluators.report.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["--model_args", "dtype", "--output_path", str(tmp_path / "r")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--model_args takes key=value" in err and "Traceback" not in err


class _Scripted:
    """A stand-in for HFModel in vlm-report: unmitigated it answers by id parity, mitigated
    it answers every yes/no question right (no weights involved: this is about bookkeeping)."""

    def __init__(self, model, processor, mitigations=(), generate_kwargs=None, max_new_tokens=8, name="scripted",
                 box_frame=None, grounding_format=None):
        self.mitigations, self.generate_kwargs, self.name = list(mitigations), generate_kwargs or {}, name

    def describe(self):
        return {"model": self.name, "mitigations": [type(m).__name__ for m in self.mitigations],
                "generate_kwargs": self.generate_kwargs}

    def __call__(self, queries):
        if self.mitigations:
            return [str(q.truth) if q.truth in ("yes", "no") else "a" for q in queries]
        return ["yes" if len(q.id) % 2 else "no" for q in queries]


def test_a_report_compares_only_its_own_queries_when_the_folder_holds_an_earlier_runs(tmp_path, monkeypatch):
    """A second vlm-report into the same folder with fewer --tasks: the arms' folders still
    hold the first run's Causal-HalBench answers, which must not reach this report's
    comparisons or verdicts."""
    import json

    import evaluators.model as model_module
    from evaluators.report.main import main

    monkeypatch.setattr(model_module, "HFModel", _Scripted)
    monkeypatch.setattr(model_module, "load_hf", lambda name, **kw: (object(), type("P", (), {"tokenizer": None})()))
    common = ["--arms", "VCD (greedy)", "--resamples", "100", "--no_progress", "--output_path", str(tmp_path)]
    assert main(["--tasks", "dobench,causal_halbench", *common]) == 0
    first = json.loads((tmp_path / "results.json").read_text())
    assert {r["benchmark"] for r in first["comparisons"]["VCD (greedy)"]} == {"dobench", "causal_halbench"}
    assert main(["--tasks", "dobench", *common]) == 0
    second = json.loads((tmp_path / "results.json").read_text())
    assert {r["benchmark"] for r in second["comparisons"]["VCD (greedy)"]} == {"dobench"}
    assert second["verdicts"]["VCD (greedy)"]["cooccurrence"] == "not measured"


def test_the_cost_column_times_whole_runs_only(tmp_path, monkeypatch):
    """An arm's wall clock is the time of a run that answered all of this report's queries:
    read back when the same command is rerun over finished folders, and "not measured"
    when the arm was resumed after a kill (it timed only its remainder) or the folder's
    timing belongs to another query set (here: the earlier run also asked Causal-HalBench)."""
    import json

    import evaluators.model as model_module
    from evaluators.report.main import main
    from evaluators.report.table import text_table

    monkeypatch.setattr(model_module, "HFModel", _Scripted)
    monkeypatch.setattr(model_module, "load_hf", lambda name, **kw: (object(), type("P", (), {"tokenizer": None})()))
    common = ["--arms", "VCD (greedy)", "--resamples", "100", "--no_progress", "--output_path", str(tmp_path)]

    def cost():
        return json.loads((tmp_path / "results.json").read_text())["cost"]

    assert main(["--tasks", "dobench", *common]) == 0
    first = cost()
    assert first["VCD (greedy)"]["seconds"] > 0 and first["VCD (greedy)"]["wall_clock_vs_baseline"] > 0
    assert main(["--tasks", "dobench", *common]) == 0  # nothing left to answer: the whole run's figures
    assert cost()["VCD (greedy)"]["seconds"] == first["VCD (greedy)"]["seconds"]
    samples = tmp_path / "vcd-greedy" / "samples.jsonl"  # killed half way through, then resumed
    lines = samples.read_text().splitlines(keepends=True)
    samples.write_text("".join(lines[: len(lines) // 2]))
    (tmp_path / "vcd-greedy" / "timing.json").unlink()
    assert main(["--tasks", "dobench", *common]) == 0
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert resumed["cost"]["VCD (greedy)"]["seconds"] is None
    assert resumed["cost"]["VCD (greedy)"]["wall_clock_vs_baseline"] is None
    assert "not measured" in text_table(resumed)
    assert resumed["cost"]["baseline (greedy)"]["seconds"] == first["baseline (greedy)"]["seconds"]
    other = tmp_path / "other"
    common[-1] = str(other)
    assert main(["--tasks", "dobench,causal_halbench", *common]) == 0
    assert main(["--tasks", "dobench", *common]) == 0  # all answered before, but timed with Causal-HalBench
    assert json.loads((other / "results.json").read_text())["cost"]["VCD (greedy)"]["seconds"] is None
    # a whole run of another query set into the same folder keeps this set's figure
    third = tmp_path / "third"
    common[-1] = str(third)
    assert main(["--tasks", "dobench", *common]) == 0
    whole = json.loads((third / "results.json").read_text())["cost"]["VCD (greedy)"]["seconds"]
    assert main(["--tasks", "causal_halbench", *common]) == 0
    assert main(["--tasks", "dobench", *common]) == 0
    assert json.loads((third / "results.json").read_text())["cost"]["VCD (greedy)"]["seconds"] == whole


def test_each_scale_and_seed_reports_into_its_own_folder_by_default():
    """ReactBench's suite asks other questions under the same ids at another scale, and a
    folder resumes only on the same questions: the default folder keeps them apart."""
    from evaluators.report.main import default_output

    assert default_output("small", 0) == "runs/report"
    assert len({default_output(s, seed) for s in ("small", "full", "large") for seed in (0, 1)}) == 6


def test_markdown_table_of_one_run_and_of_two_seeds(tmp_path, monkeypatch, capsys):
    """The README's tables come from `python -m evaluators.report.table`: one run gives each
    cell's interval and the cost row; two seeds give 'seed 0 / seed 1' cells; runs of other
    arms are refused, and a missing file is a message."""
    import json

    import evaluators.model as model_module
    from evaluators.report.main import main
    from evaluators.report.table import main as table_main, markdown_table

    monkeypatch.setattr(model_module, "HFModel", _Scripted)
    monkeypatch.setattr(model_module, "load_hf", lambda name, **kw: (object(), type("P", (), {"tokenizer": None})()))
    runs = {}
    for seed, arms in ((0, "VCD (greedy)"), (1, "VCD (greedy)"), (2, "prior suppression: output")):
        out = tmp_path / str(seed)
        assert main(["--tasks", "dobench", "--arms", arms, "--resamples", "100", "--no_progress", "--seed", str(seed),
                     "--output_path", str(out)]) == 0
        runs[seed] = json.loads((out / "results.json").read_text())
    capsys.readouterr()

    one = markdown_table([runs[0]]).splitlines()
    assert one[0] == "| mechanism | VCD (greedy) |" and one[1] == "|---|---|"
    prior = next(line for line in one if line.startswith("| language prior |"))
    assert prior.startswith("| language prior | **FIXES** +") and "[" in prior  # the scripted arm answers right
    assert next(line for line in one if line.startswith("| co-occurrence |")) == "| co-occurrence | n/a |"
    assert one[-1].startswith("| forward rows per token, wall clock vs baseline | 2×, ")
    assert "greedy baseline" in one[-2] and "sampling" not in one[-2]
    # a yes-ratio row per yes/no benchmark the run answered: here DO-Bench only
    assert [line.split(";")[0] for line in one if line.startswith("| yes-ratio")] == ["| yes-ratio (DO-Bench"]
    both = {**runs[0], "yes_ratio": {a: {**v, "causal_halbench": 42.5} for a, v in runs[0]["yes_ratio"].items()}}
    rows = [line for line in markdown_table([both]).splitlines() if line.startswith("| yes-ratio")]
    assert [row.split(";")[0] for row in rows] == ["| yes-ratio (DO-Bench", "| yes-ratio (Causal-HalBench"]
    assert rows[1].endswith("| 42.5% |")

    two = markdown_table([runs[0], runs[1]]).splitlines()
    assert two[0] == "| mechanism (seed 0 / seed 1) | VCD (greedy) |"
    cell = next(line for line in two if line.startswith("| language prior |")).split(" | ")[1]
    assert cell.count(" / ") == 1 and "[" not in cell
    assert not any(line.startswith("| forward rows") for line in two)

    with pytest.raises(ValueError, match="different arms"):
        markdown_table([runs[0], runs[2]])
    assert runs[0]["interval"] == "expanded" and runs[0]["family"] == "arm"  # vlm-report's defaults, recorded
    with pytest.raises(ValueError, match="read their intervals differently"):  # verdicts of two corrections
        markdown_table([runs[0], {**runs[1], "family": "mechanism"}])
    with pytest.raises(ValueError, match="read their intervals differently"):  # a file from before they were recorded
        markdown_table([runs[0], {k: v for k, v in runs[1].items() if k not in ("interval", "family")}])
    from evaluators.report.table import reading

    older = {k: v for k, v in runs[1].items() if k not in ("interval", "family")}
    assert reading(older) == ("percentile", "mechanism")  # Holm per mechanism: its rows carry verdict_unadjusted
    uncorrected = {**older, "comparisons": {a: [{k: v for k, v in r.items() if k != "verdict_unadjusted"} for r in rows]
                                            for a, rows in older["comparisons"].items()}}
    assert reading(uncorrected) == ("percentile", "none")
    paths = [str(tmp_path / s / "results.json") for s in ("0", "1")]
    assert table_main(paths) == 0 and capsys.readouterr().out.splitlines() == two
    assert table_main([str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    (tmp_path / "eval.json").write_text(json.dumps({"results": {}}))  # vlm-eval's, not vlm-report's
    assert table_main([str(tmp_path / "eval.json")]) == 2
    assert "not vlm-report's results.json" in capsys.readouterr().err


def test_a_report_over_finished_folders_grades_their_answers_by_todays_parsers(tmp_path, monkeypatch):
    import json

    import evaluators.model as model_module
    from evaluators.report.main import main

    monkeypatch.setattr(model_module, "HFModel", _Scripted)
    monkeypatch.setattr(model_module, "load_hf", lambda name, **kw: (object(), type("P", (), {"tokenizer": None})()))
    common = ["--tasks", "dobench", "--arms", "VCD (greedy)", "--resamples", "100", "--no_progress",
              "--output_path", str(tmp_path)]
    assert main(common) == 0
    first = json.loads((tmp_path / "results.json").read_text())
    for samples in tmp_path.glob("*/samples.jsonl"):  # an older parser's grades
        rows = [json.loads(line) for line in samples.read_text().splitlines()]
        samples.write_text("".join(json.dumps({**r, "correct": not r["correct"]}) + "\n" for r in rows))
    assert main(common) == 0
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["comparisons"] == first["comparisons"] and again["verdicts"] == first["verdicts"]


class _Reading(_Scripted):
    """A stand-in that reads every image it is asked about, as HFModel does (a missing file
    raises FileNotFoundError there)."""

    def __call__(self, queries):
        for q in queries:
            q.load_images()
        return super().__call__(queries)


def _user_dobench(folder, missing=()):
    """A users' DO-Bench file of two scenes (an image per instance); ``missing`` images deleted."""
    import json

    rows = []
    for scene in ("s0", "s1"):
        for s in "AB":
            for lv in range(4):
                name = f"{scene}_{s}{lv}.png"
                Image.new("RGB", (32, 32), (40 * lv, 100, 200 if s == "A" else 50)).save(folder / name)
                thing = "cat" if s == "A" else "dog"
                rows.append({"id": f"{scene}-{s}{lv}", "scene_id": scene, "image": name, "series": s, "level": lv,
                             "view": "Full", "object": thing, "answer": "yes" if s == "A" else "no",
                             "question": f"is there a {thing} in the image ? answer yes or no ."})
    (folder / "do.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in missing:
        (folder / name).unlink()
    return folder / "do.jsonl"


def test_a_report_on_user_data_with_a_missing_image_is_written(tmp_path, monkeypatch):
    """A --data image missing in the first batch: the untimed warm-up had asked the model
    about it (FileNotFoundError before any arm ran), and report.html's examples had opened
    it (after every arm ran: no report). The query is an invalid input, asked by nobody."""
    import json

    import evaluators.model as model_module
    from evaluators.report.main import main

    monkeypatch.setattr(model_module, "HFModel", _Reading)
    monkeypatch.setattr(model_module, "load_hf", lambda name, **kw: (object(), type("P", (), {"tokenizer": None})()))
    data = _user_dobench(tmp_path, missing=["s0_A0.png", "s0_A3.png"])  # A3: the first example the page shows
    out = tmp_path / "report"
    assert main(["--tasks", "", "--data", f"dobench={data}", "--arms", "VCD (greedy)", "--resamples", "100",
                 "--no_progress", "--output_path", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["invalid"]["VCD (greedy)"]["dobench"]["invalid_inputs"] == 2
    page = (out / "report.html").read_text()
    assert page.count('class="ex"') == 2  # the A3 and the Full-view A0 examples: s1's shown, s0's missing


def test_examples_leave_out_an_image_that_cannot_be_read(tmp_path):
    """An image that was there when the run began and is gone (or cut short) when the page
    is written: that example is left out, the page still written."""
    from evaluators.data import ImageRef
    from evaluators.query import Query
    from evaluators.report.html import _examples

    Image.new("RGB", (16, 16)).save(tmp_path / "a.png")
    (tmp_path / "b.png").write_bytes(b"\x89PNG\r\n")  # corrupt
    queries = [Query(f"q{i}", "dobench", [ImageRef(tmp_path / name)], "is there a cat ?", "yes_no", "yes",
                     {"series": "A", "level": 3, "view": "Full"}) for i, name in enumerate(("a.png", "b.png", "c.png"))]
    records = {"arm": {"dobench": [{"id": q.id, "answer": "yes"} for q in queries]}}
    page = _examples(queries, records, ["arm"])
    assert page.count('class="ex"') == 1


def test_the_table_reads_a_null_delta_as_undefined(tmp_path, capsys):
    """results.json stores NaN as null: a metric undefined on both arms (no Cluster/Crop view
    for PerceptionAbility) has delta, low and high null, and the Markdown table made from
    the file had crashed on it (abs(None))."""
    import json

    from evaluators.report.table import headline, main as table_main

    undefined = {"mechanism": "perception", "metric": "dobench.perception_ability", "higher_is_better": True,
                 "delta": None, "low": None, "high": None, "verdict": "no detectable effect"}
    decided = {"mechanism": "perception", "metric": "x", "higher_is_better": True, "delta": 2.0, "low": None,
               "high": None, "verdict": "no detectable effect"}
    assert headline([undefined], "perception") == ""
    assert headline([undefined, decided], "perception") == "+2.0 [nan,nan]"
    result = {"arms": [{"name": "base", "baseline": None}, {"name": "arm", "baseline": "base"}],
              "verdicts": {"arm": {m: "no detectable effect" for m in
                                   ("language_prior", "cooccurrence", "perception", "vision_grounding",
                                    "label_grounding", "multi_image")}},
              "comparisons": {"arm": [undefined, {"metric": "dobench.mcnemar(correct)", "mechanism": None,
                                                  "delta": None}]},
              "yes_ratio": {"base": {"dobench": None}, "arm": {"dobench": 50.0}},
              "cost": {"arm": {"forward_rows_per_token": 1, "wall_clock_vs_baseline": None}},
              "explained_by_control": {}}
    (tmp_path / "results.json").write_text(json.dumps(result))
    assert table_main([str(tmp_path / "results.json")]) == 0
    assert "| weak perception | \u2212 |" in capsys.readouterr().out


def test_a_users_arm_runs_in_the_report_through_include(tmp_path, capsys):
    """vlm-report's arms were a fixed list: a registered arm (examples/custom_mitigation.py)
    is named with --arms after --include imported it, and compared with its baseline."""
    import json
    from pathlib import Path

    from evaluators.organism import ORGANISM_DIR
    from evaluators.report.main import main

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    from evaluators.report.attribution import USER_ARMS
    from mitigate.base import MITIGATIONS

    example = Path(__file__).resolve().parents[1] / "examples" / "custom_mitigation.py"
    out = tmp_path / "report"
    try:
        assert main(["--include", str(example), "--arms", "yes-bias", "--tasks", "dobench", "--resamples", "100",
                     "--no_progress", "--output_path", str(out)]) == 0
        result = json.loads((out / "results.json").read_text())
        arms = {a["name"]: a for a in result["arms"]}
        assert set(arms) == {"yes bias", "baseline (greedy)"} and arms["yes bias"]["baseline"] == "baseline (greedy)"
        assert result["yes_ratio"]["yes bias"]["dobench"] < result["yes_ratio"]["baseline (greedy)"]["dobench"]
        with pytest.raises(SystemExit):
            main(["--arms", "yes-bias-typo", "--include", str(example), "--output_path", str(tmp_path / "x")])
        assert "unknown arm(s) ['yes-bias-typo']" in capsys.readouterr().err
    finally:  # the process's registries as they were, for the tests after this one
        USER_ARMS.pop("yes bias", None)
        MITIGATIONS.pop("yes_bias", None)
