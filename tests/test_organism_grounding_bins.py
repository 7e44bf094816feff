"""evaluators.organism.grounding_bins: the coarser-grid grounding diagnostic (issue 3)."""

from __future__ import annotations

import pytest

from evaluators.organism import ORGANISM_DIR, load_organism, tasks
from evaluators.organism.grounding_bins import evaluate, main

pytestmark = pytest.mark.skipif(not (ORGANISM_DIR / "config.json").exists(), reason="organism checkpoint missing")


def test_scores_the_shipped_organism_and_restores_the_grid(capsys):
    model, processor = load_organism()
    result = evaluate(model, processor, bins=16, n=8)
    assert result["present"] + result["absent"] == 8
    assert 0.0 <= result["iou50_rate"] <= 100.0 and 0.0 <= result["none_for_present"] <= 100.0
    main(["--bins", "8", "--steps", "0", "-n", "4"])  # no training: before and after are the same model
    assert tasks.COORD_BINS == 16 and "grounding" in tasks.MIX and len(tasks.MIX) > 1  # restored
    out = capsys.readouterr().out
    assert '"steps": 0' in out


def test_realigning_with_box_codes_reports_the_tokens_box_read_out(capsys):
    import json

    main(["--bins", "16", "--align-box-scale", "0.5", "--align-steps", "2", "--steps", "0", "-n", "2"])
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{\n"):])
    edges = result["realigned"]
    assert edges["box_scale"] == 0.5 and edges["align_steps"] == 2
    for key in ("token_box_edges_before", "token_box_edges_after"):
        assert len(edges[key]) == 4 and all(0.0 <= v <= 100.0 for v in edges[key])


@pytest.mark.parametrize("argv", [["--bins", "1"], ["--bins", "17"], ["--steps", "-1"], ["--align-box-scale", "-1"],
                                  ["--align-box-scale", "0.5", "--bins", "8"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        main(argv)
