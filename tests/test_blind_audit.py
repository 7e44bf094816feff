"""The image-blind audit: text-only rules fitted on one seed, scored on another."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evaluators.benchmarks.blind_audit import PAPER_MADE, audit, both_ways, format_table, main, split_units, template
from evaluators.query import Query


def _yes_no(i: int, prompt: str, truth: str, **record) -> Query:
    return Query(f"q{i}", "toy", [], prompt, "yes_no", truth, {"task": "toy", **record})


def test_template_masks_objects_colours_numbers_their_plurals_and_digits():
    assert template("Is the red fork left of two cups ?") == "is the _ _ left of _ _ ?"
    assert template("was the bench's leg moved 3 times ?") == "was the _ leg moved _ times ?"
    from evaluators.benchmarks.blind_audit import mask_words
    assert template("is there a traffic light ?", mask_words(["traffic light"])) == "is there a _ _ ?"


def test_a_verb_that_tells_the_answer_is_found_and_a_fair_set_is_not():
    """A toy of the leak session 34's review found by hand ("was the X moved ?" mostly yes):
    the template rule finds it; with the truth drawn apart from the wording no rule gains."""
    rng = np.random.default_rng(0)
    objects = ("fork", "cup", "dog", "tree", "bench")

    def draw(n, leaky):
        out = []
        for i in range(n):
            verb = ("moved", "added")[int(rng.integers(2))]
            truth = ("yes" if verb == "moved" else "no") if leaky else ("yes", "no")[int(rng.integers(2))]
            out.append(_yes_no(i, f"was the {objects[int(rng.integers(5))]} {verb} ?", truth))
        return out

    (leak,) = audit(both_ways(draw(200, True), draw(200, True)))
    assert leak.accuracy["template"] == 100.0 and leak.lift > 40 and leak.best_rule == "template"
    assert leak.n_test == 400  # both ways round
    (fair,) = audit(both_ways(draw(400, False), draw(400, False)))
    assert fair.lift < 6, fair.accuracy


def _always_neither(rng, n, n_options=3):
    out = []
    for i in range(n):
        options = ["neither", "a dog", "a dog reading a book", "a cat", "a bird", "a cup", "a fork", "a tree"][:n_options]
        rng.shuffle(options)
        letter = "abcdefgh"[options.index("neither")]
        out.append(Query(f"q{i}", "toy", [], "which is in the image ?", "option", letter, {"task": "toy"},
                         options=list(options)))
    return out


def test_an_option_that_is_always_right_is_found_wherever_it_stands_among_any_number_of_options():
    rng = np.random.default_rng(1)
    for n_options in (3, 8):
        (row,) = audit(both_ways(_always_neither(rng, 90, n_options), _always_neither(rng, 90, n_options)))
        assert row.accuracy["option"] == 100.0 and row.accuracy["constant"] < 50 and row.group[-1] == n_options
        assert f"| {row.n_test} | {row.accuracy['constant']:.1f} |" in format_table([row])


def test_groups_keep_apart_what_the_prompt_shows_and_skip_what_it_cannot_score():
    fit = [_yes_no(0, "is there a cup ?", "yes", level=0), _yes_no(1, "is there a cup ?", "no", level=1),
           Query("m", "toy", [], "where is the cup ?", "text", None, {})]
    rows = audit([(fit, fit)])
    assert sorted(r.fields["level"] for r in rows) == [0, 1] and all(r.n_test == 1 for r in rows)


def test_the_built_in_suites_leak_no_more_than_their_papers_make_them():
    """At --scale large (48 items a ReactBench group; at full, 12 items give chance lifts of
    25-33 points), fitted and scored across seeds 10, 11 and 20: no group that the papers'
    designs do not explain is answered 12 points above its constant answer by a text-only
    rule, every paper-made group stays within the lift its entry allows (a larger one, as the
    old MIOH hard negatives added to the LC pressure, is flagged), and every PAPER_MADE entry
    still names a group. Run on the suites before session 31 (d9cb313^), this flags
    Causal-HalBench's object word (+28.1), MIOH's hard negatives without their target (+25.2
    where the LC entry allows 20) and relational erasure's never-right cue option (+18.1);
    session 34's alteration-tracing leaks were below its reach and keep their own test in
    test_suites.py."""
    from evaluators.benchmarks.suites import SUITE_NAMES, build_suite

    rows = [r for task in SUITE_NAMES
            for r in audit(both_ways(*(build_suite(task, s, "large") for s in (10, 11, 20))))]
    assert [(r.benchmark, r.group, round(r.lift, 1)) for r in rows if r.lift >= 12 and r.paper_made() is None] == []
    for made in PAPER_MADE:
        assert any(r.paper_made() == made for r in rows), made.why


def _do_rows(objects):
    from evaluators.organism.tasks import do_prior, existence_question

    return [{"id": f"{k}{s}{lv}", "scene_id": f"s{k}", "image": "s.png", "series": s, "level": lv, "view": "Full",
             "object": obj, "answer": "yes" if s == "A" else "no",
             "question": existence_question(obj, do_prior(lv, obj, s == "A"))}
            for k, obj in enumerate(objects) for s in "AB" for lv in range(4)]


def test_your_data_is_audited_on_two_halves_of_whole_samples(tmp_path, capsys):
    """--data reads a benchmark file as vlm-eval does and splits it by a hash of each sample,
    so neither the file's order nor a sample's several questions decide the halves. Here
    DO-Bench's own templates, whose beliefs contradict the truth (paper-made); the images
    need not exist for a text audit."""
    from evaluators.benchmarks.protocols import load_data

    objects = ["sofa", "lamp", "kettle", "goat", "drum", "vase", "piano", "sled", "kite", "owl", "mug", "hat"]
    (tmp_path / "do.jsonl").write_text("\n".join(json.dumps(r) for r in _do_rows(objects)))
    fit, test = split_units(load_data({"dobench": tmp_path / "do.jsonl"}))
    assert fit and test and {q.record["scene_id"] for q in fit}.isdisjoint({q.record["scene_id"] for q in test})
    assert main(["--tasks", "", "--data", f"dobench={tmp_path / 'do.jsonl'}", "--mask", ",".join(objects)]) == 0
    out = capsys.readouterr().out
    assert "| dobench | yes_no | 1 | 24 | 50.0 | 100.0 |" in out and "paper-made" in out


def test_questions_without_a_unit_split_by_their_images_not_their_order():
    """A review's case: one "yes" and one "no" question per image, no unit field; alternating
    in file order put every "yes" in one half and every "no" in the other."""
    from pathlib import Path

    from evaluators.data import ImageRef

    queries = [Query(f"{k}{t}", "toy", [ImageRef(Path(f"/nowhere/{k}.png"))],
                     f"was the dog {'moved' if t == 'yes' else 'added'} ?", "yes_no", t, {"task": "toy"})
               for k in range(40) for t in ("yes", "no")]
    fit, test = split_units(queries)
    assert {q.truth for q in fit} == {q.truth for q in test} == {"yes", "no"}
    assert all(sum(q.images[0].path == p.images[0].path for p in fit) in (0, 2) for q in queries)
    (row,) = audit(both_ways(fit, test))
    assert row.accuracy["template"] == 100.0


def test_the_command_line_names_bad_seeds_tasks_and_data(tmp_path, capsys):
    for argv, said in [(["--seeds", "3,3"], "two or more different seeds"), (["--seeds", "3"], "two or more"),
                       (["--tasks", "pope"], "unknown task"), (["--data", "pope=x.jsonl"], "unknown benchmark")]:
        with pytest.raises(SystemExit):
            main(argv)
        assert said in capsys.readouterr().err, argv
    assert main(["--tasks", " dobench", "--scale", "small", "--min-lift", "20"]) == 0
    out = capsys.readouterr().out
    assert "paper-made [1]" in out and "DO-Bench Sec. 3.2" in out
    assert main(["--tasks", "hallusegbench", "--scale", "small"]) == 1  # masks only: nothing a text rule scores
    assert "nothing to audit" in capsys.readouterr().out
