"""DO-Bench has no public release: one JSON Lines record per evaluation instance, with the
paper's names (Sec. 3: scene groups; A-series = present-but-anomalous object, B-series =
absent-but-expected object; prior levels 0-3; views Full / Cluster / Crop)."""

from ...schema import Field, load_jsonl

SCHEMA = (
    Field("id", (str, int), doc="unique instance id"),
    Field("scene_id", (str, int), doc="the scene group the instance belongs to (10 instances per scene)"),
    Field("image", str, images=True, doc="the view's image"),
    Field("series", str, choices=("A", "B"), doc="A: target present (GT yes); B: target absent (GT no)"),
    Field("level", int, choices=(0, 1, 2, 3), doc="contextual prior strength (A0-A3 / B0-B3)"),
    Field("view", str, choices=("Full", "Cluster", "Crop"), doc="evidence concentration (Cluster/Crop only at A0)"),
    Field("object", str, doc="the queried object"),
    Field("question", str, doc="the full prompt, prior sentence included"),
    Field("answer", str, choices=("yes", "no"), doc="ground truth"),
    Field("margin", float, optional=True, doc="crop margin of Cluster/Crop views (0.1 or 0.2)"),
)


def load(path, image_root=None):
    return load_jsonl(path, SCHEMA, image_root)
