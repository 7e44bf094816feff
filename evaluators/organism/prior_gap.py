"""What context-mode prior suppression leaves behind: the belief or its positions?

    python -m evaluators.organism.prior_gap --scenes 40 --seed 0

DO-Bench's Full-view questions (levels 0-3, A = present target, B = absent target) asked
four ways: as posed; under ``PriorSuppression(mode="context", strength=1)``, which removes
the belief sentence from the attention but keeps every later token's position; the same
with ``compact_positions=True``, which closes that gap; and with the sentence deleted from
the text (:func:`mitigate.crop_verify.without_priors`), which
also closes the position gap. Prints the error rates per level and PriorRobust (DO-Bench
Eq. 3, :func:`evaluators.benchmarks.dobench.metrics.prior_robust`) with its change against
the prompts as posed and the 95% paired-bootstrap interval over scene groups, as a
Markdown table.
If deletion brings levels 1-3 to level 0 and masking does not, what masking leaves is
the position gap (``docs/results/prior_full.md``, session 14).
"""

from __future__ import annotations

import argparse
from typing import Sequence

import torch

from evaluators.answers import parse_yes_no
from evaluators.benchmarks.dobench.metrics import curves, prior_robust
from evaluators.benchmarks.dobench.suite import build
from evaluators.report.attribution import UNITS
from evaluators.report.stats import paired_bootstrap
from mitigate import PriorSuppression, attach
from mitigate.crop_verify import without_priors

from .signatures import Probe, answer


def _answers(model, processor, images: Sequence, prompts: Sequence[str]) -> list[bool | None]:
    probes = [Probe([image], prompt, "", "dobench") for image, prompt in zip(images, prompts)]
    return [parse_yes_no(a) for a in answer(model, processor, probes, batch_size=32, max_new_tokens=3)]


def measure(model, processor, n_scenes: int = 40, seed: int = 0, resamples: int = 1000) -> dict[str, dict]:
    """``{way: {"A_FN": {level: %}, "B_FP": {level: %}, "prior_robust": float, "delta": (d, low, high)}}``;
    ``delta``: PriorRobust against the prompts as posed, 95% paired bootstrap over scene groups."""
    queries = [q for q in build(n_scenes=n_scenes, seed=seed) if q.record["view"] == "Full"]
    images, prompts = [q.images[0] for q in queries], [q.prompt for q in queries]
    answers = {"as posed": _answers(model, processor, images, prompts)}
    with attach(model, PriorSuppression(processor.tokenizer, mode="context", strength=1.0)):
        answers["context mode (masked, positions kept)"] = _answers(model, processor, images, prompts)
    with attach(model, PriorSuppression(processor.tokenizer, mode="context", strength=1.0, compact_positions=True)):
        answers["context mode, compact_positions=True"] = _answers(model, processor, images, prompts)
    answers["sentence deleted"] = _answers(model, processor, images, [without_priors(p) for p in prompts])
    records = {way: [{**q.record, "pred_yes": yes} for q, yes in zip(queries, said)] for way, said in answers.items()}
    base = records["as posed"]
    result = {}
    for way, recs in records.items():
        c = curves(recs)
        result[way] = {"A_FN": c["A_FN"], "B_FP": c["B_FP"], "prior_robust": prior_robust(recs)}
        if recs is not base:  # paired over scene groups, as vlm-report's DO-Bench comparisons are
            stats = paired_bootstrap(base, recs, prior_robust, unit=UNITS["dobench"], n_resamples=resamples, seed=seed)
            result[way]["delta"] = (stats["delta"], stats["low"], stats["high"])
    return result


def table(result: dict[str, dict]) -> str:
    lines = ["| prompt | A0 | A1 | A2 | A3 | B0 | B1 | B2 | B3 | PriorRobust | Δ [95% CI] |", "|---" * 11 + "|"]
    for way, r in result.items():
        cells = [f"{r['A_FN'][lv]:.1f}" for lv in range(4)] + [f"{r['B_FP'][lv]:.1f}" for lv in range(4)]
        delta = "" if "delta" not in r else "{:+.1f} [{:+.1f}, {:+.1f}]".format(*r["delta"])
        lines.append(f"| {way} | {' | '.join(cells)} | {r['prior_robust']:.1f} | {delta} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenes", type=int, default=40, help="DO-Bench scene groups (full scale: 40)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.scenes < 1:
        parser.error(f"--scenes must be >= 1, got {args.scenes}")
    torch.set_num_threads(2)
    print(table(measure(*load_organism(), n_scenes=args.scenes, seed=args.seed)))


if __name__ == "__main__":
    main()
