"""HalluSegBench's factual / counterfactual protocol (Sec. 3-4) on world scenes.

Each pair replaces one object of class c by c' in the same place and size (an exact
edit). Three queries per pair, as the metrics need (Eqs. 1-3):

* ``fact``: "where is the c ?" on the factual image I        -> M^_c    vs M_c
* ``textual``: "where is the c' ?" on I (c' is not there)      -> M^_{c'} vs M_c
* ``visual``: "where is the c ?" on the counterfactual I'      -> M^'_c   vs M'_{c'}

Models that answer with a box (the organism: coordinate tokens, or "none" to abstain) get
the box rasterised into a mask at the source resolution (our choice for box-only models;
a segmentation model's mask is used as it is). Ground-truth masks are recomputed from the
scene stored in each record, so the per-sample file stays small.
"""

from __future__ import annotations

import numpy as np

from ...answers import parse_box
from ...query import Query
from ...world import BIASED, Scene, World, check_count, check_seed, segmentation_pair


def build(n_pairs: int = 30, seed: int = 0, world: World | None = None) -> list[Query]:
    seed = check_seed(seed)
    check_count(n_pairs, "n_pairs")
    world = world or World(BIASED)
    queries = []
    for k in range(n_pairs):
        pair = segmentation_pair(world, seed * 1_000_003 + 5_000_000 + k)
        sid = f"hsb-{seed}-{k}"
        common = {"sample_id": sid, "split": "referring", "uid": pair.uid,
                  "factual_scene": pair.factual.to_dict(), "counterfactual_scene": pair.counterfactual.to_dict()}
        for role, image, label in (("fact", pair.factual, pair.factual_label),
                                   ("textual", pair.factual, pair.counterfactual_label),
                                   ("visual", pair.counterfactual, pair.factual_label)):
            queries.append(Query(f"{sid}-{role}", "hallusegbench", [image.render()], f"where is the {label} ?",
                                 "text", None, {**common, "role": role, "label": label}))
    return queries


def _ground_truth(record: dict) -> tuple[np.ndarray, np.ndarray]:
    """(M_c, M'_{c'}): from the stored scene (built-in suite) or the mask files (user data)."""
    if "factual_scene" in record:
        factual = Scene.from_dict(record["factual_scene"])
        counterfactual = Scene.from_dict(record["counterfactual_scene"])
        return factual.masks()[record["uid"]], counterfactual.masks()[record["uid"]]
    from PIL import Image

    def read(path: str) -> np.ndarray:
        with Image.open(path) as img:
            return np.asarray(img.convert("L")) > 0

    return read(record["factual_mask_path"]), read(record["counterfactual_mask_path"])


def box_mask(answer: str | None, shape) -> tuple[np.ndarray, bool]:
    """(mask, invalid): a box answer rasterised at the ground truth's ``shape`` (coordinate
    tokens are fractions of the image; JSON boxes are pixels); "none" is an abstention
    (empty, valid); an unreadable answer is an empty mask and counted invalid."""
    height, width = (shape, shape) if isinstance(shape, int) else shape
    mask = np.zeros((height, width), dtype=bool)
    box = parse_box(answer or "", width)
    if box is None:
        return mask, True
    if box == "none":
        return mask, False
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    mask[max(y0, 0) : max(min(y1, height), 0), max(x0, 0) : max(min(x1, width), 0)] = True
    return mask, False


def assemble(records: list[dict]) -> list[dict]:
    """Per-query lines -> one metric record per pair (masks rebuilt from the scenes)."""
    by: dict[str, dict] = {}
    for r in records:
        by.setdefault(r["sample_id"], {})[r["role"]] = r
    out = []
    for sid, roles in sorted(by.items()):
        if set(roles) != {"fact", "textual", "visual"}:
            continue  # a pair is scored once all three of its queries are answered
        first = roles["fact"]
        if any(r.get("invalid_input") for r in roles.values()) and "factual_mask_path" in first:
            continue  # user data whose files are unusable: counted as invalid inputs by the runner
        gt_fact, gt_counterfact = _ground_truth(first)
        preds, invalid = {}, False
        for role in ("fact", "textual", "visual"):
            answer = None if roles[role].get("invalid_input") else roles[role]["answer"]
            preds[role], bad = box_mask(answer, gt_fact.shape)
            invalid |= bad or bool(roles[role].get("invalid_input"))
        out.append({"id": sid, "split": first["split"], "gt_fact": gt_fact, "gt_counterfact": gt_counterfact,
                    "pred_fact": preds["fact"], "pred_textual": preds["textual"], "pred_visual": preds["visual"],
                    "invalid": invalid})
    return out
