"""HalluSegBench asks each model for a box the way its family was trained to be asked
(evaluators/grounding_formats.py): the request's wording, the frame of the answer, the
run's identity, and prose abstentions read as abstentions."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

from evaluators.answers import parse_box
from evaluators.benchmarks.hallusegbench.suite import build as hsb
from evaluators.box_frames import BOX_FRAMES
from evaluators.grounding_formats import (DEFAULT_FORMAT, GROUNDING_FORMATS, MODEL_TYPE_FORMATS, GroundingFormat,
                                          get_grounding_format, register_grounding_format)
from evaluators.model import CallableModel, HFModel
from evaluators.query import Query
from evaluators.runner import RunMismatch, run
from evaluators.world import Scene


def test_family_formats_are_data_about_known_model_types():
    from transformers import CONFIG_MAPPING

    for model_type, name in MODEL_TYPE_FORMATS.items():
        assert model_type in CONFIG_MAPPING and name in GROUNDING_FORMATS, model_type
    for fmt in GROUNDING_FORMATS.values():
        assert fmt.frame is None or fmt.frame in BOX_FRAMES, fmt.name
        if fmt.referring is not None:  # each wording carries what it asks for, and nothing else to fill
            assert "dog" in fmt.words({"expression": "dog"}, "where is the dog ?")
            assert "What barks?" in fmt.words({"question": "What barks?"}, "What barks?")


@pytest.mark.parametrize("model_type, name, frame", [
    ("qwen2_vl", "qwen2_vl", "relative_1000"), ("qwen2_5_vl", "qwen2_5_vl", "pixels"),
    ("qwen3_vl", "qwen3_vl", "relative_1000"), ("internvl", "internvl", "relative_1000"),
    ("paligemma", "paligemma", "pixels"), ("llava", DEFAULT_FORMAT, "pixels"), ("glm4v", DEFAULT_FORMAT, "relative_1000"),
])
def test_a_model_is_asked_in_its_familys_format(model_type, name, frame):
    """The default follows ``config.model_type``; the llava family (the organism among its
    checkpoints) keeps the toolkit's wording; GLM keeps its frame with the toolkit's wording."""
    from hooks.testing import build_tiny_model

    model = HFModel(build_tiny_model(model_type), None)
    assert (model.grounding.name, model.box_frame) == (name, frame)


@pytest.mark.parametrize("model_type, wording, frame", [
    ("qwen3_vl", "qwen2_5_vl", "relative_1000"), ("qwen2_5_vl", "internvl", "pixels"),
    ("glm4v", "qwen2_5_vl", "relative_1000"), ("llava", "qwen3_vl", "relative_1000"), ("llava", "qwen2_5_vl", "pixels"),
])
def test_the_frame_is_the_checkpoints_whatever_wording_asks_it(model_type, wording, frame):
    """A listed family writes its own frame in any wording (Qwen3-VL asked as Qwen2.5-VL is
    still relative to 1000); an unlisted one takes the wording's; ``box_frame`` overrides."""
    from hooks.testing import build_tiny_model

    tiny = build_tiny_model(model_type)
    assert HFModel(tiny, None, grounding_format=wording).box_frame == frame
    assert HFModel(tiny, None, grounding_format=wording, box_frame="relative_1").box_frame == "relative_1"


