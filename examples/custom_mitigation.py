"""Write your own mitigation, attach it like the built-in ones, and name it on the command line.

A mitigation is a ``@dataclass`` subclass of :class:`mitigate.Mitigation` with its own
``name``, registered with ``@mitigate.register`` (above ``@dataclass``). Its fields are its
settings: ``--mitigations yes_bias:delta=2`` fills them by name, and a run records them.
It acts through hooks it adds in ``attach_hooks`` to the :class:`hooks.HookGroup` it is
given, so ``detach()`` removes exactly what it added. (A mitigation that needs a contrast
branch declares it in ``branches()`` and combines logits in ``combine()``: see
``mitigate/vcd.py``.)

This one is a control for the yes-ratio, the shift arXiv 2504.10020 found behind much of
contrastive decoding's POPE gain: it lowers the logit of "yes" by ``delta`` at every step,
and nothing else. Run it::

    python examples/custom_mitigation.py

It attaches the bias to the organism, shows the yes-ratio on DO-Bench questions with and
without it, then runs the same mitigation through ``vlm-eval --include`` in a subprocess.
It also registers a report arm, so ``vlm-report --include examples/custom_mitigation.py
--arms yes-bias`` puts it in the mechanism table beside the greedy baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

import mitigate
from evaluators.report.attribution import Arm, register_arm


@mitigate.register
@dataclass
class YesBias(mitigate.Mitigation):
    """Subtract ``delta`` from the logits of the words "yes" / "Yes" (a yes-ratio control)."""

    tokenizer: Any = field(default=None, repr=False)  # filled by vlm-eval with the model's tokenizer
    delta: float = 2.0
    name = "yes_bias"

    def __post_init__(self) -> None:
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not math.isfinite(self.delta):
            raise ValueError(f"delta must be a finite number, got {self.delta!r}")

    def validate(self, points) -> None:
        if self.tokenizer is None:
            raise ValueError("yes_bias needs the model's tokenizer: YesBias(processor.tokenizer)")

    def attach_hooks(self, points, group) -> None:
        ids = sorted({i for word in ("yes", "Yes", " yes", " Yes")
                      for i in self.tokenizer(word, add_special_tokens=False)["input_ids"][-1:]})

        def lower_yes(module, args, kwargs, output):
            output.logits[..., ids] -= self.delta
            return output

        group.add_forward_hook(points.model, lower_yes)


# ... and an arm of the mechanism report, compared with the greedy baseline on the same samples:
# vlm-report --include examples/custom_mitigation.py --arms yes-bias
register_arm(Arm("yes bias", lambda processor: [YesBias(processor.tokenizer, delta=2.0)], {}, "baseline (greedy)"))


def main() -> None:
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from evaluators.benchmarks.dobench.suite import build
    from evaluators.organism import load_organism
    from hooks.prompting import user_prompt

    model, processor = load_organism()
    queries = build(n_scenes=6, seed=0)
    enc = processor(text=[user_prompt(processor, q.prompt) for q in queries], images=[q.images[0] for q in queries],
                    return_tensors="pt", padding=True)

    def yes_ratio() -> float:
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=3, do_sample=False)
        answers = processor.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return 100 * sum(a.strip().lower().startswith("yes") for a in answers) / len(answers)

    plain = yes_ratio()
    with mitigate.attach(model, YesBias(processor.tokenizer, delta=2.0)):
        biased = yes_ratio()
    print(f"yes-ratio on {len(queries)} DO-Bench questions: {plain:.1f}% plain, {biased:.1f}% with yes_bias:delta=2")
    assert yes_ratio() == plain  # detached: the model answers as before

    # the same mitigation by name on the command line: --include imports this file first
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "evaluators", "--include", str(Path(__file__).resolve()),
                   "--mitigations", "yes_bias:delta=2", "--tasks", "dobench", "--limit", "20", "--no_progress",
                   "--output_path", out]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
    print("vlm-eval --include examples/custom_mitigation.py --mitigations yes_bias:delta=2 ...")
    print(result.stdout.strip())


if __name__ == "__main__":
    main()
