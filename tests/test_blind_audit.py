"""The image-blind audit: text-only rules fitted on one seed, scored on another."""

from __future__ import annotations

import numpy as np
import pytest

from evaluators.benchmarks.blind_audit import PAPER_MADE, audit, format_table, main, template
from evaluators.query import Query


def _yes_no(i: int, prompt: str, truth: str, **record) -> Query:
    return Query(f"q{i}", "toy", [], prompt, "yes_no", truth, {"task": "toy", **record})


def test_template_masks_object_colour_and_number_words():
    assert template("Is the red fork left of two cups ?") == "is the _ _ left of _ cups ?"
    assert template("was the bench moved ? answer yes or no .") == "was the _ moved ? answer yes or no ."


def test_a_verb_that_tells_the_answer_is_found_and_a_fair_set_is_not():
    """The leak session 34's review found by hand ("was the X moved ?" mostly yes) is what the
    template rule finds; with the truth drawn apart from the wording, no rule gains."""
    rng = np.random.default_rng(0)
    objects = ("fork", "cup", "dog", "tree", "bench")

    def draw(n, leaky):
        out = []
        for i in range(n):
            verb = ("moved", "added")[int(rng.integers(2))]
            truth = ("yes" if verb == "moved" else "no") if leaky else ("yes", "no")[int(rng.integers(2))]
            out.append(_yes_no(i, f"was the {objects[int(rng.integers(5))]} {verb} ?", truth))
        return out

    (leak,) = audit(draw(200, True), draw(200, True))
    assert leak.accuracy["template"] == 100.0 and leak.lift > 40 and leak.best_rule == "template"
    (fair,) = audit(draw(400, False), draw(400, False))
    assert fair.lift < 8, fair.accuracy


def test_an_option_that_is_always_right_is_found_wherever_it_stands():
    rng = np.random.default_rng(1)

    def draw(n):
        out = []
        for i in range(n):
            options = ["neither", "a dog", "a dog reading a book"]
            rng.shuffle(options)
            letter = "abc"[options.index("neither")]
            out.append(Query(f"q{i}", "toy", [], "which is in the image ?", "option", letter, {"task": "toy"},
                             options=list(options)))
        return out

    (row,) = audit(draw(90), draw(90))
    assert row.accuracy["option"] == 100.0 and row.accuracy["constant"] < 50
    assert "option" in format_table([row])


def test_groups_keep_apart_what_the_prompt_shows_and_skip_what_it_cannot_score():
    fit = [_yes_no(0, "is there a cup ?", "yes", level=0), _yes_no(1, "is there a cup ?", "no", level=1),
           Query("m", "toy", [], "where is the cup ?", "text", None, {})]
    rows = audit(fit, fit)
    assert sorted(r.fields["level"] for r in rows) == [0, 1] and all(r.n_test == 1 for r in rows)


def test_the_built_in_suites_leak_no_more_than_their_papers_make_them():
    """At --scale large (48 items a ReactBench group; at full, 12 items leave a chance lift of
    +25), fitted on seed 10 and scored on seed 11: every group that a text-only rule answers
    15 points above its constant answer is one the paper's own protocol makes (PAPER_MADE),
    and every PAPER_MADE entry still names such a group. Run on the suites as they were
    before session 31's fixes (d9cb313^), it flags Causal-HalBench's object word (+27.8,
    fixed in session 33) and dense counting's never-right intervals (+18.7); session 34's
    leaks (a kind pair, the other object's draw) lift these generic rules by 8 points at
    most, below its reach, so those keep their own tests in test_suites.py."""
    from evaluators.benchmarks.suites import SUITE_NAMES, build_suite

    rows = [r for task in SUITE_NAMES for r in audit(build_suite(task, 10, "large"), build_suite(task, 11, "large"))]
    flagged = [r for r in rows if r.lift >= 15]
    assert [(r.benchmark, r.group, round(r.lift, 1)) for r in flagged if r.paper_made() is None] == []
    for bench, match, why in PAPER_MADE:
        assert any(r.paper_made() == why for r in flagged), (bench, match)


def test_the_command_line_names_bad_seeds_and_tasks(capsys):
    with pytest.raises(SystemExit):
        main(["--fit-seed", "3", "--seed", "3"])
    assert "must differ" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--tasks", "pope"])
    assert "unknown task" in capsys.readouterr().err
    assert main(["--tasks", "dobench", "--scale", "small", "--min-lift", "20"]) == 0
    out = capsys.readouterr().out
    assert "paper-made [1]" in out and "DO-Bench Sec. 3.2" in out


def test_your_data_is_audited_on_alternate_samples(tmp_path, capsys):
    """--data reads a benchmark file as vlm-eval does and fits on every other sample: here
    DO-Bench's own templates, whose beliefs contradict the truth (paper-made)."""
    import json

    from PIL import Image

    from evaluators.benchmarks.blind_audit import split_units
    from evaluators.benchmarks.protocols import load_data
    from evaluators.organism.tasks import do_prior, existence_question

    Image.new("RGB", (8, 8)).save(tmp_path / "s.png")
    rows = [{"id": f"{k}{s}{lv}", "scene_id": f"s{k}", "image": "s.png", "series": s, "level": lv, "view": "Full",
             "object": obj, "answer": "yes" if s == "A" else "no",
             "question": existence_question(obj, do_prior(lv, obj, s == "A"))}
            for k, obj in enumerate(["sofa", "lamp", "kettle", "goat", "drum", "vase"]) for s in "AB" for lv in range(4)]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    fit, test = split_units(load_data({"dobench": tmp_path / "do.jsonl"}))
    assert {q.record["scene_id"] for q in fit} == {"s0", "s2", "s4"} and len(test) == 24
    assert main(["--tasks", "", "--data", f"dobench={tmp_path / 'do.jsonl'}", "--mask", "sofa,lamp,kettle,goat,drum,vase"]) == 0
    out = capsys.readouterr().out
    assert "| dobench | yes_no | 1 | 6 | 50.0 | 100.0 |" in out and "paper-made" in out
    with pytest.raises(SystemExit):
        main(["--data", "pope=x.jsonl"])
    assert "unknown benchmark" in capsys.readouterr().err