def test_only_grounding_queries_are_reworded_and_get_the_formats_token_budget(organism):
    """On the organism asked in InternVL's wording with ``max_new_tokens=8``: the box queries
    are generated with the format's 40 new tokens, apart from the yes/no query (8); the
    built-in reasoning split asks its question; the suite's queries themselves are untouched."""
    model, processor = organism
    queries = hsb(n_pairs=1, seed=0)  # referring and reasoning
    other = Query("x", "dobench", [queries[0].images[0]], "is there a dog in the image ?", "yes_no", "yes")
    tester = HFModel(model, processor, max_new_tokens=8, grounding_format="internvl")
    asked = [tester.asked(q) for q in [*queries, other]]
    assert asked[-1] is other
    by_role = {(q.record["split"], q.record["role"]): q.prompt for q in asked[:-1]}
    label = queries[0].record["label"]
    assert by_role["referring", "fact"] == ("Please provide the bounding box coordinate of the region this sentence "
                                            f"describes: <ref>{label}</ref>")
    assert by_role["reasoning", "fact"].endswith(" ?</ref>") and "<ref>where is " in by_role["reasoning", "fact"]
    assert [q.prompt for q in queries] == [q.prompt for q in hsb(n_pairs=1, seed=0)]
    qwen = CallableModel(lambda i, p: "none", grounding_format="qwen2_5_vl")
    for q in queries:  # no article is doubled into a description or a question
        assert not re.search(r"\bthe (the|a|an|something|where)\b", qwen.asked(q).prompt), qwen.asked(q).prompt
    budgets = []
    generate = model.generate

    def spy(*args, **kwargs):
        budgets.append((kwargs["input_ids"].shape[0], kwargs["max_new_tokens"]))
        return generate(*args, **kwargs)

    model.generate = spy
    try:
        answers = tester([*queries, other])
    finally:
        del model.generate
    assert len(answers) == len(queries) + 1 and all(isinstance(a, str) for a in answers)
    assert sorted(budgets) == [(1, 8), (len(queries), 40)]


def _true_box(query, scale):
    key = "counterfactual_scene" if query.record["role"] == "visual" else "factual_scene"
    scene = Scene.from_dict(query.record[key])
    found = [o for o in scene.objects if o.category == query.record["label"]]
    if not found:
        return f"There is no {query.record['label']} in the image."  # a production model's abstention, in prose
    x0, y0, x1, y1 = (v * scale / scene.resolution for v in found[0].box)
    return "```json\n" + json.dumps([{"bbox_2d": [round(v) for v in (x0, y0, x1, y1)], "label": "x"}]) + "\n```"


def test_a_run_asks_in_the_format_reads_in_its_frame_and_resumes_only_under_it(tmp_path):
    """A grounder that answers only the Qwen3-VL wording, with boxes relative to 1000 and
    abstentions in prose: asked in that format it scores what true boxes score (IoU_fact
    below 1: a box against a mask; the abstentions read as abstentions, no unreadable
    answer); asked in the toolkit's wording it answers nothing readable. A resumed run in
    another format is refused, naming it."""
    queries = hsb(n_pairs=3, seed=2, splits=("referring",))
    wording = GROUNDING_FORMATS["qwen3_vl"]
    answers = {(wording.words(q.grounding, q.prompt), q.images[0].tobytes()): _true_box(q, 1000) for q in queries}

    def grounder(images, prompt):
        return answers.get((prompt, images[0].tobytes()), "I am not sure.")

    out = run(queries, CallableModel(grounder, name="g", grounding_format="qwen3_vl"), tmp_path / "qwen", progress=False)
    result = out["results"]["hallusegbench"]
    assert 0.5 < result["iou_fact"] < 1.0
    assert result["unreadable_textual"] == result["unreadable_visual"] == 0
    lines = [json.loads(x) for x in (tmp_path / "qwen" / "samples.jsonl").read_text().splitlines()]
    assert {r["box_frame"] for r in lines} == {"relative_1000"}  # the format's frame: no --box_frame given
    assert all(r["asked_prompt"].startswith("Locate the ") for r in lines)  # what the model read, kept
    plain = run(queries, CallableModel(grounder, name="g"), tmp_path / "plain", progress=False)
    assert plain["results"]["hallusegbench"]["iou_fact"] == 0.0
    with pytest.raises(RunMismatch, match="another --grounding_format"):
        run(queries, CallableModel(grounder, name="g", grounding_format="internvl"), tmp_path / "qwen", progress=False)
    # questions that ask for no box are the same questions in any format: their folder resumes
    from evaluators.benchmarks.dobench.suite import build as dobench

    others = dobench(n_scenes=1, seed=0)[:3]
    run(others, CallableModel(grounder, name="g"), tmp_path / "others", progress=False)
    again = run(others, CallableModel(grounder, name="g", grounding_format="internvl"), tmp_path / "others",
                progress=False)
    assert again["n_samples"]["dobench"] == 3


