"""Users' own data in native formats runs through the same protocols and scorers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from PIL import Image

from evaluators.benchmarks.protocols import PROTOCOLS
from evaluators.model import CallableModel
from evaluators.runner import SAMPLES, read_samples, run


def _png(path, array=None):
    array = np.zeros((32, 32, 3), dtype=np.uint8) if array is None else array
    Image.fromarray(array).save(path)
    return path.name


def test_hallusegbench_data_json_end_to_end(tmp_path):
    mask = np.zeros((32, 32), dtype=np.uint8)
    mask[8:24, 8:24] = 255  # a 16x16 object: a whole-image box has IoU 256/1024
    Image.fromarray(mask).save(tmp_path / "m.png")
    _png(tmp_path / "f.png")
    _png(tmp_path / "c.png", np.full((32, 32, 3), 9, dtype=np.uint8))
    entries = [{"factual_image_path": "f.png", "factual_mask_path": "m.png", "counterfactual_image_path": "c.png",
                "counterfactual_mask_path": "m.png", "factual_label": "dog", "counterfactual_label": "cat"},
               {"factual_image_path": "gone.png", "factual_mask_path": "m.png", "counterfactual_image_path": "c.png",
                "counterfactual_mask_path": "m.png", "factual_label": "dog", "counterfactual_label": "cat"}]
    (tmp_path / "data.json").write_text(json.dumps(entries))
    queries = PROTOCOLS["hallusegbench"](tmp_path / "data.json")
    assert len(queries) == 6 and queries[3].problem and not queries[0].problem
    out = run(queries, CallableModel(lambda i, p: "[0, 0, 32, 32]"), tmp_path / "run", progress=False)
    assert out["results"]["hallusegbench"]["iou_fact"] == pytest.approx(256 / 1024)
    assert out["invalid"]["hallusegbench"]["invalid_inputs"] == 3


def test_causal_and_jsonl_benchmarks_end_to_end(tmp_path):
    (tmp_path / "images").mkdir()
    _png(tmp_path / "images" / "a.jpg")
    _png(tmp_path / "images" / "a001.jpg")
    qa = [{"image_name": "a.jpg", "q": "Is there a fork?", "type": "target", "tag": "origin", "id": 1, "answer": "yes"},
          {"image_name": "a001.jpg", "q": "Is there a fork?", "type": "target", "tag": "inpainted", "id": 2,
           "answer": "yes"}]
    (tmp_path / "qa.json").write_text(json.dumps(qa))
    _png(tmp_path / "s.png")
    do = [{"id": i, "scene_id": "s", "image": "s.png", "series": s, "level": lv, "view": v, "object": "dog",
           "question": "Is there a dog?", "answer": "yes" if s == "A" else "no"}
          for i, (s, lv, v) in enumerate([("A", lv, "Full") for lv in range(4)] + [("B", lv, "Full") for lv in range(4)]
                                         + [("A", 0, "Cluster"), ("A", 0, "Crop")])]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in do))
    react = [{"id": 1, "task": "dense_counting", "images": ["s.png"], "question": "How many dogs?",
              "question_type": "SA", "answer": 3, "count_query": "exact"},
             {"id": 2, "task": "dense_counting", "images": ["s.png"], "question": "More than two?",
              "question_type": "YN", "answer": "yes", "count_query": "exact", "mode": "cot"},
             {"id": 3, "task": "relational_erasure", "images": ["s.png"], "question": "A leash goes with a dog. Dog?",
              "question_type": "YN", "answer": "no", "inducing": "commonsense"},
             {"id": 4, "task": "dense_counting", "images": ["s.png"], "question": "About how many dogs?",
              "question_type": "SA", "answer": "2-4", "count_query": "interval", "interval": [2, 4]},
             {"id": 5, "task": "dense_counting", "images": ["s.png"], "question": "About how many cats?",
              "question_type": "SA", "answer": "5-9", "count_query": "interval", "interval": [5, 9]}]
    (tmp_path / "react.jsonl").write_text("\n".join(json.dumps(r) for r in react))
    mioh = [{"id": 1, "task": "existence", "question_type": "selective", "condition": "easy",
             "images": ["s.png", "s.png"], "question": "In which image is there a dog?",
             "options": ["Image 1", "Image 2", "None of the above"], "answer": "a"}]
    (tmp_path / "mioh.jsonl").write_text(json.dumps(mioh[0]))
    queries = (PROTOCOLS["causal_halbench"](tmp_path / "qa.json") + PROTOCOLS["dobench"](tmp_path / "do.jsonl")
               + PROTOCOLS["reactbench"](tmp_path / "react.jsonl") + PROTOCOLS["mioh"](tmp_path / "mioh.jsonl"))
    out = run(queries, CallableModel(lambda i, p: "yes, 3. a"), tmp_path / "run", progress=False)["results"]
    assert out["causal_halbench"]["accuracy"] == pytest.approx(100.0)
    assert out["dobench"]["yes_rate"] == pytest.approx(100.0)
    assert out["mioh"]["easy"] == pytest.approx(0.0)  # "yes, 3. a" is no lone option letter
    # the schema's inducing / count_query / mode reach the breakdowns of Tables 3-4
    details = out["reactbench"]["details"]
    assert details["breakdown"]["relational_erasure"]["commonsense"] == pytest.approx(0.0)
    assert details["breakdown"]["relational_erasure"]["direct"] is None  # no such question: empty cell
    assert details["breakdown"]["dense_counting"]["exact"] == pytest.approx(100.0)
    # "3" lies in [2, 4] (right) but not in [5, 9] (wrong): interval queries score by the interval
    assert details["breakdown"]["dense_counting"]["interval"] == pytest.approx(50.0)
    assert details["accuracy_by_mode"]["dense_counting"] == {"standard": pytest.approx(200 / 3),
                                                             "cot": pytest.approx(100.0)}


@pytest.mark.skipif(not __import__("evaluators.organism", fromlist=["ORGANISM_DIR"]).ORGANISM_DIR.joinpath(
    "config.json").exists(), reason="organism checkpoint missing")
def test_vlm_report_on_user_data(tmp_path):
    """The report takes users' data in a native format, like vlm-eval does."""
    from evaluators.organism.tasks import do_prior, existence_question
    from evaluators.report.main import main
    from evaluators.world import BIASED, World

    scene = World(BIASED).scene(10**9 + 3)
    target = scene.objects[0].category
    scene.render().save(tmp_path / "s.png")
    rows = [{"id": f"{s}{lv}", "scene_id": "s", "image": "s.png", "series": s, "level": lv, "view": "Full",
             "object": target if s == "A" else "dog", "answer": "yes" if s == "A" else "no",
             "question": existence_question(target if s == "A" else "dog",
                                            do_prior(lv, target if s == "A" else "dog", s == "A"))}
            for s in "AB" for lv in range(4)]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "report"
    # --data alone runs that data alone: no built-in suite joins it (before, the default
    # suites ran beside the data unless --tasks "" was given)
    assert main(["--data", f"dobench={tmp_path / 'do.jsonl'}", "--arms", "VCD (greedy)",
                 "--resamples", "100", "--no_progress", "--output_path", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["data"] == {"dobench": str(tmp_path / "do.jsonl")} and result["tasks"] == []
    samples = read_samples(out / "vcd-greedy" / "samples.jsonl")
    assert len(samples) == len(rows)
    assert all(r["image_paths"] == [str(tmp_path / "s.png")] and r["truth"] in ("yes", "no") for r in samples)
    # on the organism the report says which mechanisms the model exhibits (its model card)
    assert result["model_card"]["checks"]["prior_rise_level0_to_3"] is True
    assert "What this organism can show" in (out / "report.html").read_text()
    with pytest.raises(SystemExit):
        main(["--tasks", "", "--data", "pope=x.jsonl", "--output_path", str(tmp_path / "bad")])


def test_vlm_report_refuses_unknown_arms(tmp_path, capsys):
    """An arm name that matches nothing is an error naming what exists (optional arms
    included), not a report with that arm silently missing."""
    from evaluators.report.main import main

    with pytest.raises(SystemExit):
        main(["--tasks", "dobench", "--arms", "vcd-greedy,crop-and-verfy", "--output_path", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert "crop-and-verfy" in err and "crop-and-verify-which-image" in err


def test_reactbench_short_answers_take_synonyms_and_refuse_denials_and_intervals_score_as_documented(tmp_path):
    """A short answer is right when it says the ground truth or a synonym, never when it
    names it only to deny it; an interval query is right for a count inside the question's
    interval or for that very interval stated as a range, not for another range
    (``reactbench.metrics.count_correct``, the rule the runner applies)."""
    _png(tmp_path / "s.png")
    rows = [{"id": 1, "task": "relational_erasure", "images": ["s.png"], "question": "What is on the plate?",
             "question_type": "SA", "answer": "fork", "synonyms": ["utensil", "eating utensil"]},
            {"id": 2, "task": "dense_counting", "images": ["s.png"], "question": "About how many dogs?",
             "question_type": "SA", "answer": "20-30", "count_query": "interval", "interval": [20, 30]}]
    (tmp_path / "react.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    queries = PROTOCOLS["reactbench"](tmp_path / "react.jsonl")

    def correct(short: str, count: str) -> list[bool]:
        model = CallableModel(lambda images, prompt: count if "how many" in prompt else short)
        folder = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
        run(queries, model, folder, progress=False)
        return [r["correct"] for r in sorted(read_samples(folder / SAMPLES), key=lambda r: r["id"])]

    assert correct("a fork .", "25") == [True, True]
    assert correct("a utensil", "between 20 and 30") == [True, True]
    assert correct("there is no fork on the plate", "between 25 and 40") == [False, False]
    assert correct("not a fork", "20 to 31") == [False, False]
    assert correct("a spoon", "31") == [False, False]
    bad = [{**rows[1], "interval": [30, 20]}]
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad[0]))
    with pytest.raises(ValueError, match="interval"):
        PROTOCOLS["reactbench"](tmp_path / "bad.jsonl")


def _seg_entry(image="f.png", **extra):
    return {"factual_image_path": image, "factual_mask_path": "m.png", "counterfactual_image_path": "c.png",
            "counterfactual_mask_path": "m.png", "factual_label": "dog", "counterfactual_label": "cat", **extra}


def _seg_subset(folder, entries):
    folder.mkdir(parents=True)
    Image.fromarray(np.zeros((32, 32), dtype=np.uint8)).save(folder / "m.png")
    _png(folder / "f.png")
    _png(folder / "c.png", np.full((32, 32, 3), 9, dtype=np.uint8))
    (folder / "data.json").write_text(json.dumps(entries))


def test_hallusegbench_release_folder_loads_every_subset_with_distinct_ids(tmp_path):
    """The release keeps a data.json per subset and names entries by ann_id: the test/
    folder loads all of them, and no two subsets share a query id (a run resumes by id)."""
    from evaluators.benchmarks.hallusegbench import load

    _seg_subset(tmp_path / "test" / "refer_seg", [_seg_entry(ann_id=1), _seg_entry(ann_id=2)])
    _seg_subset(tmp_path / "test" / "reason_seg_test",
                [_seg_entry(ann_id=1, question="which animal barks?", counterfactual_question="which barks?")])
    samples = load(tmp_path / "test")
    assert [s.id for s in samples] == ["reason_seg_test/1", "refer_seg/1", "refer_seg/2"]
    assert [s.split for s in samples] == ["reasoning", "referring", "referring"]
    queries = PROTOCOLS["hallusegbench"](tmp_path / "test")
    assert len({q.id for q in queries}) == len(queries) == 9
    with pytest.raises(ValueError, match="no data.json"):
        load(tmp_path)


def test_a_resumed_run_refuses_other_questions_under_the_same_ids(tmp_path):
    """Two subsets whose ids repeat (or a data file edited between runs) into one folder:
    the second run's answers are not taken from the first's."""
    from evaluators.runner import RunMismatch

    first, target = tmp_path / "x" / "a", tmp_path / "y" / "a"  # same folder name: same ids
    _seg_subset(first, [_seg_entry(ann_id=1)])
    _seg_subset(target, [_seg_entry(ann_id=1, factual_label="cup")])
    model = CallableModel(lambda i, p: "none")
    run(PROTOCOLS["hallusegbench"](first), model, tmp_path / "run", progress=False)
    again = PROTOCOLS["hallusegbench"](target)
    assert {q.id for q in again} == {q.id for q in PROTOCOLS["hallusegbench"](first)}
    with pytest.raises(RunMismatch, match="other questions"):
        run(again, model, tmp_path / "run", progress=False)
    run(PROTOCOLS["hallusegbench"](first), model, tmp_path / "run", progress=False)  # the same queries resume


def test_a_truncated_jpeg_is_an_invalid_input_not_a_crash(tmp_path):
    import io

    image = Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG")
    (tmp_path / "cut.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    _png(tmp_path / "s.png")
    rows = [{"id": 1, "scene_id": "s", "image": "cut.jpg", "series": "A", "level": 0, "view": "Full", "object": "dog",
             "question": "Is there a dog?", "answer": "yes"},
            {"id": 2, "scene_id": "t", "image": "s.png", "series": "A", "level": 0, "view": "Full", "object": "dog",
             "question": "Is there a dog?", "answer": "yes"}]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    queries = PROTOCOLS["dobench"](tmp_path / "do.jsonl")
    assert "truncated" in queries[0].problem and queries[1].problem is None
    out = run(queries, CallableModel(lambda i, p: "yes"), tmp_path / "run", progress=False)
    assert out["invalid"]["dobench"]["invalid_inputs"] == 1


@pytest.mark.parametrize("content, message", [
    (b"", "holds no records"),
    (b'{"id": 1}\n\xe9\n', "line 2.*not UTF-8"),
])
def test_unreadable_jsonl_files_are_errors_naming_the_file(tmp_path, content, message):
    (tmp_path / "do.jsonl").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        PROTOCOLS["dobench"](tmp_path / "do.jsonl")


def test_a_bom_and_a_repeated_id_in_jsonl(tmp_path):
    _png(tmp_path / "s.png")
    row = {"id": 7, "scene_id": "s", "image": "s.png", "series": "A", "level": 0, "view": "Full", "object": "dog",
           "question": "Is there a dog?", "answer": "yes"}
    (tmp_path / "do.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode())  # saved by a Windows editor
    assert len(PROTOCOLS["dobench"](tmp_path / "do.jsonl")) == 1
    (tmp_path / "do.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "level": 1}))
    with pytest.raises(ValueError, match=r"line 2, field 'id': '7' already used on line 1"):
        PROTOCOLS["dobench"](tmp_path / "do.jsonl")


def test_mioh_questions_with_ten_images_are_scored(tmp_path):
    """MIOH lists up to ten images and "none of the above": option k, and "h) image 8", are
    answers (the letters stopped at e, and the second raised IndexError)."""
    from evaluators.query import Query, to_record

    options = [f"image {i}" for i in range(1, 11)] + ["none of the above"]
    q = Query("m", "mioh", [], "in which image ...", "option", "h", {}, options=options)
    assert to_record(q, "h) image 8")["correct"] and to_record(q, "H")["correct"]
    assert to_record(q, "image 8")["correct"] and not to_record(q, "image 10")["correct"]
    assert to_record(q, "k")["parsed"] == "k"


def test_mioh_per_image_answers_are_said_to_go_unasked(tmp_path):
    """``per_image_answers`` was documented "for the decomposed single-image ablation" and
    read by nothing: mioh.ni_decomposed came out empty without a word. The loader now warns."""
    _png(tmp_path / "s.png")
    record = {"id": 1, "task": "existence", "question_type": "selective", "condition": "NI",
              "images": ["s.png", "s.png"], "question": "In which image is there a dog?",
              "options": ["Image 1", "Image 2", "None of the above"], "answer": "a"}
    (tmp_path / "plain.jsonl").write_text(json.dumps(record))
    (tmp_path / "mioh.jsonl").write_text(json.dumps({**record, "per_image_answers": [True, False]}))
    with pytest.warns(UserWarning, match="per_image_answers.*decomposed_accuracy"):
        assert len(PROTOCOLS["mioh"](tmp_path / "mioh.jsonl")) == 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PROTOCOLS["mioh"](tmp_path / "plain.jsonl")


def test_vlm_eval_reads_the_data_before_loading_the_model(tmp_path, monkeypatch, capsys):
    """A bad --data (a missing file, a benchmark given twice) is a usage message at once, not
    after minutes of loading a model."""
    import evaluators.model as model_module
    from evaluators.cli import main

    def loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(model_module, "load_hf", loading)
    _png(tmp_path / "s.png")
    crop = {**_DO_ROW, "series": "B", "level": 2, "view": "Crop", "answer": "no"}  # the B-series: Full view only
    (tmp_path / "crop.jsonl").write_text(json.dumps(crop))
    (tmp_path / "somedir").mkdir()
    for data, said in [(f"dobench={tmp_path / 'nope.jsonl'}", "file not found"),
                       (f"hallusegbench={tmp_path}/a,hallusegbench={tmp_path}/b", "given twice"),
                       (f"dobench={tmp_path / 'crop.jsonl'}", "crop.jsonl, line 1, field 'view'"),
                       (f"reactbench={tmp_path / 'somedir'}", "somedir: is a directory")]:
        with pytest.raises(SystemExit):
            main(["--model", "organism", "--data", data, "--output_path", str(tmp_path / "run")])
        assert said in capsys.readouterr().err


@pytest.mark.parametrize("bench, change, field", [
    ("mioh", {"answer": "Image 1"}, "answer"),  # an option's text, not its letter
    ("mioh", {"answer": "f"}, "answer"),  # past the options
    ("reactbench", {"answer": True}, "answer"),  # a yes/no answer must be yes or no
    ("reactbench", {"question_type": "MC", "answer": "e", "options": ["a", "b", "c", "d"]}, "answer"),
    ("reactbench", {"question_type": "MC", "answer": "a"}, "options"),
    ("reactbench", {"question_type": "SA", "task": "dense_counting", "answer": "twelve"}, "answer"),
])
def test_answers_that_could_never_be_right_are_data_errors(tmp_path, bench, change, field):
    """Each was accepted and then scored wrong on every run (a reviewer's list)."""
    _png(tmp_path / "s.png")
    base = {"mioh": {"id": 1, "task": "existence", "question_type": "selective", "condition": "easy",
                     "images": ["s.png", "s.png"], "question": "In which image is there a dog?",
                     "options": ["Image 1", "Image 2", "None of the above"], "answer": "a"},
            "reactbench": {"id": 1, "task": "relational_erasure", "images": ["s.png"], "question": "A dog?",
                           "question_type": "YN", "answer": "yes"}}[bench]
    (tmp_path / "x.jsonl").write_text(json.dumps(base) + "\n" + json.dumps({**base, "id": 2, **change}))
    with pytest.raises(ValueError, match=rf"line 2, field '{field}'"):
        PROTOCOLS[bench](tmp_path / "x.jsonl")


def test_a_run_resumes_however_its_data_path_is_written(tmp_path, monkeypatch):
    """The fingerprint reads an image file by its name: the same data given by a relative or
    an absolute path, or with a missing image restored, resumes (it had been refused)."""
    _png(tmp_path / "s.png")
    rows = [{"id": i, "scene_id": f"s{i}", "image": "s.png" if i else "gone.png", "series": "A", "level": 0,
             "view": "Full", "object": "dog", "question": "Is there a dog?", "answer": "yes"} for i in range(3)]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    model = CallableModel(lambda i, p: "yes")
    monkeypatch.chdir(tmp_path)
    run(PROTOCOLS["dobench"]("do.jsonl"), model, tmp_path / "run", progress=False)
    _png(tmp_path / "gone.png")
    out = run(PROTOCOLS["dobench"](str(tmp_path / "do.jsonl")), model, tmp_path / "run", progress=False)
    assert out["n_samples"]["dobench"] == 3


def test_a_folder_written_before_fingerprints_is_not_resumed(tmp_path):
    """Its records came from code whose fields (Causal-HalBench's pairs) have since been
    fixed; resuming on them kept the old pairing without a word."""
    from evaluators.runner import RunMismatch

    _png(tmp_path / "s.png")
    row = {"id": 1, "scene_id": "s", "image": "s.png", "series": "A", "level": 0, "view": "Full", "object": "dog",
           "question": "Is there a dog?", "answer": "yes"}
    (tmp_path / "do.jsonl").write_text(json.dumps(row))
    queries = PROTOCOLS["dobench"](tmp_path / "do.jsonl")
    run(queries, CallableModel(lambda i, p: "yes"), tmp_path / "run", progress=False)
    samples = tmp_path / "run" / SAMPLES
    old = [{k: v for k, v in r.items() if k != "query_fingerprint"} for r in read_samples(samples)]
    samples.write_text("".join(json.dumps(r) + "\n" for r in old))
    with pytest.raises(RunMismatch, match="before answers kept"):
        run(queries, CallableModel(lambda i, p: "yes"), tmp_path / "run", progress=False)


def test_hallusegbench_ids_do_not_depend_on_how_the_path_is_written(tmp_path, monkeypatch):
    from evaluators.benchmarks.hallusegbench import load

    _seg_subset(tmp_path / "refer_seg", [_seg_entry(ann_id=7)])
    monkeypatch.chdir(tmp_path / "refer_seg")
    assert {s.id for s in load("data.json")} == {s.id for s in load(".")} == {s.id for s in load(tmp_path / "refer_seg")} \
        == {"refer_seg/7"}


@pytest.mark.parametrize("change, field, message", [
    ({"answer": "?"}, "answer", "no words"),
    ({"synonyms": ["utensil", ""]}, "synonyms", "no words"),
    ({"hint": "none"}, "hint", "another task"),
    ({"images": ["s.png", "s.png"]}, "images", "one image"),
    ({"task": "alteration_tracing", "hint": "none", "inducing": None}, "images", "two images"),
    ({"task": "dense_counting", "answer": "²", "inducing": None}, "answer", "whole number"),
    ({"task": "dense_counting", "answer": "7", "count_query": "interval", "interval": [3, 5], "inducing": None},
     "answer", "outside"),
    ({"question_type": "MC", "answer": "a", "options": [3, 5]}, "options", "non-empty text"),
])
def test_reactbench_records_that_could_not_be_scored_right_are_data_errors(tmp_path, change, field, message):
    """Each of these loaded and was then scored wrong (an empty short answer was said by every
    answer; a count outside its own interval was ignored) or crashed at scoring (a review's list)."""
    from evaluators.data import DataError

    _png(tmp_path / "s.png")
    row = {"id": 1, "task": "relational_erasure", "images": ["s.png"], "question": "What is on the plate?",
           "question_type": "SA", "answer": "the fork", "inducing": "direct", **change}
    (tmp_path / "r.jsonl").write_text(json.dumps(row))
    with pytest.raises(DataError, match=message) as error:
        PROTOCOLS["reactbench"](tmp_path / "r.jsonl")
    assert f"field '{field}'" in str(error.value) and "line 1" in str(error.value)


def test_reactbench_short_answers_are_graded_on_their_content_words_and_unsaid_breakdowns_show(tmp_path):
    from evaluators.benchmarks.reactbench.metrics import breakdown
    from evaluators.query import to_record

    _png(tmp_path / "s.png")
    rows = [{"id": 1, "task": "alteration_tracing", "images": ["s.png", "s.png"], "hint": "none",
             "question": "What changed?", "question_type": "SA", "answer": "the fork was removed"},
            {"id": 2, "task": "relational_erasure", "images": ["s.png"], "question": "Is there a fork?",
             "question_type": "YN", "answer": "no"}]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    traced, erased = PROTOCOLS["reactbench"](tmp_path / "r.jsonl")
    assert traced.truth == [["fork", "removed"]]
    assert to_record(traced, "A fork has been removed.")["correct"]
    assert not to_record(traced, "The fork wasn't removed.")["correct"]
    records = [to_record(erased, "no")]
    assert breakdown(records, "relational_erasure")["not given"] == 100.0  # no inducing dimension given
    assert "not given" not in breakdown([to_record(traced, "a fork was removed")], "alteration_tracing")
    # a count without count_query is graded as an exact count, and broken down as one
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": 3, "task": "dense_counting", "images": ["s.png"],
                                                  "question": "How many forks?", "question_type": "SA", "answer": "4"}))
    (counted,) = PROTOCOLS["reactbench"](tmp_path / "c.jsonl")
    split = breakdown([to_record(counted, "4")], "dense_counting")
    assert split["exact"] == 100.0 and math.isnan(split["interval"]) and "not given" not in split


_DO_ROW = {"id": 1, "scene_id": "s", "image": "s.png", "series": "A", "level": 0, "view": "Full", "object": "dog",
           "question": "Is there a dog?", "answer": "yes"}


@pytest.mark.parametrize("change, field, message", [
    ({"series": "B", "level": 2, "view": "Crop", "answer": "no"}, "view", "only posed in the Full view"),
    ({"series": "B", "level": 0, "view": "Cluster", "answer": "no"}, "view", "only posed in the Full view"),
    ({"answer": "no"}, "answer", "the answer is 'yes'"),
    ({"series": "B", "answer": "yes"}, "answer", "the answer is 'no'"),
    ({"view": "Crop", "margin": float("nan")}, "margin", r"fraction in \(0, 1\)"),
    ({"view": "Crop", "margin": 10.0}, "margin", r"10% is 0.1\), got 10.0"),
    ({"view": "Crop", "margin": -0.5}, "margin", "fraction"),
    ({"view": "Cluster", "margin": 0.1}, "scene_id", "scene 's' already poses A0 in the Cluster view at margin 0.1"),
    ({"view": "Crop"}, "margin", "line 1 names a crop margin and line 2 does not"),
    ({"level": True}, "level", "expected int, got bool"),
])
def test_dobench_records_the_metrics_could_not_score_are_data_errors(tmp_path, change, field, message):
    """Each loaded, was asked of the model, and then left DO-Bench unscored (the reason only in
    results.json's ``_not_computed``; vlm-report stopped with a traceback after running its
    arms): the schema's rules the metrics read records by are checked with the file."""
    from evaluators.data import DataError

    _png(tmp_path / "s.png")
    first = {**_DO_ROW, "view": "Cluster", "margin": 0.1}
    (tmp_path / "do.jsonl").write_text(json.dumps(first) + "\n" + json.dumps({**_DO_ROW, "id": 2, **change}))
    with pytest.raises(DataError, match=message) as error:
        PROTOCOLS["dobench"](tmp_path / "do.jsonl")
    assert f"do.jsonl, line 2, field '{field}'" in str(error.value)


def test_dobench_grid_views_load_and_are_reported(tmp_path):
    """A-series Cluster/Crop views above level 0 are the paper's §4.4 grid (metrics.fn_grid):
    they load, and results.json reports the grid, which no registered metric reads."""
    _png(tmp_path / "s.png")
    rows = [{**_DO_ROW, "id": f"{s}{lv}", "series": s, "level": lv, "answer": "yes" if s == "A" else "no"}
            for s in "AB" for lv in range(4)]
    rows += [{**_DO_ROW, "id": f"A{lv}{v}", "level": lv, "view": v} for lv in (0, 2) for v in ("Cluster", "Crop")]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = run(PROTOCOLS["dobench"](tmp_path / "do.jsonl"), CallableModel(lambda i, p: "yes"), tmp_path / "run",
              progress=False)["results"]["dobench"]
    assert "_not_computed" not in out and out["perception_ability"] == 100.0
    assert out["details"]["fn_grid"][2] == {"Full": 0.0, "Cluster": 0.0, "Crop": 0.0}


def test_causal_halbench_records_the_metrics_could_not_score_are_data_errors(tmp_path):
    """An 'inpaint' question (Q_cf) on an origin image left every Causal-HalBench metric
    unscored; a repeated id was a message naming no file (vlm-eval) or a traceback after
    the model loaded (vlm-report)."""
    from evaluators.data import DataError

    qa = [{"image_name": "a.jpg", "q": "Is there a fork?", "type": "target", "tag": "origin", "id": 1, "answer": "yes"},
          {"image_name": "a.jpg", "q": "Is there a cup?", "type": "inpaint", "tag": "origin", "id": 2, "answer": "yes"}]
    (tmp_path / "qa.json").write_text(json.dumps(qa))
    with pytest.raises(DataError, match=r"qa.json, line 2, field 'type': an 'inpaint' question"):
        PROTOCOLS["causal_halbench"](tmp_path / "qa.json")
    (tmp_path / "qa.json").write_text(json.dumps([qa[0], {**qa[0], "q": "Is there a cup?"}]))
    with pytest.raises(DataError, match=r"qa.json, line 2, field 'id': '1' already used by item 1"):
        PROTOCOLS["causal_halbench"](tmp_path / "qa.json")


def test_hallusegbench_repeated_ids_are_data_errors(tmp_path):
    from evaluators.data import DataError

    _seg_subset(tmp_path / "refer_seg", [_seg_entry(ann_id=4), _seg_entry(ann_id=5), _seg_entry(ann_id=4)])
    with pytest.raises(DataError, match=r"line 3, field 'ann_id': sample 'refer_seg/4' already given by item 1"):
        PROTOCOLS["hallusegbench"](tmp_path / "refer_seg")


@pytest.mark.parametrize("bench, message", [
    ("dobench", "is a directory, not a file: give a JSON Lines file"),
    ("reactbench", "is a directory, not a file: give a JSON Lines file"),
    ("mioh", "is a directory, not a file: give a JSON Lines file"),
    ("causal_halbench", "is a directory without a qa.json"),
    ("hallusegbench", "is a directory with no data.json"),
])
def test_a_directory_given_as_data_is_said_to_be_one(tmp_path, bench, message):
    """It was reported as "file not found" (a JSON Lines benchmark, or Causal-HalBench's
    folder without qa.json), which sent users looking for a typo."""
    from evaluators.data import DataError

    (tmp_path / "somedir").mkdir()
    with pytest.raises(DataError, match=message):
        PROTOCOLS[bench](tmp_path / "somedir")


def test_reactbench_user_short_answers_read_counts_as_counts_and_a_list_of_candidates_as_wrong(tmp_path):
    """An audit, session 39: a short answer "0" was the keyword "0" ("zero" and "There are no
    forks." wrong), and with no vocabulary "yellow, red, green or blue" was right for blue."""
    from evaluators.query import to_record

    _png(tmp_path / "s.png")
    base = {"task": "counterfactual_attribute", "images": ["s.png"], "question_type": "SA", "inducing": "direct"}
    rows = [{**base, "id": 1, "task": "relational_erasure", "question": "How many forks are there?", "answer": "0"},
            {**base, "id": 2, "question": "What colour is the banana?", "answer": "blue"},
            {**base, "id": 3, "question": "What colour is the tree?", "answer": "red", "synonyms": ["crimson"]},
            {**base, "id": 4, "question": "What colour is the cup?", "answer": "yellow"},
            {**base, "id": 5, "question": "What colour is the dog?", "answer": "green"}]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    forks, banana, tree, *_ = PROTOCOLS["reactbench"](tmp_path / "r.jsonl")
    assert forks.kind == "number" and forks.truth == 0
    assert all(to_record(forks, a)["correct"] for a in ("zero", "0", "There are no forks."))
    assert not to_record(forks, "There are two forks.")["correct"]
    assert banana.options == ["blue", "crimson", "green", "red", "yellow"]
    assert to_record(banana, "It is blue.")["correct"]
    assert not to_record(banana, "yellow, red, green or blue")["correct"]
    assert to_record(tree, "crimson")["correct"] and to_record(tree, "red, or crimson")["correct"]


def test_a_dobench_file_without_one_series_says_prior_robust_will_be_nan(tmp_path):
    """A user's walkthrough (session 39): the example's A-series-only file scored
    PriorRobust NaN and an empty language-prior cell without a word."""
    _png(tmp_path / "s.png")
    rows = [{**_DO_ROW, "id": lv, "level": lv} for lv in range(4)]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.warns(UserWarning, match="no records of B0, B1, B2, B3 in the Full view, so PriorRobust"):
        PROTOCOLS["dobench"](tmp_path / "do.jsonl")


def test_a_dobench_file_lacking_levels_or_views_says_which_metric_will_be_nan(tmp_path):
    """Two instances per scene (A0 and B0, Full view) loaded without a word and scored
    PriorRobust and PerceptionAbility NaN (a user review); each NaN headline is named with
    the cells it lacks. A file holding all ten instances is loaded silently."""
    import warnings

    _png(tmp_path / "s.png")
    rows = [{**_DO_ROW, "id": "a0"}, {**_DO_ROW, "id": "b0", "series": "B", "object": "cat", "answer": "no"}]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.warns(UserWarning) as said:
        PROTOCOLS["dobench"](tmp_path / "do.jsonl")
    text = " ".join(str(w.message) for w in said)
    assert "A1, A2, A3, B1, B2, B3 in the Full view, so PriorRobust" in text
    assert "no A0 records in the Cluster or Crop view, so PerceptionAbility" in text
    full = [{**_DO_ROW, "id": f"{s}{lv}", "series": s, "level": lv, "object": "dog" if s == "A" else "cat",
             "answer": "yes" if s == "A" else "no"} for s in "AB" for lv in range(4)]
    full += [{**_DO_ROW, "id": f"A0{v}", "view": v} for v in ("Cluster", "Crop")]
    (tmp_path / "all.jsonl").write_text("\n".join(json.dumps(r) for r in full))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(PROTOCOLS["dobench"](tmp_path / "all.jsonl")) == 10


def test_an_image_changed_in_place_is_not_resumed_onto(tmp_path, capsys):
    """A query knows its image file by name (the fingerprint), so an image fixed or
    re-rendered in place kept its old answer on a rerun into the same folder. The answer
    now stores the file's digest: a changed file is refused, a restored one resumes, and a
    resumed run says how much it found."""
    from evaluators.runner import RunMismatch

    rows = [{**_DO_ROW, "id": f"A{level}", "level": level, "question": f"Is there a dog? ({level})"}
            for level in range(2)]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    _png(tmp_path / "s.png")
    load = lambda: PROTOCOLS["dobench"](tmp_path / "do.jsonl")  # noqa: E731 -- read again each time, as a rerun does
    model = CallableModel(lambda images, prompt: "yes")
    with pytest.warns(UserWarning):  # no B-series: PriorRobust is NaN (the loader says so)
        run(load(), model, tmp_path / "run", progress=False)
    digests = {r["image_sha256"][0] for r in read_samples(tmp_path / "run" / "samples.jsonl")}
    assert len(digests) == 1
    capsys.readouterr()
    _png(tmp_path / "s.png", np.full((32, 32, 3), 200, dtype=np.uint8))  # the same name, other pixels
    with pytest.warns(UserWarning), pytest.raises(RunMismatch, match=r"image files have changed since \(e.g. do-A0: s.png\)"):
        run(load(), model, tmp_path / "run", progress=False)
    _png(tmp_path / "s.png")  # restored: the same bytes, so the same answers stand
    with pytest.warns(UserWarning):
        run(load(), model, tmp_path / "run", progress=False)
    assert "2 of 2 queries already answered there; asking 0" in capsys.readouterr().err
