"""HalluSegBench's factual / counterfactual protocol (Sec. 3-4) on world scenes.

Each pair replaces one object of class c by c' in the same place (an exact edit): c' is
the largest object of its own shape that fits the box of c (:func:`evaluators.world.edits.replace`),
so the same box, not the same area -- |M'_{c'}| / |M_c| ranged 0.12-2.18 over 60 built
pairs (16 below 0.5), where the paper's pairs "exhibit nearly identical size
distributions" (Sec. 4.1). Our objects also cover about 2.5% of the image, against the
paper's "most objects occupy 5-15%". A model that returns M_c for every query (it never
reacts to the edit) thus scores ΔIoU_visual 0.57-0.59 on seeds 0 and 1, above Table 1's
best (0.53): read ΔIoU beside CMS, which weighs the leaked area by the object's. Three
queries per pair, as the metrics need (Eqs. 1-3):

* ``fact``: "where is the c ?" on the factual image I        -> M^_c    vs M_c
* ``textual``: "where is the c' ?" on I (c' is not there)      -> M^_{c'} vs M_c
* ``visual``: "where is the c ?" on the counterfactual I'      -> M^'_c   vs M'_{c'}

Answers become masks through :func:`evaluators.masks.answer_mask`: a box (the organism:
coordinate tokens, or "none" to abstain -- also a sentence that denies the record's
``label``, the class asked for, or its ``described`` phrase on the reasoning split; numbers in the record's ``box_frame``, the frame
its model writes boxes in, :mod:`evaluators.box_frames`) is rasterised on the grid of the query's
ground-truth mask (our choice for box-only models; the loader refuses a mask of another
size than its image, so that is the asked image's source resolution, I' for ``visual``), a
polygon is filled, a returned or run-length-encoded mask is used as it is (resized to the
ground truth by the metrics).

**An unreadable answer is wrong**, as everywhere else in the toolkit. The paper is silent
(its scripts skip samples without a prediction, which would let a mitigation that breaks
the answer format drop exactly its hard pairs). On the factual query an unreadable answer
scores IoU 0, the worst there. On the two counterfactual queries, where abstaining is
right, an empty mask would score as a perfect abstention, so it scores IoU 1 instead, is
left out of CMS (unbounded above: no value stands for it) and counts in the unreadable
share of its query (:mod:`.metrics`, "Unreadable answers"). The record's ``unreadable``
lists those roles (their ``pred_*`` mask is the empty one the answer gave) and
``invalid`` is set. Ground-truth masks are recomputed from the
scene stored in each record, so the per-sample file stays small.
"""

from __future__ import annotations

import numpy as np

from ...box_frames import DEFAULT_FRAME
from ...masks import answer_mask
from ...query import Query
from ...world import BIASED, REASONING, Scene, World, check_count, check_seed, check_subset, derive_seed, segmentation_pair
from .metrics import SPLITS


def _prompt(split: str, label: str) -> str:
    if split == "referring":
        return f"where is the {label} ?"
    return f"where is {REASONING[label]} ?"


def build(n_pairs: int = 30, seed: int = 0, world: World | None = None,
          splits: tuple[str, ...] = SPLITS) -> list[Query]:
    """Three queries per pair and split. The splits share the pairs (the same factual and
    counterfactual images): the referring split names the class ("where is the dog ?"),
    the reasoning split describes it (:data:`evaluators.world.REASONING`, "where is an
    animal that barks ?"), the paper's two query styles, reported apart by the metrics."""
    seed = check_seed(seed)
    check_count(n_pairs, "n_pairs")
    splits = check_subset(splits, SPLITS, "splits")
    world = world or World(BIASED)
    queries = []
    for k in range(n_pairs):
        pair = segmentation_pair(world, derive_seed(seed, 21, k))
        images = {"factual": pair.factual.render(), "counterfactual": pair.counterfactual.render()}
        scenes = {"factual_scene": pair.factual.to_dict(), "counterfactual_scene": pair.counterfactual.to_dict()}
        for split in splits:
            sid = f"hsb-{seed}-{k}" + ("" if split == "referring" else f"-{split}")
            common = {"sample_id": sid, "split": split, "uid": pair.uid, **scenes}
            for role, image, label in (("fact", "factual", pair.factual_label),
                                       ("textual", "factual", pair.counterfactual_label),
                                       ("visual", "counterfactual", pair.factual_label)):
                # a family's grounding format asks for the label, or the reasoning split's question
                prompt = _prompt(split, label)
                grounding = {"expression": label} if split == "referring" else {"question": prompt}
                names = {"label": label} if split == "referring" else {"label": label, "described": REASONING[label]}
                queries.append(Query(f"{sid}-{role}", "hallusegbench", [images[image]], prompt,
                                     "text", None, {**common, "role": role, **names}, grounding=grounding))
    return queries


def asked_for(record: dict) -> list[str]:
    """The names a query's answer may deny its object by (an abstention in prose): the class
    asked for, and the description the built-in reasoning split asks it by."""
    return [name for name in (record.get("label"), record.get("described")) if name]


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


def answer_grid(record: dict) -> tuple[int, int]:
    """``(height, width)`` of the grid one query's answer is drawn on: its ground-truth mask's
    (M_c for the factual and textual queries, M'_{c'} for the visual one), read from the
    stored scene or the mask file's header, without decoding a mask. Whether an answer is
    readable depends on it: a box off the image covers no pixel (:mod:`evaluators.masks`)."""
    if "factual_scene" in record:
        scene = record["counterfactual_scene" if record.get("role") == "visual" else "factual_scene"]
        return int(scene["resolution"]), int(scene["resolution"])
    from PIL import Image

    key = "counterfactual_mask_path" if record.get("role") == "visual" else "factual_mask_path"
    if key not in record:
        raise ValueError(f"record: a HalluSegBench query record needs its scene or {key!r}, got keys {sorted(record)}")
    with Image.open(record[key]) as img:
        return img.height, img.width


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
        # each answer on the grid of the image it was asked about: the visual query is asked
        # on I', whose size may differ from I's in user data
        grids = {"fact": gt_fact, "textual": gt_fact, "visual": gt_counterfact}
        preds, unreadable = {}, []
        for role in ("fact", "textual", "visual"):
            answer = None if roles[role].get("invalid_input") else roles[role]["answer"]
            preds[role], bad = answer_mask(answer, grids[role].shape, roles[role].get("box_frame", DEFAULT_FRAME),
                                           asked_for(roles[role]), roles[role].get("empty_abstains", False))
            if bad or roles[role].get("invalid_input"):
                unreadable.append(role)
        out.append({"id": sid, "split": first["split"], "gt_fact": gt_fact, "gt_counterfact": gt_counterfact,
                    "pred_fact": preds["fact"], "pred_textual": preds["textual"], "pred_visual": preds["visual"],
                    "invalid": bool(unreadable), "unreadable": unreadable})
    return out