def test_user_data_reasoning_entries_are_asked_their_question(tmp_path):
    """A native reasoning entry carries a question (and the counterfactual query its own):
    the family's question wording asks it, the referring entries their label."""
    from evaluators.benchmarks.protocols import PROTOCOLS

    Image.fromarray(np.pad(np.full((8, 8), 255, np.uint8), 12)).save(tmp_path / "m.png")
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "f.png")
    Image.fromarray(np.full((32, 32, 3), 9, np.uint8)).save(tmp_path / "c.png")
    entry = {"factual_image_path": "f.png", "factual_mask_path": "m.png", "counterfactual_image_path": "c.png",
             "counterfactual_mask_path": "m.png", "factual_label": "dog", "counterfactual_label": "cat"}
    (tmp_path / "data.json").write_text(json.dumps([
        entry, {**entry, "question": "What barks?", "counterfactual_question": "What meows?"}]))
    asked = []
    model = CallableModel(lambda images, prompt: asked.append(prompt) or "none", grounding_format="qwen2_5_vl")
    run(PROTOCOLS["hallusegbench"](tmp_path / "data.json"), model, tmp_path / "run", progress=False)
    assert sorted(asked) == sorted([
        "Locate the dog, output its bbox coordinates using JSON format.",
        "Locate the cat, output its bbox coordinates using JSON format.",
        "Locate the dog, output its bbox coordinates using JSON format.",
        "What barks? Locate it, and output its bbox coordinates using JSON format.",
        "What meows? Locate it, and output its bbox coordinates using JSON format.",
        "What barks? Locate it, and output its bbox coordinates using JSON format.",
    ])


def test_prose_abstentions_read_as_none_and_prose_without_a_box_stays_unreadable():
    """A sentence abstains only where it denies the asked object and never says it is there;
    a "no" about anything else, with no box drawn, is no abstention (it would have scored a
    hallucinated answer as a perfect one on the counterfactual queries)."""
    for text in ("There is no dog in the image.", "I don't see a dog here.", "There are no dogs in this image.",
                 "The image does not contain a dog.", "Sorry, I cannot find a dog in the image.", "No dog is visible.",
                 "none", "```json\n[]\n```", "[]"):
        assert parse_box(text, 100, subject="dog") == "none", text
    for text in ("The dog has no collar and is lying on the grass to the left.", "I can see a dog, but no cat.",
                 "Sure! The dog is on the left. No other dogs are present.", "The dog does not have a leash.",
                 "There is no need to locate it, the dog is in the center.", "Yes, there is a dog.", "I am not sure.",
                 "There is no such object in the image.", ""):
        assert parse_box(text, 100, subject="dog") is None, text
    assert parse_box("There is no dog in the image.", 100) is None  # no subject: only "none" / "no" abstain
    assert parse_box("There is no cat, but the dog is at [10, 20, 30, 40].", 100, subject="dog") == (10, 20, 30, 40)


def test_bad_formats_and_grounding_fields_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown grounding_format 'qwen3'.*Did you mean"):
        get_grounding_format("qwen3")
    with pytest.raises(ValueError, match="already registered"):
        register_grounding_format(GroundingFormat("qwen3_vl", "{expression}", "{question}"))
    with pytest.raises(ValueError, match="needs \\{expression\\}"):
        register_grounding_format(GroundingFormat("mine", "find it", "{question}"))
    with pytest.raises(ValueError, match="both templates or neither"):
        register_grounding_format(GroundingFormat("mine", "{expression}", None))
    with pytest.raises(ValueError, match="box_frame 'relative_100'"):
        register_grounding_format(GroundingFormat("mine", "{expression}", "{question}", "relative_100"))
    assert "mine" not in GROUNDING_FORMATS
    with pytest.raises(ValueError, match="grounding must hold exactly one of"):
        Query("x", "hallusegbench", [], "where is the dog ?", "text", None, grounding={"label": "dog"})
    with pytest.raises(ValueError, match="non-empty string"):
        Query("x", "hallusegbench", [], "where is the dog ?", "text", None, grounding={"expression": " "})
    with pytest.raises(ValueError, match="grounding_format"):
        CallableModel(lambda i, p: "none", grounding_format="qwen")
    from evaluators.cli import main

    with pytest.raises(SystemExit):
        main(["--model", "organism", "--tasks", "hallusegbench", "--grounding_format", "qwen",
              "--output_path", str(tmp_path / "x")])
    assert "invalid choice: 'qwen'" in capsys.readouterr().err


