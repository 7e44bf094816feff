"""The mechanism x mitigation table: as text on stdout (``vlm-report``), and as Markdown for
one run or several seeds side by side (``python -m evaluators.report.table results.json
[results.json ...]``, how the README's tables are made)."""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..metrics import MECHANISMS

SHORT = {"fixes": "FIXES", "breaks": "BREAKS", "mixed": "mixed", "no detectable effect": "-",
         "not measured": "n/a"}


def headline(rows: list[dict], mechanism: str) -> str:
    """The metric behind a mechanism's cell, as 'delta [low, high]'.

    Among the metrics whose own verdict is *fixes* or *breaks* (the ones that decide the
    cell, see ``attribution.cell_verdicts``), the largest |delta|; only when none is
    decided, the largest |delta| of all. Otherwise a FIXES cell could show a wide,
    undecided metric of the same mechanism (first seen as "FIXES -50.0 [-100, 0]": the
    fix was DO-Bench PriorRobust +11.1 [+1.4, +21.5]). A metric without a direction (MIOH's
    decomposition gap) heads a cell only when the mechanism has no other: its delta says
    nothing about better or worse (first seen as "- -31.2 [-54.1, -7.3]" under VCD).
    """
    cands = [r for r in rows if r.get("mechanism") == mechanism and not math.isnan(number(r.get("delta")))]
    cands = [r for r in cands if r.get("higher_is_better") is not None] or cands
    if not cands:
        return ""
    decided = [r for r in cands if r.get("verdict") in ("fixes", "breaks")]
    # |delta| to 1e-9 (two metrics of one size differ in float noise: MIOH LC-I's -4.166...64,
    # one unit changed, headed a cell over PriorRobust's +4.166...25 with 14), then the
    # metric resting on more changed units
    best = max(decided or cands, key=lambda r: (round(abs(number(r["delta"])), 9), r.get("changed") or 0))
    return f"{_signed(best['delta'])} [{_signed(best.get('low'))},{_signed(best.get('high'))}]"


def number(value) -> float:
    """A delta or interval end as a float: NaN for None (results.json stores NaN as null,
    so a table made from the file meets None where ``vlm-report`` met NaN) or a missing one."""
    return math.nan if value is None else float(value)


def _signed(value) -> str:
    """'+1.2' / '-0.4'; 'nan' for an undefined value (None or NaN alike)."""
    value = number(value)
    return "nan" if math.isnan(value) else f"{value:+.1f}"


def ratio_text(value: float | None) -> str:
    """A wall-clock ratio, or why there is none (an arm resumed after a kill timed only its rest)."""
    return "not measured" if value is None else f"{value:.2f}x"


#: the yes/no benchmarks whose yes-ratio the tables show, in order, by their papers' names
YES_RATIO_NAMES = {"dobench": "DO-Bench", "causal_halbench": "Causal-HalBench"}


def yes_ratio_benchmarks(result: dict) -> list[str]:
    """The yes/no benchmarks the run answered (a yes-ratio some arm has), in table order. A
    gain can be a shift towards "yes" on any of them: Causal-HalBench's CHR asks only about
    objects that are there, DO-Bench's A-series likewise."""
    ratios = result["yes_ratio"].values()
    return [b for b in YES_RATIO_NAMES if any(not math.isnan(yes_ratio_of(r, b)) for r in ratios)]


def yes_ratio_of(ratios: dict, bench: str) -> float:
    """An arm's yes-ratio on ``bench`` (NaN where it has none: results.json writes NaN as null)."""
    value = ratios.get(bench)
    return math.nan if value is None else float(value)


def text_table(result: dict) -> str:
    """The mechanism x mitigation table as aligned text: each column as wide as its widest
    entry plus a gap of two spaces (a fixed width let a long row label or cell run into the
    next column: "yes-ratio (Causal-HalBench)36.9%")."""
    arms = [a["name"] for a in result["arms"] if a["baseline"]]
    rows = [("mechanism", list(arms))]
    for mech in MECHANISMS:
        cells = []
        for a in arms:
            v = SHORT[result["verdicts"][a][mech]]
            h = headline(result["comparisons"][a], mech)
            cells.append(f"{v} {h}".strip())
        rows.append((mech, cells))
    for bench in yes_ratio_benchmarks(result):
        rows.append((f"yes-ratio ({YES_RATIO_NAMES[bench]})",
                     [f"{yes_ratio_of(result['yes_ratio'][a], bench):.1f}%" for a in arms]))
    rows.append(("cost: rows/token, time", [
        f"{result['cost'][a]['forward_rows_per_token']}x, {ratio_text(result['cost'][a]['wall_clock_vs_baseline'])}"
        for a in arms]))
    gap = 2
    width = max(len(label) for label, _ in rows) + gap
    cols = [max(len(cells[i]) for _, cells in rows) + gap for i in range(len(arms))]
    lines = [(label.ljust(width) + "".join(c.ljust(w) for c, w in zip(cells, cols))).rstrip() for label, cells in rows]
    flags = [f"{a}: gain on {', '.join(m)} not shown beyond its control" for a, m in result["explained_by_control"].items()
             if m]
    return "\n".join(lines + (["", *flags] if flags else []))


