"""report.html: self-contained (inline SVG plots and base64 images), viewable offline."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

from PIL import ImageDraw

from ..metrics import MECHANISMS
from .table import SHORT, YES_RATIO_NAMES, headline, ratio_text, reading, yes_ratio_benchmarks, yes_ratio_of

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]
VERDICT_BG = {"fixes": "#c9f2c7", "breaks": "#f7c6c5", "mixed": "#f9e7b4"}


def _img(image, size: int = 128) -> str:
    buf = io.BytesIO()
    image.resize((size, size * image.height // image.width)).save(buf, format="PNG")
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _lines_svg(series: dict[str, list[float]], xlabels: list[str], title: str, ylabel: str) -> str:
    w, h, pad = 360, 220, 40
    out = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg"><text x="{w/2}" y="14" '
           f'text-anchor="middle" font-size="12">{html.escape(title)}</text>']
    out.append(f'<line x1="{pad}" y1="{h-pad}" x2="{w-10}" y2="{h-pad}" stroke="#333"/>'
               f'<line x1="{pad}" y1="20" x2="{pad}" y2="{h-pad}" stroke="#333"/>')
    for v in (0, 50, 100):
        y = h - pad - v / 100 * (h - pad - 20)
        out.append(f'<text x="{pad-4}" y="{y+4}" text-anchor="end" font-size="10">{v}</text>')
    n = len(xlabels)
    xs = [pad + (i + 0.5) * (w - pad - 10) / n for i in range(n)]
    for x, lab in zip(xs, xlabels):
        out.append(f'<text x="{x}" y="{h-pad+14}" text-anchor="middle" font-size="10">{html.escape(lab)}</text>')
    out.append(f'<text x="10" y="{h/2}" font-size="10" transform="rotate(-90 10 {h/2})">{html.escape(ylabel)}</text>')
    for k, (name, values) in enumerate(series.items()):
        pts = [(x, h - pad - v / 100 * (h - pad - 20)) for x, v in zip(xs, values) if v == v]
        colour = COLOURS[k % len(COLOURS)]
        if pts:
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                       + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        out.append(f'<text x="{w-12}" y="{30 + 12*k}" text-anchor="end" font-size="10" fill="{colour}">'
                   f'{html.escape(name)}</text>')
    return "".join(out) + "</svg>"


def _finite(value) -> bool:
    """A number to draw (not None: results.json stores NaN as null; not NaN)."""
    return isinstance(value, (int, float)) and not math.isnan(value)


def _bars_svg(rows: list[dict], title: str) -> str:
    rows = [r for r in rows if r.get("mechanism") and all(_finite(r.get(k)) for k in ("delta", "low", "high"))]
    if not rows:
        return ""
    span = max(1.0, *(max(abs(r["low"]), abs(r["high"])) for r in rows))
    w, row_h, left = 560, 16, 250
    h = 24 + row_h * len(rows)
    mid = left + (w - left - 10) / 2
    scale = (w - left - 20) / 2 / span
    out = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg"><text x="4" y="12" font-size="12">'
           f'{html.escape(title)} (delta, 95% paired-bootstrap interval)</text>',
           f'<line x1="{mid}" y1="16" x2="{mid}" y2="{h}" stroke="#999"/>']
    for i, r in enumerate(rows):
        y = 24 + i * row_h
        good = r["verdict"] == "fixes"
        bad = r["verdict"] == "breaks"
        colour = "#2ca02c" if good else "#d62728" if bad else "#888"
        x0, x1 = sorted((mid, mid + r["delta"] * scale))
        out.append(f'<text x="{left-6}" y="{y+8}" text-anchor="end" font-size="10">'
                   f'{html.escape(r["metric"])} ({html.escape(r["mechanism"])})</text>')
        out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1-x0, 1):.1f}" height="10" fill="{colour}" opacity="0.6"/>')
        out.append(f'<line x1="{mid + r["low"]*scale:.1f}" y1="{y+5}" x2="{mid + r["high"]*scale:.1f}" y2="{y+5}" '
                   f'stroke="#000"/>')
    return "".join(out) + "</svg>"


def _example_image(query):
    """The query's first image to draw on, or None when it cannot be read (a user's file
    that is missing or corrupt: the runner recorded the query as an invalid input, and the
    report is written all the same)."""
    if query.problem or not query.images:
        return None
    first = query.images[0]
    try:
        return first.open() if hasattr(first, "path") else first.copy()
    except (OSError, ValueError, SyntaxError):  # restored, moved or cut short since the run began
        return None


def _examples(queries, records, arms) -> str:
    answers = {a: {r["id"]: r for rs in records[a].values() for r in rs} for a in arms}
    picks = [q for q in queries if q.record.get("series") == "A" and q.record.get("level") == 3][:3]
    picks += [q for q in queries if q.record.get("view") == "Full" and q.record.get("series") == "A"
              and q.record.get("level") == 0][:2]
    picks += [q for q in queries if q.benchmark == "hallusegbench" and q.record.get("role") == "fact"][:2]
    cells = []
    from ..answers import after_reasoning, parse_box
    from ..box_frames import DEFAULT_FRAME

    for q in picks:
        image = _example_image(q)
        if image is None:  # a missing or corrupt file (an invalid input): the example is left out
            continue
        rows = []
        for k, a in enumerate(arms):
            record = answers[a].get(q.id, {})
            ans = record.get("answer")
            if q.benchmark == "hallusegbench" and ans:
                answered = after_reasoning(ans)  # a think block's boxes are no answer
                box = parse_box(answered, image.width, height=image.height,
                                frame=record.get("box_frame", DEFAULT_FRAME)) if answered is not None else None
                if isinstance(box, tuple):
                    ImageDraw.Draw(image).rectangle(box, outline=COLOURS[k % len(COLOURS)], width=2)
            rows.append(f"<tr><td>{html.escape(a)}</td><td>{html.escape(str(ans))}</td></tr>")
        truth = q.truth if q.truth is not None else "(mask)"
        # the prompt the model read: a grounding query is asked in its grounding format
        shown = next((answers[a][q.id]["asked_prompt"] for a in arms if "asked_prompt" in answers[a].get(q.id, {})),
                     q.prompt)
        cells.append(f'<div class="ex">{_img(image)}<p><b>{html.escape(shown)}</b><br>truth: {html.escape(str(truth))}'
                     f'</p><table>{"".join(rows)}</table></div>')
    return "".join(cells)


def _interval_words(result: dict) -> str:
    """How the run read its intervals and corrected them, in words (``--interval``,
    ``--family``; :func:`~evaluators.report.table.reading`)."""
    interval, family = reading(result)
    return ", ".join([{"expanded": "Hesterberg's expanded percentile interval",
                       "percentile": "percentile interval"}[interval],
                      {"arm": "Holm over all of an arm's metrics", "mechanism": "Holm within each mechanism",
                       "none": "no correction"}[family]])


def _judged(result: dict) -> str:
    """List items saying which answers an LLM judge graded (``vlm-report --judge``), per arm:
    how many, how many replies held no verdict, and how often the judge agreed with the rules."""
    items = ""
    for arm, judged in (result.get("judge") or {}).items():
        for bench, j in judged["benchmarks"].items():
            agree = j.get("agreement_with_rules")
            agreement = f"{agree:.1f}% agreement with the rules" if isinstance(agree, (int, float)) and \
                j.get("answers_both_read") else "no answer both it and the rules could read"
            items += (f"<li>{html.escape(arm)}: {html.escape(bench)} graded by the judge "
                      f"<code>{html.escape(str(judged['judge'].get('name')))}</code> ({j['judged']} answers, "
                      f"{j['unreadable_verdicts']} replies without a verdict, {agreement})</li>")
    return items


def write_html(result: dict, queries, records, path: Path) -> None:
    from ..benchmarks.dobench.metrics import curves
    from ..benchmarks.mioh.metrics import accuracy as mioh_accuracy

    arms = [a["name"] for a in result["arms"]]
    compared = [a["name"] for a in result["arms"] if a["baseline"]]
    head = "".join(f"<th>{html.escape(a)}</th>" for a in compared)
    body = ""
    for mech in MECHANISMS:
        tds = ""
        for a in compared:
            v = result["verdicts"][a][mech]
            tds += (f'<td style="background:{VERDICT_BG.get(v, "#fff")}">{SHORT[v]}<br><small>'
                    f'{headline(result["comparisons"][a], mech)}</small></td>')
        body += f"<tr><th>{mech}</th>{tds}</tr>"
    for bench in yes_ratio_benchmarks(result):
        body += f"<tr><th>yes-ratio ({YES_RATIO_NAMES[bench]})</th>" + "".join(
            f"<td>{yes_ratio_of(result['yes_ratio'][a], bench):.1f}%</td>" for a in compared) + "</tr>"
    body += "<tr><th>cost (rows/token, wall clock)</th>" + "".join(
        f"<td>{result['cost'][a]['forward_rows_per_token']}x, {ratio_text(result['cost'][a]['wall_clock_vs_baseline'])}</td>"
        for a in compared) + "</tr>"
    plots = []
    if all("dobench" in records[a] for a in arms):
        c = {a: curves(records[a]["dobench"]) for a in arms}
        plots.append(_lines_svg({a: [c[a]["A_FN"][lv] for lv in range(4)] for a in arms}, ["A0", "A1", "A2", "A3"],
                                "DO-Bench A-series: false negatives vs prior level", "FN %"))
        plots.append(_lines_svg({a: [c[a]["B_FP"][lv] for lv in range(4)] for a in arms}, ["B0", "B1", "B2", "B3"],
                                "DO-Bench B-series: false positives vs prior level", "FP %"))
        plots.append(_lines_svg({a: [c[a]["A0_FN_by_view"][v] for v in ("Full", "Cluster", "Crop")] for a in arms},
                                ["Full", "Cluster", "Crop"], "DO-Bench A0: false negatives vs view", "FN %"))
    if all("mioh" in records[a] for a in arms):
        plots.append(_lines_svg({a: [mioh_accuracy(records[a]["mioh"], condition="NI", n_images=k) for k in (2, 4, 8, 10)]
                                 for a in arms}, ["2", "4", "8", "10"], "MIOH: accuracy vs number of images", "acc %"))
    bars = "".join(_bars_svg(result["comparisons"][a], a) for a in compared)
    card = ""
    if result.get("model_card"):
        items = "".join(f"<li>{html.escape(k)}: {result['model_card']['measured'][k]:.1f} "
                        f"({'target met' if ok else '<b>target not met</b>'})</li>"
                        for k, ok in result["model_card"]["checks"].items())
        card = ("<h2>What this organism can show</h2><p>A mitigation can only fix a failure the model has. "
                "The organism's measured signatures (its model card, "
                f"<code>{html.escape(result['model_card']['card'])}</code>); where a target is not met, the "
                "mechanism is weak or absent in this model and its row cannot show a fix:</p>"
                f"<ul>{items}</ul>")
    flags = "".join(f"<li>{html.escape(a)}: the gain on {html.escape(', '.join(m))} is not shown beyond its control</li>"
                    for a, m in result["explained_by_control"].items() if m)
    flags += _judged(result)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Hallucination mechanism report</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:1200px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:center}}.ex{{display:inline-block;
vertical-align:top;width:280px;margin:8px}}.ex table td{{font-size:11px}}svg{{margin:6px}}</style></head><body>
<h1>Which failure mechanism each mitigation fixes</h1>
<p>Model: <code>{html.escape(result['model'])}</code>; suites: {html.escape(', '.join(result['tasks']))} (scale {result['scale']},
seed {result['seed']}). Every arm answered the same queries as its baseline; cells read the 95% paired-bootstrap
interval of each mechanism's metrics ({result['resamples']} resamples, {html.escape(_interval_words(result))}): FIXES / BREAKS
only when the interval excludes 0 and Holm's procedure keeps the metric.</p>
<table><tr><th>mechanism</th>{head}</tr>{body}</table><ul>{flags}</ul>{card}
<h2>Curves</h2>{''.join(plots)}
<h2>Effects per metric</h2>{bars}
<h2>Examples (DO-Bench A3 and Full-view A0, HalluSegBench boxes)</h2>{_examples(queries, records, arms)}
</body></html>"""
    path.write_text(page)
