"""The multi-image retrieval probe's questions and curriculum (no training here)."""

from __future__ import annotations

import numpy as np
import pytest

from evaluators.organism.segment_retrieval import CURRICULUM, FULL, example, form_at, run


def test_questions_name_the_list_that_holds_the_target():
    rng = np.random.default_rng(3)
    for _ in range(200):
        prompt, letter = example(rng, FULL, labels=True)
        body, question = prompt.split(" in which image is there a ")
        target = question.split(" ?")[0]
        lists = [seg.split() for seg in body.removeprefix("USER: image ").split(" image ")]
        n = len(lists)
        assert 2 <= n <= FULL[0] and question.endswith(f"{'abcde'[n]} ) none of the above ASSISTANT:")
        holding = [i for i, seg in enumerate(lists) if target in seg]
        assert len(holding) <= 1  # the target sits in at most one list
        assert letter == ("abcde"[holding[0]] if holding else "abcde"[n])


def test_without_labels_the_lists_come_back_to_back():
    prompt, _ = example(np.random.default_rng(0), (2, 1), labels=False)
    assert prompt.split(" in which image")[0].count("image") == 0


def test_curriculum_stages_and_full_form():
    assert [form_at(s, 100, True) for s in (0, 29, 30, 59, 60, 99)] == [(2, 1), (2, 1), (2, 3), (2, 3), FULL, FULL]
    assert form_at(0, 100, False) == FULL and CURRICULUM[-1][1] == FULL


def test_bad_step_counts_are_errors():
    with pytest.raises(ValueError, match="steps"):
        run(None, None, 0, True, True)
