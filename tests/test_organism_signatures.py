"""The shipped organism still hallucinates for the reasons it was built to: a retrain that
loses a mechanism fails here. A small fixed probe set (seconds on CPU), greedy decoding.

Thresholds sit below the model card's figures (measured on 100 probes per group) by a
margin for the smaller sample; the card has the exact numbers.
"""

from __future__ import annotations

import pytest
import torch

from evaluators.organism import ORGANISM_DIR, load_organism
from evaluators.organism.signatures import answer, build_probes, score

pytestmark = pytest.mark.skipif(not (ORGANISM_DIR / "config.json").exists(), reason="organism checkpoint missing")


@pytest.fixture(scope="module")
def measured():
    model, processor = load_organism()
    probes = build_probes(24)
    with torch.no_grad():
        return score(probes, answer(model, processor, probes, batch_size=24))


def test_clean_existence_is_accurate(measured):
    assert measured["clean_existence_accuracy"] >= 85


def test_cooccurrence_bias(measured):
    assert measured["cooccurrence_gap"] >= 5


def test_contextual_prior(measured):
    assert measured["prior_rise_level0_to_3"] >= 20


def test_weak_perception_recovered_by_crop(measured):
    assert measured["small_false_no_full"] >= 20
    assert measured["perception_crop_gain"] >= 10


def test_attribute_prior(measured):
    assert measured["attribute_gap"] >= 5


def test_grounding(measured):
    assert measured["grounding_iou50_rate"] >= 70
    assert measured["grounding_boxes_for_absent_expected"] > 0
