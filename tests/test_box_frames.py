"""Box answers in the coordinate frames production VLMs write (evaluators/box_frames.py):
read into the asked image's pixels, chosen per model family as data, carried by each
HalluSegBench record from the run to its rescoring."""

from __future__ import annotations

import json

import pytest

from evaluators.answers import parse_box
from evaluators.box_frames import BOX_FRAMES, MODEL_TYPE_FRAMES, default_box_frame, get_box_frame

W, H = 640, 480
# the same box, (64, 96) to (320, 288) in pixels of a 640 x 480 image, as each family writes it
WRITTEN = [
    ('[{"bbox_2d": [100, 200, 500, 600], "label": "dog"}]', "relative_1000"),  # Qwen3-VL
    ("<ref>dog</ref><box>[[100, 200, 500, 600]]</box>", "relative_1000"),  # InternVL
    ("dog(100,200),(500,600)", "relative_1000"),  # Qwen2-VL, its box tokens decoded away
    ("[100,200,500,600]", "relative_1000"),  # GLM-4.xV
    ("[0.1, 0.2, 0.5, 0.6]", "relative_1"),
    ("[64, 96, 320, 288]", "pixels"),
]


@pytest.mark.parametrize("text, frame", WRITTEN)
def test_each_written_form_reads_into_the_images_pixels(text, frame):
    assert parse_box(text, W, height=H, frame=frame) == pytest.approx((64, 96, 320, 288))
    if frame != "pixels":  # read as pixels, the same answer is another box: the bug this fixes
        assert parse_box(text, W, height=H) != pytest.approx((64, 96, 320, 288))


def test_token_forms_say_their_own_frame():
    """PaliGemma's <loc> tokens (1024 bins, y first) and the organism's <c> tokens read the
    same in any frame; corners out of order are no box."""
    for frame in BOX_FRAMES:
        assert parse_box("<loc0256><loc0128><loc0768><loc0512> dog", W, height=H, frame=frame) == (80, 120, 320, 360)
        assert parse_box("<c1> <c2> <c3> <c4>", W, height=H, frame=frame) == (40, 60, 160, 150)
    assert parse_box("<loc0768><loc0128><loc0256><loc0512>", W, height=H) is None
    assert parse_box("<loc1024><loc0128><loc0256><loc0512>", W, height=H) is None


def test_what_is_no_box_stays_no_box_in_every_frame():
    for frame in BOX_FRAMES:
        assert parse_box("[500, 200, 100, 600]", W, height=H, frame=frame) is None  # x1 < x0
        assert parse_box("[1, 2]", W, height=H, frame=frame) is None  # the first list decides
        assert parse_box("none of them", W, height=H, frame=frame) == "none"
    # a bracket that is not JSON, or a list that is no box, no longer hides the box after it
    assert parse_box("[dog] at [10, 20, 50, 60]", W, height=H) == (10, 20, 50, 60)
    assert parse_box('{"point_2d": [1, 2], "bbox_2d": [100, 200, 500, 600]}', W, height=H,
                     frame="relative_1000") == pytest.approx((64, 96, 320, 288))
    with pytest.raises(ValueError, match="box_frame 'relative_100'.*relative_1000"):
        parse_box("[1, 2, 3, 4]", W, frame="relative_100")


def test_family_defaults_are_data_about_known_model_types():
    from transformers import CONFIG_MAPPING

    from hooks.testing import build_tiny_model

    for model_type, frame in MODEL_TYPE_FRAMES.items():
        assert model_type in CONFIG_MAPPING and frame in BOX_FRAMES, model_type
    for model_type, frame in (("qwen2_vl", "relative_1000"), ("internvl", "relative_1000"),
                              ("llava", "pixels"), ("paligemma", "pixels")):
        assert default_box_frame(build_tiny_model(model_type)) == frame
    assert get_box_frame("relative_1000").scale == 1000


