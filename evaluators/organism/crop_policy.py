"""Crop-and-verify's overturn threshold and view prompt, traded off on DO-Bench's curves.

    python -m evaluators.organism.crop_policy --scenes 40 --seed 0     # the report's scenes, full scale
    python -m evaluators.organism.crop_policy --scenes 40 --seed 1     # other scenes
    python -m evaluators.organism.crop_policy --settings views         # pair view, control window
    python -m evaluators.organism.crop_policy --settings gate          # gate (cost) x tau (effect)
    python -m evaluators.organism.crop_policy --settings locate        # attention vs embedding localiser
    python -m evaluators.organism.crop_policy --settings zoom-views    # zoomed search: views, margin, control
    python -m evaluators.organism.crop_policy --settings view-subsets  # the default's views, each alone, by gate

Issue 6 asks that the Full-view false "no" on present objects fall while the false "yes"
on absent ones (DO-Bench's B-series) rises by at most 3 points. Both depend on ``tau`` (a
view's p(yes) must exceed it to overturn a "no") and on what the views are asked. This
runs :class:`mitigate.CropVerify` once per setting with ``tau = 0`` -- every gated query
is localised and re-asked, the same passes any ``tau`` would run -- keeps each view's
p(yes), and replays the policy for each ``tau``: the answers ``CropVerify(tau=t)`` gives,
for every ``t`` at the cost of one run (exact for ``t >= 0.5``: a view whose p(yes) exceeds
one half answers "yes" greedily, which is what the overturn puts in; ``TAUS`` start there).
Printed as a Markdown table of the A-series false-"no" and B-series false-"yes" rates (%)
per prior level, Full view.
"""

from __future__ import annotations

import argparse

import torch

from ..answers import parse_yes_no
from ..benchmarks.dobench.suite import build

TAUS = (0.5, 0.6, 0.7, 0.8, 0.9)
_OBJECT = {"layers": [0], "queries": "object", "heads": "peak", "generic_prompt": None}
#: ``--settings``: named CropVerify configurations, compared on the same queries.
SETTINGS = {
    # session 6: localiser x what the views are asked
    "policy": {
        "ViCrop (default); views asked the question alone": {},
        "ViCrop (default); views asked the whole prompt": {"strip_priors": False},
        "object tokens, peak head, layer 0; views asked the question alone": _OBJECT,
        "object tokens, peak head, layer 0; views asked the whole prompt": {**_OBJECT, "strip_priors": False},
    },
    # session 7: the [original, crop] pair view and the control window
    "views": {
        "ViCrop (default); crop + cluster": {},
        "ViCrop; crop + cluster, with control": {"control": True},
        "ViCrop; crop + cluster + [original, crop] pair": {"views": ("crop", "cluster", "pair")},
        "ViCrop; [original, crop] pair alone": {"views": ("pair",)},
        "object tokens, peak head, layer 0; crop + cluster, with control": {**_OBJECT, "control": True},
    },
    # session 7: the confidence gate (cost) against the overturn threshold (effect)
    "gate": {"ViCrop (default), every first answer but yes verified": {"gate": 1.0}},
    "gate-embedding": {"embedding localiser, every first answer but yes verified": {"gate": 1.0, "locate": "embedding"}},
    "gate-zoom": {"zoomed embedding search, every first answer but yes verified": {"gate": 1.0, "locate": "zoom"}},
    # session 17: where the views are cut -- attention (ViCrop) or the object's name in embedding space
    "locate": {
        "ViCrop (default)": {},
        "embedding (locate='embedding')": {"locate": "embedding"},
        "zoomed embedding search, 2x2 tiles (locate='zoom')": {"locate": "zoom"},
        "zoomed embedding search, 3x3 tiles": {"locate": "zoom", "zoom_grid": 3},
        "object tokens, peak head, layer 0": _OBJECT,
    },
    # session 38: the zoomed search's views, margin and control on the A-series of the base scene
    "zoom-views": {
        "zoom 3x3 + control": {"locate": "zoom", "zoom_grid": 3, "control": True},
        "zoom 2x2 + control": {"locate": "zoom", "control": True},
        "zoom 3x3, crop only": {"locate": "zoom", "zoom_grid": 3, "views": ("crop",)},
        "zoom 3x3, cluster only": {"locate": "zoom", "zoom_grid": 3, "views": ("cluster",)},
        "zoom 3x3, margin 0.2": {"locate": "zoom", "zoom_grid": 3, "margin": 0.2},
    },
    # session 41: one run of the default, replayed with each of its views alone (view_subset_table)
    "view-subsets": {"ViCrop (default)": {}},
}
#: ``--settings view-subsets``: what the default's run is replayed with -- the views kept
#: (a subset of ``CropVerify.views``), the gates and the thresholds.
VIEW_SUBSETS = (("crop", "cluster"), ("crop",), ("cluster",))
SUBSET_GATES = (0.8, 0.85, 0.9)
SUBSET_TAUS = (0.7, 0.8, 0.9)
GATES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def collect(model, processor, scenes: int, seed: int, batch: int = 16, settings: str = "policy") -> dict[str, list[dict]]:
    """Per setting, one record per Full-view query: series, level, first answer, whether
    the gate let it through, each view's p(yes) and (with ``control``) the control's."""
    from mitigate import CropVerify

    return {name: full_view_records(CropVerify(processor, tau=0.0, **kwargs), model, scenes, seed, batch)
            for name, kwargs in SETTINGS[settings].items()}


