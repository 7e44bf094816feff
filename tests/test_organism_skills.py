"""The organism's skills table: scoring on hand-made answers, and the shipped checkpoint's
learned / not-learned split, so that the model card's skills section stays true."""

from __future__ import annotations

import pytest
import torch

from evaluators.organism import ORGANISM_DIR, load_organism
from evaluators.organism.signatures import Probe
from evaluators.organism.skills import belief_answer, caption_f1, correct, measure, probes, score, table


def _rows(task, truths):
    return [Probe([], "q", t, task) for t in truths]


def test_exact_match_ignores_case_and_punctuation():
    assert correct("colour", "red", " Red .")
    assert not correct("colour", "red", "red blue")
    assert correct("which_image", "b", "b")


def test_grounding_needs_iou_half_or_none():
    truth = "<c0> <c0> <c7> <c7>"  # bins of 8 px: (0, 0, 64, 64)
    assert correct("grounding", truth, "<c0> <c0> <c7> <c7>")
    assert correct("grounding", truth, "<c0> <c0> <c7> <c5>")  # IoU 0.75
    assert not correct("grounding", truth, "<c0> <c0> <c3> <c3>")  # IoU 0.25
    assert not correct("grounding", truth, "none")
    assert correct("grounding", "none", "none") and not correct("grounding", "none", truth)


def test_caption_f1_reads_categories_only():
    assert caption_f1("red cup , blue fork .", "green fork , red cup .") == 1.0
    assert caption_f1("red cup , blue fork .", "red cup .") == pytest.approx(2 / 3)
    assert caption_f1("red cup .", "blue dog .") == 0.0


def test_score_compares_with_the_best_constant_answer():
    rows = _rows("colour", ["red"] * 6 + ["blue"] * 4)
    # a model that always says the most frequent answer is the baseline itself: not learned
    same = score("colour", rows, ["red"] * 10)
    assert same["baseline_answer"] == 'constant "red"' and same["score"] == same["baseline"] == 60.0
    assert not same["learned"]
    # right everywhere, on enough probes: learned, with an interval above 0
    many = _rows("colour", ["red"] * 30 + ["blue"] * 20)
    right = score("colour", many, [p.truth for p in many])
    assert right["score"] == 100.0 and right["baseline"] == 60.0 and right["learned"] and right["low"] > 0
    with pytest.raises(ValueError, match="answers"):
        score("colour", rows, ["red"])


def test_caption_baseline_tries_lists_of_the_most_frequent_categories():
    """A constant list naming the frequent categories beats every single true caption on F1."""
    rows = _rows("caption", ["red cup , blue fork .", "red cup , green dog .", "blue fork , green dog ."])
    result = score("caption", rows, ["red cup ."] * 3)
    assert result["metric"] == "category F1"
    # "cup fork dog" scores F1 0.8 on each; any true caption 1 + 0.5 + 0.5 over three
    assert result["baseline_answer"].startswith("constant") and result["baseline"] == pytest.approx(80.0)
    assert not result["learned"]


def test_prior_existence_baseline_follows_the_belief():
    """Where the belief is mostly right, answering as it says is the baseline to beat."""
    rows = [Probe([], "q", truth, "prior_existence", {"belief_right": right})
            for truth, right in [("yes", True), ("no", True), ("yes", True), ("no", False)] * 10]
    echo = score("prior_existence", rows, [belief_answer(p) for p in rows])
    assert echo["baseline_answer"] == "the belief sentence's answer" and echo["baseline"] == 75.0
    assert echo["score"] == 75.0 and not echo["learned"]
    assert belief_answer(Probe([], "q", "yes", "existence")) is None


def test_bad_task_and_count_are_errors():
    with pytest.raises(ValueError, match="task"):
        probes("juggling", 3)
    with pytest.raises(ValueError, match="n must be"):
        probes("existence", 0)


@pytest.mark.skipif(not (ORGANISM_DIR / "config.json").exists(), reason="organism checkpoint missing")
def test_shipped_organism_learned_existence_and_colour_not_multi_image():
    """The card's split on 200 held-out probes per task (a few seconds each): existence and
    colour beat their constant answer; the multi-image choice does not. A retrain that
    teaches "in which image" fails here and asks for the card and this test to move."""
    model, processor = load_organism()
    with torch.no_grad():
        result = measure(model, processor, 200, only=["existence", "colour", "which_image"])
    assert result["existence"]["learned"] and result["colour"]["learned"]
    assert not result["which_image"]["learned"]
    assert "| which_image |" in table(result)