#: the Markdown table's row names (the mechanisms' long names)
MECHANISM_NAMES = {"language_prior": "language prior", "cooccurrence": "co-occurrence",
                   "perception": "weak perception", "vision_grounding": "vision-driven grounding",
                   "label_grounding": "label grounding", "multi_image": "multi-image"}


def _md_number(text: str) -> str:
    """'+0.0' / '-0.0' as 0, and a typographic minus."""
    return "0" if text in ("+0.0", "-0.0") else text.replace("-", "\u2212")


def _md_cell(result: dict, arm: str, mechanism: str, interval: bool) -> str:
    short = SHORT[result["verdicts"][arm][mechanism]]
    verdict = {"-": "\u2212", "FIXES": "**FIXES**", "BREAKS": "**BREAKS**"}.get(short, short)
    head = headline(result["comparisons"][arm], mechanism)
    if not head:
        return verdict
    delta, rest = head.split(" [")
    if not interval:
        return f"{verdict} {_md_number(delta)}"
    low, high = rest.rstrip("]").split(",")
    return f"{verdict} {_md_number(delta)} [{_md_number(low)}, {_md_number(high)}]"


def reading(result: dict) -> tuple[str, str]:
    """(interval, correction family) a results.json's verdicts were read with. A file written
    before vlm-report recorded them used the percentile interval and Holm per mechanism, or,
    older still (no ``verdict_unadjusted`` on any row), no correction at all ("none")."""
    if "family" in result:
        return result.get("interval", "percentile"), result["family"]
    rows = (r for rows in result.get("comparisons", {}).values() for r in rows)
    corrected = any("verdict_unadjusted" in r for r in rows)
    return result.get("interval", "percentile"), "mechanism" if corrected else "none"


def markdown_table(results: list[dict]) -> str:
    """The table in Markdown. One result: each cell is verdict, delta and its interval, with
    the yes-ratio and cost rows. Several (e.g. ``--seed 0`` and ``--seed 1`` of one scale):
    each cell is verdict and delta per result, separated by ' / ', and the yes-ratio rows;
    the results must have the same arms."""
    if not results:
        raise ValueError("results: give at least one results.json")
    arms = [a["name"] for a in results[0]["arms"] if a["baseline"]]
    for r in results[1:]:
        if [a["name"] for a in r["arms"] if a["baseline"]] != arms:
            raise ValueError("results: the runs have different arms; compare runs of the same arms")
    readings = {reading(r) for r in results}
    if len(readings) > 1:
        raise ValueError(f"results: the runs read their intervals differently ({', '.join(sorted(map(str, readings)))}"
                         "; --interval, --family); side by side their verdicts are not comparable")
    one = len(results) == 1
    seeds = " / ".join(f"seed {r.get('seed')}" for r in results)
    label = "mechanism" if one else f"mechanism ({seeds})"
    lines = [f"| {label} | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for mech in MECHANISMS:
        cells = (" / ".join(_md_cell(r, a, mech, one) for r in results) for a in arms)
        lines.append(f"| {MECHANISM_NAMES.get(mech, mech)} | " + " | ".join(cells) + " |")

    def ratios(arm: str, bench: str) -> str:
        return " / ".join(f"{yes_ratio_of(r['yes_ratio'][arm], bench):.1f}" for r in results) + "%"

    for bench in yes_ratio_benchmarks(results[0]):
        base = "; ".join(f"{name} baseline " + ratios(f"baseline ({name})", bench)
                         for name in ("greedy", "sampling") if f"baseline ({name})" in results[0]["yes_ratio"])
        lines.append(f"| yes-ratio ({YES_RATIO_NAMES[bench]}; {base}) | "
                     + " | ".join(ratios(a, bench) for a in arms) + " |")
    if one:
        cost = results[0]["cost"]

        def spent(arm):
            views = " + the views" if cost[arm].get("verification") else ""
            return f"{cost[arm]['forward_rows_per_token']}\u00d7{views}, " + ratio_text(
                cost[arm]["wall_clock_vs_baseline"]).replace("x", "\u00d7")

        lines.append("| forward rows per token, wall clock vs baseline | " + " | ".join(spent(a) for a in arms) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evaluators.report.table",
        description="Print vlm-report's mechanism x mitigation table in Markdown, for one results.json or "
                    "several runs of the same arms (e.g. two seeds) side by side.")
    parser.add_argument("results", nargs="+", help="vlm-report's results.json files")
    args = parser.parse_args(argv)
    try:
        results = [json.load(open(path, encoding="utf-8")) for path in args.results]
        for path, result in zip(args.results, results):
            if not isinstance(result, dict) or "arms" not in result:
                raise ValueError(f"{path} is not vlm-report's results.json (it has no 'arms'; vlm-eval's "
                                 "results.json holds one run's scores, not a comparison)")
        print(markdown_table(results))
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
