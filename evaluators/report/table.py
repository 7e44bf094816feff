"""The mechanism x mitigation table printed on stdout."""

from __future__ import annotations

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
    cands = [r for r in rows if r.get("mechanism") == mechanism and "delta" in r and r["delta"] == r["delta"]]
    cands = [r for r in cands if r.get("higher_is_better") is not None] or cands
    if not cands:
        return ""
    decided = [r for r in cands if r.get("verdict") in ("fixes", "breaks")]
    best = max(decided or cands, key=lambda r: abs(r["delta"]))
    return f"{best['delta']:+.1f} [{best['low']:+.1f},{best['high']:+.1f}]"


def ratio_text(value: float | None) -> str:
    """A wall-clock ratio, or why there is none (an arm resumed after a kill timed only its rest)."""
    return "not measured" if value is None else f"{value:.2f}x"


def text_table(result: dict) -> str:
    arms = [a["name"] for a in result["arms"] if a["baseline"]]
    width = len("cost: rows/token, time") + 2
    col = max(24, *(len(a) + 2 for a in arms))
    lines = ["mechanism".ljust(width) + "".join(a.ljust(col) for a in arms)]
    for mech in MECHANISMS:
        cells = []
        for a in arms:
            v = SHORT[result["verdicts"][a][mech]]
            h = headline(result["comparisons"][a], mech)
            cells.append(f"{v} {h}".strip().ljust(col))
        lines.append(mech.ljust(width) + "".join(cells))
    yes = "yes-ratio (DO-Bench)".ljust(width)
    lines.append(yes + "".join(f"{result['yes_ratio'][a].get('dobench', float('nan')):.1f}%".ljust(col) for a in arms))
    cost = "cost: rows/token, time".ljust(width)
    lines.append(cost + "".join(
        f"{result['cost'][a]['forward_rows_per_token']}x, {ratio_text(result['cost'][a]['wall_clock_vs_baseline'])}".ljust(col)
        for a in arms))
    flags = [f"{a}: gain on {', '.join(m)} is matched by its control" for a, m in result["explained_by_control"].items() if m]
    return "\n".join(lines + (["", *flags] if flags else []))
