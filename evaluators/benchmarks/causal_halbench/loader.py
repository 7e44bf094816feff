"""Causal-HalBench's native ``qa.json`` (DESIGN.md §4).

Items: ``image_name``, ``q``, ``type`` (target | absent | inpaint), ``tag`` (origin |
inpainted), ``id``, ``answer`` (yes | no). A counterfactual image's name is its base
image's name plus a 3-digit suffix, which is how base/counterfactual pairs are formed (for
CPR and the paired metrics). The authors' release writes the suffix after an underscore
(``COCO_val2014_000000580294.jpg`` -> ``COCO_val2014_000000580294_001.jpg``); the bare form
(``000123.jpg`` -> ``000123001.jpg``) is read too. Where both readings are possible, the one
naming an origin image of the file wins.

Ids: the authors' ``metric.py`` keys an item by (base image, ``id``), so an ``id`` need be
unique only among the items of one base image and its counterfactuals. Where every ``id``
of the file is unique we keep it as the item's id; where one repeats under two base
images, every item's id becomes ``<base image>/<id>`` (stable for a given file, so a run
resumes by it). An ``id`` repeated within one base image's group is a :class:`DataError`,
as the authors' key would silently keep only the last of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...data import DataError, ImageRef, field, read_json_list

TYPES = ("target", "absent", "inpaint")
TAGS = ("origin", "inpainted")
#: The ground truth each question type has by construction (Sec. 4.3).
EXPECTED = {"target": "yes", "inpaint": "yes", "absent": "no"}


@dataclass(frozen=True)
class QAItem:
    id: str
    image: ImageRef
    question: str
    type: str
    tag: str
    answer: str
    base_name: str  # the origin image this item's image derives from (itself for origin)

    @property
    def problem(self) -> str | None:
        return self.image.problem


_SUFFIX = re.compile(r"^(?P<base>.+?)(?P<sep>_?)(?P<n>\d{3})$")


def _base_candidates(image_name: str, file: Path, line: int) -> list[str]:
    """The origin names an inpainted image's name can derive from, underscore form first."""
    path = Path(image_name)
    stem, suffix = path.stem, path.suffix
    m = _SUFFIX.match(stem)
    if m is None:
        raise DataError(file, line, "image_name",
                        f"an inpainted image needs a 3-digit suffix (name_001.jpg or name001.jpg), got {image_name!r}")
    forms = [stem[:-4] + suffix] if m.group("sep") else []
    forms.append(stem[:-3] + suffix)
    return [str(path.with_name(f)) if path.parent != Path(".") else f for f in forms]


def load(path: str | Path, image_dir: str | Path | None = None) -> list[QAItem]:
    """Items from ``qa.json`` (or a folder holding it); images are looked up in
    ``image_dir`` (default: an ``images`` folder beside the file, else the file's folder)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "qa.json").is_file():
            raise DataError(path, None, None, "is a directory without a qa.json: give the qa.json file, or the "
                            "folder holding it")
        path = path / "qa.json"
    if image_dir is None:
        image_dir = path.parent / "images" if (path.parent / "images").is_dir() else path.parent
    image_dir = Path(image_dir)
    rows = []
    for i, raw in read_json_list(path):
        name = field(raw, "image_name", str, path, i)
        tag = field(raw, "tag", str, path, i, choices=TAGS)
        rows.append((i, raw, name, tag, _base_candidates(name, path, i) if tag == "inpainted" else [name]))
    origins = {name for _, _, name, tag, _ in rows if tag == "origin"}
    keyed = []  # (line, raw, name, tag, base, id)
    first_item: dict[tuple[str, str], int] = {}
    for i, raw, name, tag, bases in rows:
        base = next((b for b in bases if b in origins), bases[0])
        item_id = str(field(raw, "id", (str, int), path, i))
        if (base, item_id) in first_item:  # a run resumes by id: the second would be taken as answered
            raise DataError(path, i, "id", f"{item_id!r} already used by item {first_item[base, item_id]} "
                            f"(both in the group of base image {base!r})")
        first_item[base, item_id] = i
        keyed.append((i, raw, name, tag, base, item_id))
    qualified = len({item_id for *_, item_id in keyed}) < len(keyed)  # an id repeats across base images
    items = []
    for i, raw, name, tag, base, item_id in keyed:
        kind = field(raw, "type", str, path, i, choices=TYPES)
        if kind == "inpaint" and tag == "origin":  # the metrics refused it at scoring time (Sec. 4.3)
            raise DataError(path, i, "type", "an 'inpaint' question (Q_cf, about the object put into the "
                            "counterfactual image) is asked only of an inpainted image, not of an origin one")
        answer = field(raw, "answer", str, path, i, choices=("yes", "no"))
        if answer != EXPECTED[kind]:  # Sec. 4.3 fixes each type's truth; CHR and AAC assume it
            raise DataError(path, i, "answer", f"a {kind!r} question's answer is {EXPECTED[kind]!r} by the "
                            f"benchmark's construction (Sec. 4.3: Q_c and Q_cf ask about objects that are "
                            f"there, Q_a about absent ones), got {answer!r}")
        items.append(QAItem(
            id=f"{base}/{item_id}" if qualified else item_id,
            image=ImageRef(image_dir / name),
            question=field(raw, "q", str, path, i),
            type=kind,
            tag=tag,
            answer=answer,
            base_name=base,
        ))
    return items


def pairs(items: list[QAItem]) -> list[tuple[QAItem, QAItem]]:
    """(origin item, counterfactual item) pairs asking the same question of the same base
    image: one per counterfactual item, the unit of CPR (both answers right).

    The original image is asked a question once per counterfactual derived from it (Sec.
    4.2, Table 1), so several origin items may ask it; the pair holds the first of them
    (file order), as the authors' ``calculate_cpr`` keeps the first question of each type.
    :func:`evaluators.benchmarks.causal_halbench.metrics.cpr` scores answers, not items, and
    averages those repeated original answers instead (identical under greedy decoding)."""
    origin: dict[tuple, QAItem] = {}
    for it in items:
        if it.tag == "origin":
            origin.setdefault((it.base_name, it.type, it.question), it)
    out = []
    for it in items:
        if it.tag == "inpainted":
            match = origin.get((it.base_name, it.type, it.question))
            if match is not None:
                out.append((match, it))
    return out
