"""DO-Bench has no public release: one JSON Lines record per evaluation instance, with the
paper's names (Sec. 3: scene groups; A-series = present-but-anomalous object, B-series =
absent-but-expected object; prior levels 0-3; views Full / Cluster / Crop)."""

import math
import warnings

from ...data import DataError
from ...schema import Field, load_jsonl

SCHEMA = (
    Field("id", (str, int), doc="unique instance id"),
    Field("scene_id", (str, int), doc="the scene group the instance belongs to (10 instances per scene)"),
    Field("image", str, images=True, doc="the view's image"),
    Field("series", str, choices=("A", "B"), doc="A: target present (GT yes); B: target absent (GT no)"),
    Field("level", int, choices=(0, 1, 2, 3), doc="contextual prior strength (A0-A3 / B0-B3)"),
    Field("view", str, choices=("Full", "Cluster", "Crop"),
          doc="evidence concentration; Cluster/Crop only in the A-series (A0: the 10 instances; A1-A3: the §4.4 grid)"),
    Field("object", str, doc="the queried object"),
    Field("question", str, doc="the full prompt, prior sentence included"),
    Field("answer", str, choices=("yes", "no"), doc="ground truth: yes in the A-series, no in the B-series"),
    Field("margin", float, optional=True,
          doc="crop margin of Cluster/Crop views (0.1 or 0.2); on all of them or on none"),
)

#: The ground truth each series fixes (Sec. 3.1): the A-object is in the image, the B-object is not.
TRUTH = {"A": "yes", "B": "no"}


def load(path, image_root=None):
    """Validated records (:func:`evaluators.schema.load_jsonl`) that also keep the rules the
    metrics read them by (:func:`check`)."""
    rows = load_jsonl(path, SCHEMA, image_root)
    check(rows, path)
    return rows


def check(rows, path) -> None:
    """A :class:`DataError` naming file, line and field for a record the metrics
    (:mod:`.metrics`) could not score: they refused it at scoring time, after the model had
    answered every query, and left the benchmark unscored (``_not_computed``) or, in
    ``vlm-report``, stopped with a traceback.

    * the answer is the series' (an A-object is present, GT yes; a B-object absent, GT no);
    * the B-series is posed in the Full view only (Cluster / Crop are cut around the
      present A-object; A-series views at levels 1-3 are the §4.4 grid);
    * a margin is a fraction in (0, 1) (the paper's 10% and 20% are 0.1 and 0.2; 10.0 or a
      negative one had loaded), named on every Cluster / Crop view or on none (which margin
      an unnamed view was cut with cannot be told);
    * a scene poses each instance once: (scene, series, level, view, margin) is unique. The
      rates are per instance, so a scene whose A0 Full record came three times counted three
      times in that cell (an audit, session 39). A scene that lacks instances is scored:
      its cells are then over fewer scenes (Sec. 3.1's 10 per scene is the suite's shape,
      :mod:`.suite`, not a rule for user data)."""
    named, unnamed = None, None  # the first Cluster/Crop record with and without a margin
    seen: dict[tuple, int] = {}
    for r in rows:
        line, series = r["_line"], r["series"]
        key = (str(r["scene_id"]), series, r["level"], r["view"], r.get("margin"))
        if key in seen:
            raise DataError(path, line, "scene_id", f"scene {r['scene_id']!r} already poses {series}{r['level']} in "
                            f"the {r['view']} view{'' if key[-1] is None else f' at margin {key[-1]}'} (line "
                            f"{seen[key]}): each instance once, or its cell counts it twice")
        seen[key] = line
        if r["answer"] != TRUTH[series]:
            present = "present" if series == "A" else "absent"
            raise DataError(path, line, "answer", f"the {series}-series object is {present}, so the answer is "
                            f"{TRUTH[series]!r}, got {r['answer']!r}")
        if series == "B" and r["view"] != "Full":
            raise DataError(path, line, "view", "the B-series (absent object) is only posed in the Full view; "
                            f"Cluster and Crop views are cut around the present A-object, got {r['view']!r}")
        margin = r.get("margin")
        if margin is not None and not (math.isfinite(margin) and 0.0 < margin < 1.0):
            raise DataError(path, line, "margin", f"must be a fraction in (0, 1) (DO-Bench's 10% is 0.1), got {margin!r}")
        if r["view"] == "Full":
            continue
        if margin is None:
            unnamed = unnamed or line
        else:
            named = named or line
        if named and unnamed:
            raise DataError(path, line, "margin", f"line {named} names a crop margin and line {unnamed} does not: "
                            "name it on every Cluster/Crop view or on none")
    # loads and scores, but a headline metric whose cells are empty is NaN: say which, and
    # why, before the model runs
    posed = {(r["series"], r["level"], r["view"]) for r in rows}
    curve = [f"{s}{lv}" for s in "AB" for lv in range(4) if (s, lv, "Full") not in posed]
    views = [v for v in ("Cluster", "Crop") if ("A", 0, v) not in posed]
    if rows and curve:
        warnings.warn(f"{path}: no records of {', '.join(curve)} in the Full view, so PriorRobust (Eq. 3, the A-FN "
                      "and B-FP curves over levels 0-3) is NaN and the report's language-prior cell stays empty; "
                      "DO-Bench poses 10 instances per scene, A0-A3 and B0-B3 in the Full view and A0 in the Cluster "
                      "and Crop views (schema.md)", stacklevel=3)
    if rows and views:
        warnings.warn(f"{path}: no A0 records in the {' or '.join(views)} view, so PerceptionAbility (Eq. 2) is NaN "
                      "and the report's weak-perception cell stays empty (schema.md)", stacklevel=3)