def _true_box_answers(queries, frame):
    """Per query, the asked object's true box written in ``frame`` on its image (an abstention
    where the object is not there): what a model that grounds perfectly would write."""
    from evaluators.world import Scene

    answers = {}
    for q in queries:
        key = "counterfactual_scene" if q.record["role"] == "visual" else "factual_scene"
        scene = Scene.from_dict(q.record[key])
        found = [o for o in scene.objects if o.category == q.record["label"]]
        if not found:
            answers[q.id] = "none"
            continue
        x0, y0, x1, y1 = found[0].box
        r = scene.resolution
        scale = {"pixels": 1.0, "relative_1000": 1000 / r, "relative_1": 1 / r}[frame]
        answers[q.id] = json.dumps([{"bbox_2d": [round(v * scale, 3) for v in (x0, y0, x1, y1)], "label": "x"}])
    return answers


def test_a_run_reads_each_answer_in_its_models_frame_and_stores_it(tmp_path):
    """HalluSegBench end to end through the runner: a model that writes the true boxes in
    relative_1000 scores the IoU_fact of one writing them in pixels (a box against the
    object's mask: below 1) when its frame is known, and about 0 read as pixels (as before
    box frames); each record stores the frame, so the rescoring of a resumed run reads them
    the same; records of benchmarks that read no boxes carry none."""
    from evaluators.benchmarks.dobench.suite import build as dobench
    from evaluators.benchmarks.hallusegbench.suite import build as hsb
    from evaluators.model import CallableModel
    from evaluators.runner import run, score

    queries = hsb(n_pairs=3, seed=2, splits=("referring",))
    others = dobench(n_scenes=1, seed=0)[:2]

    def grounder(written, asked=None):
        answers = _true_box_answers(queries, written)
        by_prompt = {(q.prompt, q.images[0].tobytes()): answers[q.id] for q in queries}

        def answer(images, prompt):
            if asked is not None:
                asked.append(prompt)
            return by_prompt.get((prompt, images[0].tobytes()), "no")
        return answer

    scores = {}
    for written, frame in (("pixels", "pixels"), ("relative_1000", "relative_1000"), ("relative_1000", "pixels")):
        model = CallableModel(grounder(written), name=f"grounder-{written}", box_frame=frame)
        folder = tmp_path / f"{written}-read-as-{frame}"
        payload = run(queries + others, model, folder, progress=False)
        scores[written, frame] = payload["results"]["hallusegbench"]["iou_fact"]
        lines = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]
        assert all(r["box_frame"] == frame for r in lines if r["benchmark"] == "hallusegbench")
        assert not any("box_frame" in r for r in lines if r["benchmark"] == "dobench")
        # samples.jsonl alone (no model) scores as the run did: each record says its frame
        assert score([r for r in lines if r["benchmark"] == "hallusegbench"])["results"]["hallusegbench"][
            "iou_fact"] == scores[written, frame]
    truth = scores["pixels", "pixels"]
    assert 0.5 < truth < 1.0
    assert scores["relative_1000", "relative_1000"] == pytest.approx(truth, abs=0.02)
    assert scores["relative_1000", "pixels"] < 0.1, scores
    # the run read in the wrong frame, resumed under the right one: nothing is asked again
    # (the frame is no part of the run's identity), every stored answer is read in it
    folder = tmp_path / "relative_1000-read-as-pixels"
    asked = []
    fixed = CallableModel(grounder("relative_1000", asked), name="grounder-relative_1000", box_frame="relative_1000")
    again = run(queries + others, fixed, folder, progress=False)
    assert not asked and again["results"]["hallusegbench"]["iou_fact"] == scores["relative_1000", "relative_1000"]
    lines = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]
    assert all(r["box_frame"] == "relative_1000" for r in lines if r["benchmark"] == "hallusegbench")
    with pytest.raises(ValueError, match="box_frame"):
        CallableModel(grounder("pixels"), box_frame="pixel")


def test_the_cli_takes_a_box_frame_and_refuses_an_unknown_one(tmp_path, capsys):
    from evaluators.cli import main

    with pytest.raises(SystemExit):
        main(["--model", "organism", "--tasks", "hallusegbench", "--box_frame", "normalised",
              "--output_path", str(tmp_path / "x")])
    assert "invalid choice: 'normalised'" in capsys.readouterr().err
    assert main(["--model", "organism", "--tasks", "hallusegbench", "--limit", "3", "--box_frame", "relative_1000",
                 "--no_progress", "--output_path", str(tmp_path / "y")]) == 0
    lines = [json.loads(x) for x in (tmp_path / "y" / "samples.jsonl").read_text().splitlines()]
    assert lines and all(r["box_frame"] == "relative_1000" for r in lines)