def full_view_records(cv, model, scenes: int, seed: int, batch: int = 16) -> list[dict]:
    """``cv``'s answers (a :class:`mitigate.CropVerify`, normally at ``tau = 0``) to DO-Bench's
    Full-view queries of ``scenes`` scene groups, one record each (:func:`collect`)."""
    queries = [q for q in build(n_scenes=scenes, seed=seed) if q.record["view"] == "Full"]
    out = []
    for i in range(0, len(queries), batch):
        chunk = queries[i : i + batch]
        for q, r in zip(chunk, cv.answer(model, [q.images[0] for q in chunk], [q.prompt for q in chunk])):
            out.append({"series": q.record["series"], "level": q.record["level"],
                        "first": parse_yes_no(r["first_answer"]), "verified": r["verified"],
                        "confidence": r["confidence"], "p_yes": [v["p_yes"] for v in r["views"].values()],
                        "views": list(r["views"]),
                        "p_control": r["control"]["p_yes"] if "control" in r else None})
    return out


def _gated(record: dict, gate: float | None) -> bool:
    """Verified in the run, and (replaying a stricter ``gate``) first-token confidence below it."""
    return record["verified"] and (gate is None or record["confidence"] < gate)


def _kept(record: dict, views: tuple[str, ...] | None) -> list[float]:
    """The p(yes) of ``record``'s views named in ``views`` (None: all it was asked). A view the
    run did not ask cannot be replayed: a ``ValueError``, not the unmitigated answer."""
    if views is None:
        return record["p_yes"]
    if "views" not in record:
        raise ValueError("replaying a subset of views needs each record's view names (record['views'])")
    if record["views"]:  # a verified record: every view replayed must have been asked
        missing = sorted(set(views) - set(record["views"]))
        if missing:
            raise ValueError(f"views {missing} were not asked in this run (it asked {record['views']})")
    return [p for name, p in zip(record["views"], record["p_yes"]) if name in views]


def error_rates(records: list[dict], tau: float | None, gate: float | None = None,
                views: tuple[str, ...] | None = None) -> dict[tuple[str, int], float]:
    """(series, level) -> error rate (%) under the overturn rule at ``tau`` (None: no
    overturn): a view's p(yes) must exceed ``tau`` and, when there is one, the control's;
    ``gate`` replays a stricter confidence gate than the run's (exact: views do not depend on it);
    ``views`` replays the run as if only the views it names had been asked (each view is its
    own row of the views' ``generate()`` and the policy reads each alone, so this is exact up
    to float rounding between batch shapes; the test finds the same answers as real runs)."""
    cells: dict[tuple[str, int], list[bool]] = {}
    for r in records:
        yes = r["first"] is True
        floor = None if tau is None else max(tau, r.get("p_control") or 0.0)
        if floor is not None and _gated(r, gate) and r["first"] is False and any(p > floor for p in _kept(r, views)):
            yes = True
        cells.setdefault((r["series"], r["level"]), []).append(yes if r["series"] == "B" else not yes)
    return {k: 100.0 * sum(v) / len(v) for k, v in cells.items()}


