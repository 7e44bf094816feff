"""evaluators.organism.prior_gap: the three ways of handling a belief sentence, on the
shipped organism (a few DO-Bench scene groups; the 40-group reading is in
docs/results/prior_full.md)."""

from __future__ import annotations

import pytest

from evaluators.organism import ORGANISM_DIR, load_organism
from evaluators.organism.prior_gap import main, measure, table

pytestmark = pytest.mark.skipif(not (ORGANISM_DIR / "config.json").exists(), reason="organism checkpoint missing")


def test_level_zero_is_untouched_and_deletion_reaches_it():
    result = measure(*load_organism(), n_scenes=4, seed=0, resamples=50)
    posed, masked, deleted = (result[k] for k in ("as posed", "context mode (masked, positions kept)",
                                                  "sentence deleted"))
    for way in (masked, deleted):  # level 0 has no belief sentence: nothing to mask or delete
        assert way["A_FN"][0] == posed["A_FN"][0] and way["B_FP"][0] == posed["B_FP"][0]
    # deleting the sentence leaves the level-0 question, so every level answers as level 0
    for level in (1, 2, 3):
        assert deleted["A_FN"][level] == posed["A_FN"][0] and deleted["B_FP"][level] == posed["B_FP"][0]
    assert deleted["prior_robust"] >= posed["prior_robust"]
    compact = result["context mode, compact_positions=True"]
    assert compact["A_FN"] == deleted["A_FN"] and compact["B_FP"] == deleted["B_FP"]  # closing the gap = deleting
    assert table(result).count("\n") == 5
    low, high = deleted["delta"][1:]
    assert low <= deleted["prior_robust"] - posed["prior_robust"] <= high  # the interval holds its delta


def test_bad_scene_count_is_refused():
    with pytest.raises(SystemExit):
        main(["--scenes", "0"])