def test_the_cli_asks_the_organism_in_a_chosen_format(tmp_path):
    """``vlm-eval --grounding_format internvl`` on the organism (a llava checkpoint, the
    toolkit's wording by default): the run records the format, and the boxes are read in
    its frame."""
    from evaluators.cli import main

    assert main(["--model", "organism", "--tasks", "hallusegbench", "--limit", "2", "--grounding_format", "internvl",
                 "--no_progress", "--output_path", str(tmp_path / "y")]) == 0
    result = json.loads((tmp_path / "y" / "results.json").read_text())
    assert (result["config"]["grounding_format"], result["config"]["box_frame"]) == ("internvl", "relative_1000")
    lines = [json.loads(x) for x in (tmp_path / "y" / "samples.jsonl").read_text().splitlines()]
    assert lines and {r["box_frame"] for r in lines} == {"relative_1000"}


def test_cannot_denies_only_with_a_verb_of_seeing():
    """"cannot" before see / find ... and then the object denies it; before any other verb,
    or after the answer said the object is there, it does not (a review of this session's
    first version, which read "cannot" as "not" in parse_yes_no too: that reading is
    unchanged)."""
    from evaluators.answers import denies, parse_yes_no

    assert denies("Sorry, I cannot find a dog in the image.", "dog") and denies("I cannot find any dogs.", "a dog")
    for text in ("There is a dog, but I cannot see the dog clearly.", "I cannot identify the dog breed.",
                 "The cat cannot reach the dog.", "I cannot see a cat, but the dog is there"):
        assert not denies(text, "dog"), text
    assert parse_yes_no("There is a dog, but I cannot see the dog clearly.", "dog") is True
    assert parse_yes_no("The cat cannot reach the dog.", "dog") is None


def test_the_reasoning_split_abstains_by_its_description_and_paligemma_by_saying_nothing(tmp_path):
    """A reasoning query asks for "an animal that barks": denying that abstains as denying
    "dog" does. PaliGemma's detect answers nothing for nothing found: an empty answer
    abstains under its format, and stays unreadable under any other."""
    queries = [q for q in hsb(n_pairs=3, seed=2) if q.record["split"] == "reasoning"]

    def prose(images, prompt):
        q = next(q for q in queries if q.prompt == prompt and q.images[0].tobytes() == images[0].tobytes())
        truth = _true_box(q, 1000)
        return truth if truth.startswith("```") else f"There is no {q.record['described']} in this image."

    out = run(queries, CallableModel(prose, name="p", box_frame="relative_1000"), tmp_path / "prose", progress=False)
    result = out["results"]["hallusegbench"]
    assert result["unreadable_textual"] == result["unreadable_visual"] == 0 and result["iou_fact"] > 0.5

    referring = hsb(n_pairs=3, seed=2, splits=("referring",))

    def detect(images, prompt):
        q = next(q for q in referring if GROUNDING_FORMATS["paligemma"].words(q.grounding, q.prompt) == prompt
                 and q.images[0].tobytes() == images[0].tobytes())
        truth = _true_box(q, 1024)
        if not truth.startswith("```"):
            return ""
        x0, y0, x1, y1 = json.loads(truth.strip("`json\n"))[0]["bbox_2d"]
        return "".join(f"<loc{v:04d}>" for v in (y0, x0, y1, x1)) + " " + q.record["label"]

    scores = {}
    for name in ("paligemma", "toolkit"):
        payload = run(referring, CallableModel(detect if name == "paligemma" else (lambda i, p: ""), name=name,
                                               grounding_format=name), tmp_path / name, progress=False)
        scores[name] = payload["results"]["hallusegbench"]
    assert scores["paligemma"]["unreadable_textual"] == scores["paligemma"]["unreadable_visual"] == 0
    assert scores["paligemma"]["iou_fact"] > 0.5
    assert scores["toolkit"]["unreadable_textual"] == 1.0  # an empty answer in another format says nothing
    lines = [json.loads(x) for x in (tmp_path / "paligemma" / "samples.jsonl").read_text().splitlines()]
    assert all(r["empty_abstains"] for r in lines)