def _levels(rates: dict[tuple[str, int], float], series: str) -> str:
    return " / ".join(f"{rates[(series, level)]:.1f}" for level in range(4))


def table(data: dict[str, list[dict]]) -> str:
    head = ("| setting | tau | A FN level 0 / 1 / 2 / 3 | B FP level 0 / 1 / 2 / 3 | max B rise |\n"
            "|---|---|---|---|---|")
    lines = [head]
    for name, records in data.items():
        base = error_rates(records, None)
        gated = sum(r["verified"] for r in records)
        lines.append(f"| {name} | unmitigated ({gated} of {len(records)} gated) | {_levels(base, 'A')} | {_levels(base, 'B')} | |")
        for tau in TAUS:
            rates = error_rates(records, tau)
            rise = max(rates[("B", lv)] - base[("B", lv)] for lv in range(4))
            lines.append(f"| | {tau} | {_levels(rates, 'A')} | {_levels(rates, 'B')} | {rise:+.1f} |")
    return "\n".join(lines)


def gate_table(records: list[dict], taus: tuple = (0.5, 0.7, 0.9)) -> str:
    """Per gate and tau: the share of queries verified (what the extra passes cost scales
    with) beside the A-series false "no" and B-series false "yes" rates."""
    base = error_rates(records, None)
    lines = ["| gate | verified | tau | A FN level 0 / 1 / 2 / 3 | B FP level 0 / 1 / 2 / 3 | max B rise |",
             "|---|---|---|---|---|---|",
             f"| unmitigated | 0% | | {_levels(base, 'A')} | {_levels(base, 'B')} | |"]
    for gate in GATES:
        share = 100.0 * sum(_gated(r, gate) for r in records) / len(records)
        for tau in taus:
            rates = error_rates(records, tau, gate)
            rise = max(rates[("B", lv)] - base[("B", lv)] for lv in range(4))
            lines.append(f"| {gate} | {share:.1f}% | {tau} | {_levels(rates, 'A')} | {_levels(rates, 'B')} | {rise:+.1f} |")
    return "\n".join(lines)


def view_subset_table(records: list[dict], subsets: tuple = VIEW_SUBSETS, gates: tuple = SUBSET_GATES,
                      taus: tuple = SUBSET_TAUS) -> str:
    """One run of the default replayed with each subset of its views, per gate and tau: what
    dropping a view (half the views' rows) or verifying fewer first answers costs in effect.
    "verified" is the share of queries that pay for localisation and the views."""
    base = error_rates(records, None)
    lines = ["| views | gate | verified | tau | A FN level 0 / 1 / 2 / 3 | B FP level 0 / 1 / 2 / 3 | max B rise |",
             "|---|---|---|---|---|---|---|",
             f"| unmitigated | | 0% | | {_levels(base, 'A')} | {_levels(base, 'B')} | |"]
    for views in subsets:
        for gate in gates:
            share = 100.0 * sum(_gated(r, gate) for r in records) / len(records)
            for tau in taus:
                rates = error_rates(records, tau, gate, views)
                rise = max(rates[("B", lv)] - base[("B", lv)] for lv in range(4))
                lines.append(f"| {' + '.join(views)} | {gate} | {share:.1f}% | {tau} | {_levels(rates, 'A')} | "
                             f"{_levels(rates, 'B')} | {rise:+.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", default=None)
    parser.add_argument("--scenes", type=int, default=40, help="DO-Bench scene groups (full scale: 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", choices=sorted(SETTINGS), default="policy",
                        help="policy: localiser x view prompt (session 6); views: pair view and control window; "
                             "gate, gate-embedding: the confidence gate's share of verified queries against its effect; "
                             "locate: attention against embedding localisation (session 17); view-subsets: the "
                             "default's run replayed with each of its views alone, by gate and tau (session 41)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, processor = load_organism(args.path)
    data = collect(model, processor, args.scenes, args.seed, settings=args.settings)
    records = next(iter(data.values()))
    if args.settings.startswith("gate"):
        print(gate_table(records))
    elif args.settings == "view-subsets":
        print(view_subset_table(records))
    else:
        print(table(data))


if __name__ == "__main__":
    main()
