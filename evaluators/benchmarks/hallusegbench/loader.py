"""HalluSegBench's native ``data.json`` (DESIGN.md §4).

Each entry: ``factual_image_path``, ``factual_mask_path``, ``counterfactual_image_path``,
``counterfactual_mask_path``, ``factual_label``, ``counterfactual_label``; reasoning
entries also carry ``question`` and ``counterfactual_question``. Paths are relative to the
folder of ``data.json`` unless absolute. An entry with a question belongs to the
``reasoning`` split, otherwise to ``referring`` (the paper reports them apart).

The release on the Hugging Face Hub keeps one ``data.json`` per subset
(``test/refer_seg``, ``test/reason_seg_val``, ``test/reason_seg_test``) and names entries by
``ann_id``: a folder without a ``data.json`` of its own loads the ``data.json`` of each
subfolder, and a sample's id is ``<subset folder>/<id or ann_id or position>``, so that
samples of two subsets never share an id (a run resumes by id).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ...data import DataError, ImageRef, field, read_json_list

PATH_FIELDS = ("factual_image_path", "factual_mask_path", "counterfactual_image_path", "counterfactual_mask_path")


@dataclass(frozen=True)
class SegSample:
    id: str
    split: str  # "referring" | "reasoning"
    factual_image: ImageRef
    factual_mask: ImageRef
    counterfactual_image: ImageRef
    counterfactual_mask: ImageRef
    factual_label: str
    counterfactual_label: str
    question: str | None = None
    counterfactual_question: str | None = None

    @property
    def problem(self) -> str | None:
        """Why the sample cannot be scored, or None: a missing or corrupt file, a mask whose
        size is not its image's, or a ground-truth mask with no object pixel (read as the
        metrics read it: grey level > 0). The paper's M_c always exists (Sec. 4.1: "we retain
        the ground-truth mask M_c provided by the original datasets"), and an answer is drawn
        on its mask's grid, so a 50x50 mask of a 100x100 image would have scored a
        pixel-exact box IoU 0.25, and an empty one IoU_fact 0 in the means while CMS left the
        pair out (an audit, session 38). Such a sample is an invalid input, counted and
        named, not scored.

        So is a counterfactual image with the factual image's pixels: "I' is an edited
        version of I, in which the object of class c is replaced" (Sec. 3), and a pair without the edit scores ΔIoU_visual as if the model had
        segmented c' where there is still c (an audit, session 38: the same file given twice)."""
        for ref in (self.factual_image, self.factual_mask, self.counterfactual_image, self.counterfactual_mask):
            if (issue := ref.problem) is not None:
                return issue
        with Image.open(self.factual_image.path) as f, Image.open(self.counterfactual_image.path) as c:
            if f.size == c.size and np.array_equal(np.asarray(f.convert("RGB")), np.asarray(c.convert("RGB"))):
                return (f"counterfactual image {self.counterfactual_image.path} has the pixels of the factual "
                        f"image {self.factual_image.path}: the pair shows no edit")
        for image, mask in ((self.factual_image, self.factual_mask), (self.counterfactual_image, self.counterfactual_mask)):
            with Image.open(image.path) as img, Image.open(mask.path) as m:
                if img.size != m.size:
                    return f"mask {mask.path} is {m.width}x{m.height}, its image {image.path} {img.width}x{img.height}"
                if not (np.asarray(m.convert("L")) > 0).any():
                    return f"mask {mask.path} has no object pixel (grey level > 0)"
        return None


def load(path: str | Path) -> list[SegSample]:
    """Samples from ``data.json`` (or a folder holding it). Malformed entries raise
    :class:`DataError` naming file, item and field; file problems are left to
    :attr:`SegSample.problem` so a run can count them and go on."""
    path = Path(path)
    if path.is_dir() and not (path / "data.json").is_file():
        subsets = sorted(p for p in path.glob("*/data.json") if p.is_file())
        if not subsets:
            raise DataError(path, None, None, "is a directory with no data.json, nor any in its subfolders: give "
                            "data.json, the folder holding it, or the release's test/ folder (one <subset>/data.json "
                            "each)")
        return [s for subset in subsets for s in load(subset)]
    if path.is_dir():
        path = path / "data.json"
    root = path.parent
    samples = []
    first_item: dict[str, int] = {}
    for i, item in read_json_list(path):
        sample_id = f"{root.resolve().name}/{item.get('id', item.get('ann_id', i))}"  # the same however the path is written
        if sample_id in first_item:  # a run resumes by id: the second would be taken as answered
            key = "id" if "id" in item else "ann_id" if "ann_id" in item else None
            raise DataError(path, i, key, f"sample {sample_id!r} already given by item {first_item[sample_id]}")
        first_item[sample_id] = i
        paths = {name: field(item, name, str, path, i) for name in PATH_FIELDS}
        question = field(item, "question", str, path, i, optional=True)
        cf_question = field(item, "counterfactual_question", str, path, i, optional=True)
        if (question is None) != (cf_question is None):
            raise DataError(path, i, "counterfactual_question", "reasoning entries need both questions")
        ref = {name: ImageRef(p if Path(p).is_absolute() else root / p) for name, p in
               ((n, Path(v)) for n, v in paths.items())}
        if ref["factual_image_path"].path.resolve() == ref["counterfactual_image_path"].path.resolve():
            raise DataError(path, i, "counterfactual_image_path", f"is the factual image {paths['factual_image_path']!r}: "
                            "I' must be the edited image (c replaced by c')")
        # a pair is c in I against c' in I' (Sec. 3): the same label twice would score
        # dIoU_textual 0 by construction, not by what the model does
        labels = [field(item, name, str, path, i) for name in ("factual_label", "counterfactual_label")]
        if labels[0].strip().lower() == labels[1].strip().lower():
            raise DataError(path, i, "counterfactual_label", f"is the factual label {labels[0]!r}: the "
                            "counterfactual object c' must differ from c")
        samples.append(SegSample(
            id=sample_id,
            split="reasoning" if question is not None else "referring",
            factual_image=ref["factual_image_path"],
            factual_mask=ref["factual_mask_path"],
            counterfactual_image=ref["counterfactual_image_path"],
            counterfactual_mask=ref["counterfactual_mask_path"],
            factual_label=field(item, "factual_label", str, path, i),
            counterfactual_label=field(item, "counterfactual_label", str, path, i),
            question=question,
            counterfactual_question=cf_question,
        ))
    return samples
