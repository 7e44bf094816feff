"""The shipped organism still hallucinates for the reasons it was built to: a retrain that
loses a mechanism fails here. A small fixed probe set (seconds on CPU), greedy decoding.

Thresholds sit below the figures this probe set gives the shipped checkpoint (24 probes
per group; the model card in ``evaluators/organism/checkpoint/README.md`` has 100 per
group) by a margin for numerical differences across platforms. Targets the shipped
checkpoint does *not* meet yet are strict xfails: a better retrain turns them into
failures that ask for the threshold to move up, so the card and this file stay true.
"""

from __future__ import annotations

import pytest
import torch

from evaluators.organism import ORGANISM_DIR, load_organism
from evaluators.organism.signatures import answer, build_probes, score

pytestmark = pytest.mark.skipif(not (ORGANISM_DIR / "config.json").exists(), reason="organism checkpoint missing")
NOT_YET = pytest.mark.xfail(strict=True, reason="target not met by the shipped checkpoint (see its model card)")


@pytest.fixture(scope="module")
def measured():
    model, processor = load_organism()
    probes = build_probes(24)
    with torch.no_grad():
        return score(probes, answer(model, processor, probes, batch_size=24))


@pytest.fixture(scope="module")
def card_groups():
    """The card's own 100 probes of clean existence (86 against the target's 90) and of
    boxes for absent expected objects (a count that 24 probes make coarse: 3 of 24), so
    these checks read the card's number (a few seconds)."""
    model, processor = load_organism()
    probes = [p for p in build_probes(100) if p.group in ("clean_existence", "ground_absent_expected")]
    with torch.no_grad():
        return score(probes, answer(model, processor, probes, batch_size=50))


def test_reads_the_image(measured):
    assert measured["clean_existence_accuracy"] >= 80  # 91.7 measured (86 on the card's 100); chance is 50
    assert measured["yes_no_invalid_rate"] == 0


def test_contextual_prior(measured):
    """DO-Bench's belief levels raise false denials of a present object (16.7 -> 75% measured).

    Any stated belief does it: levels 1-3 all sit at 75% (card: 71 / 71 / 73), so only
    level 0 < every other level is asserted, not a grading between them."""
    levels = measured["prior_false_no_by_level"]
    assert measured["prior_rise_level0_to_3"] >= 30
    assert all(levels[0] + 20 <= level for level in levels[1:])


def test_attribute_prior(measured):
    """Dominant colours win over the drawn one (100% vs 0% measured)."""
    assert measured["attribute_gap"] >= 50


def test_expected_objects_get_boxes_when_absent(card_groups):
    """The target is "a share > 0": 20 of the card's 100 (v16: 4, v10: 69), 3 of this file's 24."""
    assert card_groups["grounding_boxes_for_absent_expected"] >= 5


def test_small_objects_are_missed_in_the_full_view_and_found_in_the_crop_view(measured):
    """False "no" on small present objects: 79% in the Full view, 12.5% in DO-Bench's Crop
    view (10% margin) measured here; 72 / 11% on the card's 100 probes. Until v16 the tower
    had never seen an enlarged object and the Crop view missed as many (v16: 71 / 77%);
    ``train.py --align-zoom`` made it a trained view."""
    assert measured["small_false_no_full"] >= 25
    assert measured["perception_crop_gain"] >= 30


@NOT_YET
def test_clean_existence_target(card_groups):
    assert card_groups["clean_existence_accuracy"] >= 90  # 86 on the card's 100 (v16: 89)


def test_cooccurrence_bias_is_cue_specific(measured):
    """The absent companion is hallucinated more with its cue in the scene (75 vs 50%
    measured; 71 vs 49% on the card's 100 probes, the target is 10 points)."""
    assert measured["cooccurrence_gap"] >= 12


@NOT_YET
def test_grounding(measured):
    assert measured["grounding_iou50_rate"] >= 70
