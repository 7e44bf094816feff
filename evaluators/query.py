"""A query to the model under test, and how its answer becomes a metric record.

A protocol turns a benchmark sample into :class:`Query` objects: the images, the prompt,
the kind of answer expected, the ground truth, and the benchmark fields the scorer needs
(``record``). :func:`to_record` parses the generated text with :mod:`evaluators.answers`
and returns the record the benchmark's metrics read: the fields plus ``answer``,
``correct`` and ``invalid`` (unparseable answers are wrong *and* counted as invalid).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .answers import parse_choice, parse_number, parse_option, parse_yes_no, words

ANSWER_KINDS = ("yes_no", "option", "number", "interval", "choice", "keywords", "text")


@dataclass
class Query:
    id: str
    benchmark: str
    images: list  # PIL images or evaluators.data.ImageRef
    prompt: str
    kind: str
    truth: Any
    record: dict = field(default_factory=dict)
    options: list[str] | None = None  # option texts (kind "option") or allowed words (kind "choice")
    problem: str | None = None  # why the sample cannot be asked (missing/corrupt image)

    def __post_init__(self) -> None:
        if self.kind not in ANSWER_KINDS:
            raise ValueError(f"kind must be one of {ANSWER_KINDS}, got {self.kind!r}")

    def load_images(self) -> list:
        return [img.open() if hasattr(img, "open") and hasattr(img, "path") else img for img in self.images]


def parse(query: Query, text: str) -> Any:
    """The answer as the benchmark compares it, or None if unreadable."""
    if query.kind == "yes_no":
        return parse_yes_no(text)
    if query.kind == "option":
        return parse_option(text, query.options or [])
    if query.kind in ("number", "interval"):
        return parse_number(text)
    if query.kind == "choice":
        return parse_choice(text, query.options or [])
    if query.kind == "keywords":  # a short answer, right when it holds every ground-truth keyword
        found = set(words(text))
        return sorted(found & set(query.truth)) if found else None
    return text.strip() or None


def to_record(query: Query, text: str) -> dict:
    """The per-sample record: benchmark fields + raw answer + parsed/correct/invalid."""
    value = parse(query, text)
    record = {**query.record, "id": query.id, "benchmark": query.benchmark, "answer": text,
              "parsed": value, "invalid": value is None}
    if query.kind == "yes_no":
        record["pred_yes"] = value
        record["correct"] = value is not None and value == (query.truth == "yes")
    elif query.kind == "keywords":
        record["correct"] = value is not None and set(value) == set(query.truth)
    elif query.kind == "interval":  # a count inside the inclusive [low, high] of the question
        low, high = query.truth
        record["correct"] = value is not None and low <= value <= high
    else:
        record["correct"] = value is not None and value == query.truth
    return record
