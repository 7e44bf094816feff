"""``vlm-report``: evaluate a model unmitigated and under each mitigation on the built-in
probe suites, and say which failure mechanism each mitigation fixes and which it breaks.

    vlm-report --output_path runs/report                     # the shipped organism, ~minutes on CPU
    vlm-report --model <hf id or path> --model_args dtype=bfloat16,device=cuda --output_path runs/x
    vlm-report --data dobench=my_do.jsonl,hallusegbench=hsb/data.json --output_path runs/mine

Writes ``<output_path>/results.json`` (every number, config, versions, seeds),
``<output_path>/<arm>/samples.jsonl`` (per-sample answers; reruns resume),
``<output_path>/report.html`` (self-contained) and prints the mechanism x mitigation table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..benchmarks.suites import SCALES, build_queries
from .attribution import FAMILIES, slug
from .stats import INTERVALS


def _organism_card(model: str) -> dict | None:
    """For the shipped organism: its measured signatures and which targets they meet, so
    the report can say which cells *could* show a fix (a mechanism the model does not
    exhibit gives a mitigation nothing to repair)."""
    from ..organism import ORGANISM_DIR

    path = ORGANISM_DIR / "signatures.json"
    if model != "organism" or not path.exists():
        return None
    measured = json.loads(path.read_text())
    return {"checks": measured.get("checks", {}), "measured": {k: measured[k] for k in measured.get("checks", {})},
            "card": str(ORGANISM_DIR / "README.md")}


def with_references(chosen: list, known: list) -> list:
    """``chosen`` arms plus every arm they are compared with -- baselines and controls, and
    theirs in turn (an optional arm can be the baseline of another, to isolate what one
    mitigation adds to it), appended in the order they are first needed."""
    by_name = {a.name: a for a in known}
    arms = list(chosen)
    pending = [name for a in arms for name in (a.baseline, a.control)]
    while pending:
        name = pending.pop(0)
        if name is not None and name not in {a.name for a in arms}:
            arms.append(by_name[name])
            pending += [by_name[name].baseline, by_name[name].control]
    return arms


def _whole_run(path: Path, query_ids: set[str], measured):
    """A per-arm figure (wall clock, verification counts) over *all* of this run's queries.

    ``measured``: this invocation's figure when it answered every query itself, else None
    (a resumed run times and counts only its remainder). ``path`` keeps one figure per
    query set (a digest of its ids): with None, the figure an earlier whole run recorded
    for this query set is read back, and there is none when no whole run of it was
    recorded (killed, then resumed; or only other ``--tasks`` / ``--scale`` ran whole).
    """
    import hashlib

    digest = hashlib.sha256("\n".join(sorted(query_ids)).encode()).hexdigest()
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved = saved.get("by_query_set", {}) if isinstance(saved, dict) else {}  # older files held one figure
    if measured is not None:
        path.write_text(json.dumps({"by_query_set": {**saved, digest: measured}}))
        return measured
    return saved.get(digest)


def default_output(scale: str, seed: int) -> str:
    """Where a report goes without ``--output_path``: one folder per scale and seed."""
    return "runs/report" if (scale, seed) == ("small", 0) else f"runs/report-{scale}-seed{seed}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlm-report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="organism", help="'organism' (default) or an HF model id / path")
    parser.add_argument("--model_args", default="",
                        help="attn_implementation=...,dtype=bf16|fp16|fp32|auto,device=...,device_map=auto")
    parser.add_argument("--tasks", default=None,
                        help="built-in probe suites, comma-separated ('' for none; default: all five, "
                             "none when --data is given)")
    parser.add_argument("--data", default="", help="your data: benchmark=path[,benchmark=path] in native formats")
    parser.add_argument("--arms", default="",
                        help="comma-separated arm names or slugs (default: every default arm; optional ones "
                             "such as crop-and-verify-which-image only when named)")
    parser.add_argument("--include", default="",
                        help="comma-separated Python modules or .py files imported first: your own mitigations "
                             "and arms (evaluators.report.attribution.register_arm) for --arms")
    parser.add_argument("--scale", default="small", choices=sorted(SCALES),
                        help="built-in suite sizes (evaluators/benchmarks/suites.py); default: small "
                             "(vlm-eval's default is full)")
    parser.add_argument("--output_path", default=None,
                        help="default: runs/report at the default scale and seed, else runs/report-<scale>-seed<seed> "
                             "(a sampled arm seeds each batch by its place among the run's queries, so another "
                             "scale's answers are not the ones this run would draw)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=1000,
                        help="paired-bootstrap resamples behind each 95%% interval (default 1000; at least "
                             "100, evaluators/report/stats.py MIN_RESAMPLES)")
    parser.add_argument("--interval", choices=INTERVALS, default="expanded",
                        help="how each 95%% interval is read from the resamples: Hesterberg's expanded percentile "
                             "interval (default; the plain one is too narrow on the suites' 12-40 units), or the "
                             "plain percentile interval (README, 'Multiplicity')")
    parser.add_argument("--family", choices=FAMILIES, default="arm",
                        help="which metrics Holm's procedure corrects together: all of an arm's comparison "
                             "(default: a false cell anywhere in its column held at 5%%), or each mechanism's own "
                             "(README, 'Multiplicity')")
    from ..cli import (add_grounding_arguments, add_judge_arguments, check_model, check_positive, include,
                       judge_options, load_judge, load_model, output_path_wording, parse_kv)

    add_grounding_arguments(parser)
    add_judge_arguments(parser)  # it grades once every arm has answered: the cost column times the arms alone
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)

    check_positive(parser, batch_size=args.batch_size, seed=args.seed, resamples=args.resamples,
                   judge_batch_size=args.judge_batch_size)
    from .stats import MIN_RESAMPLES

    if args.resamples < MIN_RESAMPLES:  # fewer give no 95% interval, yet decided verdicts ("[+19.4, +19.4]")
        parser.error(f"--resamples must be at least {MIN_RESAMPLES} for a 95% interval, got {args.resamples} "
                     "(the default is 1000)")

    import torch

    from ..model import HFModel
    from ..folder_lock import FolderBusy
    from ..runner import RunMismatch, flag_invalid, metric_records, read_samples, run, versions
    from ..shards import done_ids
    from .attribution import cell_verdicts, compare, default_arms, explained_by_control, optional_arms, yes_ratio
    from .html import write_html
    from .table import text_table

    torch.manual_seed(args.seed)
    out = Path(args.output_path or default_output(args.scale, args.seed))
    from ..benchmarks.protocols import load_data
    from ..benchmarks.suites import SUITE_NAMES, chosen_tasks

    try:
        include(args.include)
        tasks = chosen_tasks(args.tasks, args.data, ",".join(SUITE_NAMES))
        data = parse_kv(args.data, "--data", "benchmark=path")
        queries = build_queries(tasks, args.seed, args.scale) + load_data(data)
        model_args = parse_kv(args.model_args, "--model_args")
    except ValueError as err:
        parser.error(str(err))
    if not queries:
        parser.error("nothing to evaluate: give --tasks and/or --data")
    check_model(parser, args.model, model_args)
    judge_args = judge_options(parser, args, queries)
    arms = default_arms()
    if args.arms:  # checked before the model loads
        wanted = [a.strip() for a in args.arms.split(",") if a.strip()]
        known = arms + optional_arms()
        unknown = [w for w in wanted if not any(w in (a.name, slug(a.name)) for a in known)]
        if unknown:
            parser.error(f"unknown arm(s) {unknown}; available: {', '.join(slug(a.name) for a in known)}")
        try:
            arms = with_references([a for a in known if a.name in wanted or slug(a.name) in wanted], known)
        except KeyError as err:  # a registered arm compared with an arm no one defined
            parser.error(f"an arm's baseline or control {err.args[0]!r} is no arm; available: "
                         f"{', '.join(a.name for a in known)}")
    model, processor = load_model(parser, args.model, model_args)
    records, costs, payloads, testers = {}, {}, {}, {}
    # Warm-up, untimed and unrecorded: the first generate() pays one-off costs (lazy
    # initialisation, allocator growth) that would otherwise inflate the first arm's wall
    # clock -- the baseline of every ratio in the cost column (measured: 15 s vs 6 s).
    # Only queries that can be asked: one whose image is missing or corrupt (``problem``) is
    # recorded as an invalid input by the runner, never given to the model.
    askable = [q for q in queries if not q.problem][: args.batch_size]
    if askable:
        HFModel(model, processor, max_new_tokens=8)(askable)
    by_id = {q.id: q for q in queries}  # this run's queries, the same for every arm
    wanted = set(by_id)
    for arm in arms:
        mitigations = arm.build(processor)
        under_test = testers[arm.name] = HFModel(model, processor, mitigations=mitigations,
                                                 generate_kwargs=arm.generate_kwargs, max_new_tokens=8, name=args.model,
                                                 box_frame=args.box_frame, grounding_format=args.grounding_format)
        folder = out / slug(arm.name)
        resumed = bool(wanted & done_ids(folder)) if folder.exists() else False
        start = time.perf_counter()
        try:
            payloads[arm.name] = run(queries, under_test, folder, batch_size=args.batch_size, seed=args.seed,
                                     config={"arm": arm.name}, progress=not args.no_progress)
        except (RunMismatch, FolderBusy) as err:
            parser.error(output_path_wording(err))
        seconds = time.perf_counter() - start
        rows = 1 + sum(getattr(m, "extra_rows", 0) for m in mitigations)
        verify = next((dict(m.stats) for m in mitigations if hasattr(m, "stats")), None)
        costs[arm.name] = {
            "seconds": _whole_run(folder / "timing.json", wanted, None if resumed else seconds),
            "forward_rows_per_token": rows,
            "verification": _whole_run(folder / "verification.json", wanted,
                                       None if resumed or not (verify or {}).get("queries") else verify),
        }
        took = costs[arm.name]["seconds"]
        print(f"{arm.name}: " + (f"{took:.0f}s" if took is not None else "resumed, wall clock not measured"),
              file=sys.stderr, flush=True)
    judge = None
    if args.judge is not None:  # every arm has answered: the judge loads only now, and grades each
        # arm's answers in the same call that merges and scores them (no answer is asked again)
        judge = load_judge(parser, args.judge, judge_args)
        for arm in arms:
            payloads[arm.name] = run(queries, testers[arm.name], out / slug(arm.name), batch_size=args.batch_size,
                                     seed=args.seed, config={"arm": arm.name}, progress=False, judge=judge)
    for arm in arms:
        # this run's answers only: the folder keeps answers to queries of earlier runs
        # (another --tasks or --scale), which must not enter this report's comparisons
        lines = [flag_invalid(r) for r in read_samples(out / slug(arm.name) / "samples.jsonl") if r["id"] in wanted]
        by_bench: dict[str, list] = {}
        for r in lines:
            by_bench.setdefault(r["benchmark"], []).append(r)
        records[arm.name] = {b: metric_records(b, rs) for b, rs in by_bench.items()}

    comparisons, cells, flags = {}, {}, {}
    for arm in arms:
        if arm.baseline is None:
            continue
        rows = compare(records[arm.baseline], records[arm.name], n_resamples=args.resamples, seed=args.seed,
                       interval=args.interval, family=args.family)
        comparisons[arm.name] = rows
        cells[arm.name] = cell_verdicts(rows)
        if arm.control:
            against = compare(records[arm.control], records[arm.name], n_resamples=args.resamples, seed=args.seed,
                              interval=args.interval, family=args.family)
            comparisons[f"{arm.name} vs {arm.control}"] = against
            flags[arm.name] = explained_by_control(rows, against)
    for arm in arms:
        base = costs.get(arm.baseline or arm.name)
        measured = base and base["seconds"] and costs[arm.name]["seconds"] is not None
        costs[arm.name]["wall_clock_vs_baseline"] = costs[arm.name]["seconds"] / base["seconds"] if measured else None
    result = {
        "model": args.model, "tasks": tasks, "data": data, "scale": args.scale, "seed": args.seed,
        "resamples": args.resamples, "interval": args.interval, "family": args.family,
        "arms": [{"name": a.name, "baseline": a.baseline, "control": a.control, "generate_kwargs": a.generate_kwargs,
                  "mitigations": [repr(m) for m in a.build(processor)]} for a in arms],
        "scores": {a.name: payloads[a.name]["results"] for a in arms},
        "invalid": {a.name: payloads[a.name]["invalid"] for a in arms},
        "yes_ratio": {a.name: yes_ratio(records[a.name]) for a in arms},
        "comparisons": comparisons, "verdicts": cells, "explained_by_control": flags, "cost": costs,
        "versions": versions(), "command": " ".join(sys.argv),
    }
    if judge is not None:
        result["judge"] = {a.name: payloads[a.name]["judge"] for a in arms}
    from ..runner import _json_safe

    card = _organism_card(args.model)
    if card:
        result["model_card"] = card
    (out / "results.json").write_text(json.dumps(_json_safe(result), indent=2, default=str) + "\n")
    write_html(result, queries, records, out / "report.html")
    print(text_table(result))
    if judge is not None:
        for name, judged in result["judge"].items():
            for bench, j in judged["benchmarks"].items():
                print(f"{name}: {bench} graded by the judge {judge.name} ({j['judged']} answers, "
                      f"{j['unreadable_verdicts']} replies without a verdict)")
    print(f"\nwrote {out / 'results.json'} and {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
