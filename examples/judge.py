"""Grade ReactBench's answers with a judge, as its paper does (App. C.1), beside the rules.

    python examples/judge.py                                     # a stand-in grader, no model needed
    python examples/judge.py --judge Qwen/Qwen2.5-7B-Instruct --judge_args dtype=bf16,device=cuda

The organism answers ReactBench's built-in suite once; the answers are graded by the
toolkit's rules and by the judge, and the script prints each task's accuracy both ways and
the answers the two graders disagree on -- where to look before trusting either. Without
``--judge`` the judge is a stand-in written here (``lenient``: an answer is right when it
names a word of the reference), to show the plumbing on a machine without a judge model;
its grades are not the paper's.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from evaluators.benchmarks.reactbench.suite import build
from evaluators.cli import parse_kv
from evaluators.judge import CallableJudge, HFJudge
from evaluators.model import HFModel, load_hf
from evaluators.runner import SAMPLES, read_samples, run

STOP = {"a", "an", "the", "is", "was", "of", "or", "to", "from", "any", "number"}


def lenient(question: str, reference: str, answer: str) -> str:
    """A stand-in judge: "correct" when the answer names a word of the reference."""
    wanted = {w for w in reference.lower().replace("(", " ").replace(")", " ").split() if w not in STOP}
    return "correct" if wanted & set(answer.lower().split()) else "incorrect"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge", default=None, help="an HF text model (folder or Hub id); default: the stand-in")
    parser.add_argument("--judge_args", default="", help="as vlm-eval's --model_args")
    parser.add_argument("--n_per_task", type=int, default=4)
    args = parser.parse_args()
    judge = (HFJudge(args.judge, **parse_kv(args.judge_args)) if args.judge
             else CallableJudge(lenient, "lenient stand-in"))
    model, processor = load_hf("organism")
    queries = build(n_per_task=args.n_per_task, seed=0, dimensions=("direct",), hints=("none",))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        payload = run(queries, HFModel(model, processor, max_new_tokens=8), folder, progress=False, judge=judge)
        lines = read_samples(folder / SAMPLES)
    by_task: dict[str, list] = {}
    for r in lines:
        by_task.setdefault(r["task"], []).append(r)
    print(f"judge: {judge.describe()['name']}")
    print(f"{'task':26s} {'rules':>6s} {'judge':>6s}")
    for task, rows in sorted(by_task.items()):
        rule = 100.0 * sum(bool(r["rule_correct"]) for r in rows) / len(rows)
        judged = 100.0 * sum(bool(r["correct"]) for r in rows) / len(rows)
        print(f"{task:26s} {rule:6.1f} {judged:6.1f}")
    summary = payload["judge"]["benchmarks"]["reactbench"]
    both = summary["answers_both_read"]
    print(f"agreement with the rules: {summary['agreement_with_rules']:.1f}% of {both} answers both graders read"
          if both else "agreement with the rules: no answer both graders read")
    by_id = {q.id: q for q in queries}
    differ = [r for r in lines if not r["rule_invalid"] and bool(r["rule_correct"]) != bool(r["correct"])]
    for r in differ[:5]:
        print(f"  {by_id[r['id']].prompt!r} -> {r['answer']!r}: rules {r['rule_correct']}, judge {r['correct']} "
              f"({r['judge_output']!r})")


if __name__ == "__main__":
    main()
