"""A query to the model under test, and how its answer becomes a metric record.

A protocol turns a benchmark sample into :class:`Query` objects: the images, the prompt,
the kind of answer expected, the ground truth, and the benchmark fields the scorer needs
(``record``). :func:`to_record` parses the generated text with :mod:`evaluators.answers`
and returns the record the benchmark's metrics read: the fields plus ``answer``,
``correct`` and ``invalid`` (unparseable answers are wrong *and* counted as invalid).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping

from .answers import (count_value, existence_subject, keywords_found, parse_choice, parse_count, parse_option,
                      parse_yes_no, tail_first, words)
from .grounding_formats import check_grounding

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
    # option texts (kind "option"), allowed words (kind "choice"), or for kind "keywords" the
    # closed vocabulary an answer must not name beyond its truth (categories, change verbs)
    options: list[str] | None = None
    problem: str | None = None  # why the sample cannot be asked (missing/corrupt image)
    # the ground truth as the data writes it, for an LLM judge (evaluators.judge.reference_text;
    # None: the truth in words). Not part of the fingerprint: it does not change what is asked
    reference: str | None = None
    # what a grounding query (HalluSegBench) asks a box for: {"expression": "dog"} or, for a
    # whole question, {"question": ...}. The model under test words its prompt from it in its
    # family's grounding format (evaluators.grounding_formats); ``prompt`` is the toolkit's
    # wording. None: the query asks for no box
    grounding: dict | None = None

    def __post_init__(self) -> None:
        if self.kind not in ANSWER_KINDS:
            raise ValueError(f"kind must be one of {ANSWER_KINDS}, got {self.kind!r}")
        check_grounding(self.grounding)

    def load_images(self) -> list:
        return [img.open() if hasattr(img, "open") and hasattr(img, "path") else img for img in self.images]


#: Record fields that tie a query to others its metrics read together: a HalluSegBench
#: image pair, a Causal-HalBench pair, a DO-Bench scene group, a MIOH image set (its
#: selective, comprehensive and per-image questions). ReactBench's items carry none: their
#: unit is read from the id (:data:`UNIT_RULES`).
UNIT_FIELDS = ("sample_id", "pair_id", "scene_id", "set_id", "decomposed_of")


def _react_item(key: str) -> str:
    match = re.match(r"react-\d+-[a-z]+-\d+(?=-|$)", key)
    return match.group(0) if match else key


#: Per benchmark, the unit of a key (the first :data:`UNIT_FIELDS` value a record holds,
#: else its id), where ids say more than the fields:
#:
#: * HalluSegBench: the built-in suite asks the referring and the reasoning queries of one
#:   factual/counterfactual image pair (sample ids "hsb-S-K" and "hsb-S-K-reasoning");
#: * MIOH: a set's questions and their decompositions, "<set>-comprehensive",
#:   "<set>-decomposed" and "<set>-comprehensive-decomposed" (the metric records the
#:   decompositions are combined into keep no ``set_id``);
#: * ReactBench: one item of the built-in suite (its image or pair), its YN / SA / MC
#:   questions and their inducing, hint and chain-of-thought variants ("react-S-re-K-...");
#:   a user's own questions stay single units.
UNIT_RULES: dict[str, Callable[[str], str]] = {
    "hallusegbench": lambda key: re.sub(r"-reasoning$", "", key),
    "mioh": lambda key: re.sub(r"(-comprehensive)?(-decomposed)?$", "", key),
    "reactbench": _react_item,
}


def unit_key(benchmark: str, record: Mapping[str, Any]) -> str:
    """The sample (unit) a record of ``benchmark`` belongs to: a query's record fields with
    its ``id``, or a metric record. The one rule for ``--limit`` (:func:`first_units`: whole
    samples) and for the report's paired bootstrap (``evaluators.report.attribution.UNITS``:
    the units it resamples), so the two never disagree on what a sample is."""
    key = next((str(record[f]) for f in UNIT_FIELDS if record.get(f) is not None), None)
    if key is None:
        key = str(record["id"])
    rule = UNIT_RULES.get(benchmark)
    return rule(key) if rule else key


def unit_of(query: Query) -> str:
    """The sample ``query`` belongs to (its own id when it stands alone): :func:`unit_key`."""
    return unit_key(query.benchmark, {**query.record, "id": query.id})


def first_units(queries: list[Query], n: int) -> list[Query]:
    """The queries of the first samples, taken whole, until there are at least ``n`` (the
    ``--limit`` rule): cutting at exactly ``n`` left a HalluSegBench pair or a scene group
    half asked, and its metrics then skipped it without a word."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of queries, got {n!r}")
    units = [unit_of(q) for q in queries]
    size: dict[str, int] = {}
    for unit in units:
        size[unit] = size.get(unit, 0) + 1
    kept, count = set(), 0
    for unit in units:
        if unit not in kept and count < n:
            kept.add(unit)
            count += size[unit]
    return [q for q, unit in zip(queries, units) if unit in kept]


def repeated_ids(queries: list[Query]) -> list[str]:
    """Query ids that occur more than once (a run resumes by id, so they must be unique)."""
    seen: dict[str, int] = {}
    for q in queries:
        seen[q.id] = seen.get(q.id, 0) + 1
    return [i for i, n in seen.items() if n > 1]


def fingerprint(query: Query) -> str:
    """A digest of what the query asks: benchmark, prompt, kind, truth, options and images
    (a rendered image by its pixels, a file by its name: not its folder, which moves or is
    written relative or absolute, nor its size, which changes when a missing image is
    restored). A run resumes by query id; two queries under one id that differ in this are
    not the same question."""
    import hashlib
    import json

    h = hashlib.sha256(json.dumps([query.benchmark, query.prompt, query.kind, query.truth, query.options],
                                  sort_keys=True, default=str).encode())
    for image in query.images:
        if hasattr(image, "path"):  # an ImageRef: read lazily, so by its file name
            h.update(f"file:{image.path.name}".encode())
        else:
            h.update(f"pixels:{image.mode}:{image.size}".encode())
            h.update(image.tobytes())
    return h.hexdigest()[:16]


def image_files(query: Query) -> list:
    """The paths of the image files ``query`` reads (:class:`evaluators.data.ImageRef`; the
    built-in suites' rendered PIL images have none)."""
    return [im.path for im in query.images if hasattr(im, "path") and not hasattr(im, "size")]


def image_digests(query: Query) -> list[str] | None:
    """A digest (sha256, 16 hex digits) of each image file ``query`` reads, in order; None
    when it reads none, or one cannot be read. The fingerprint knows a file by its name
    only (:func:`fingerprint`), so the runner stores these beside an answer and refuses to
    resume onto an image that was changed in place since it was answered."""
    paths = image_files(query)
    if not paths:
        return None
    try:
        return [_file_digest(str(p), *_stat(p)) for p in paths]
    except OSError:
        return None


def _stat(path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


@lru_cache(maxsize=65536)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    """Cached by modification time and size: each arm of a report reads the same files."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def parse(query: Query, text: str) -> Any:
    """The answer as the benchmark compares it, or None if unreadable: read from what follows
    a closing "answer is ..." / "final answer: ..." when that part is readable
    (:func:`evaluators.answers.answer_tail`: reasoning before it names other values), else from
    the whole text; a chain-of-thought query (``mode`` "cot") reads its last sentence before
    the whole text (:func:`evaluators.answers.tail_first`)."""
    # what the question itself says is read once, not for each part of the answer tried
    asked = (existence_subject(query.prompt) if query.kind == "yes_no"
             else words(query.prompt) if query.kind == "choice" else None)
    return tail_first(text, lambda part: _parse(query, part, asked), yes_no=query.kind == "yes_no",
                      final=query.record.get("mode") == "cot")


def _parse(query: Query, text: str, asked: Any = None) -> Any:
    """``asked``: the existence question's object (kind ``yes_no``) or the question's words
    (kind ``choice``), as :func:`parse` reads them."""
    if query.kind == "yes_no":
        return parse_yes_no(text, subject=asked)
    if query.kind == "option":
        return parse_option(text, query.options or [])
    if query.kind == "number":  # a count: "there are no forks" is 0; a stated range ("between 3
        # and 5") is read as the range, so it is wrong, not its first number (ReactBench Sec. 3.1
        # asks for "the exact quantity"; reactbench.metrics.count_correct's exact rule)
        stated = parse_count(text)
        return stated if isinstance(stated, tuple) else count_value(text)
    if query.kind == "interval":  # a count, or the range the answer states
        return parse_count(text)
    if query.kind == "choice":  # a colour the question names (a premise) is read last
        return parse_choice(text, query.options or [], asked=asked or ())
    if query.kind == "keywords":  # the ground-truth keywords the answer says (not denies), not
        # counting a word that only says where ("on the left", "next to the knife": a change
        # described with its place had been wrong for naming a direction or category beyond
        # its truth; an audit, session 39)
        if not words(text):
            return None
        return sorted(keywords_found(text, {w for alt in keyword_alternatives(query.truth) for w in alt}
                                     | set(query.options or ()), places=False))
    return text.strip() or None


def keyword_alternatives(truth) -> list[list[str]]:
    """A ``keywords`` query's truth as its accepted alternatives: a list of words is one
    (the answer), a list of such lists several (the answer and its synonyms)."""
    if truth and all(isinstance(t, str) for t in truth):
        return [list(truth)]
    return [list(t) for t in truth]


def regrade(record: dict, query: Query) -> dict:
    """A stored record graded again from its raw ``answer`` with today's parsers: a run that
    resumes, or a report over finished folders, scores every answer by one rule, not each by
    the code that wrote it (a parser fixed since then left the older lines graded the old
    way). Other fields (the query fingerprint) are kept; a record of an input that could not
    be asked (a missing image: no answer) is kept as it is. A line an LLM judge graded
    (:mod:`evaluators.judge`) is graded by rule again, its judge's fields dropped: the runner
    applies the judge again where one is given (its verdicts are kept)."""
    if record.get("invalid_input") or not isinstance(record.get("answer"), str):
        return record
    from .judge import rule_graded  # graded by rule again: a judge's grade is the judge's to give again

    return {**rule_graded(record), **to_record(query, record["answer"])}


def _plain_truth(truth: Any) -> Any:
    """``truth`` where a record can show it as it is (text, a number, a short list of them);
    None for the rest (a HalluSegBench mask, a box array), which the benchmark's own data holds."""
    simple = (str, int, float, bool)
    if isinstance(truth, simple):
        return truth
    if isinstance(truth, (list, tuple)) and len(truth) <= 16 and all(
            isinstance(t, simple) or (isinstance(t, (list, tuple)) and all(isinstance(u, simple) for u in t))
            for t in truth):
        return list(truth)
    return None


def to_record(query: Query, text: str) -> dict:
    """The per-sample record: benchmark fields + raw answer + parsed/correct/invalid, and
    what a reader needs to check the answer by hand (lmms-eval's logged samples keep it too):
    the ``prompt`` asked, the ``truth`` where it is plain (:func:`_plain_truth`), and
    ``image_paths`` for images read from files (built-in suites render theirs)."""
    value = parse(query, text)
    record = {**query.record, "id": query.id, "benchmark": query.benchmark, "prompt": query.prompt,
              "truth": _plain_truth(query.truth), "answer": text, "parsed": value, "invalid": value is None}
    if paths := image_files(query):
        record["image_paths"] = [str(p) for p in paths]
    if query.kind == "yes_no":
        record["pred_yes"] = value
        record["correct"] = value is not None and value == (query.truth == "yes")
    elif query.kind == "keywords":  # right when it says every word of one accepted alternative,
        # and no word of the closed vocabulary (``options``) that no alternative holds: a list
        # of every category and verb said every truth ("added, moved or removed")
        alternatives = keyword_alternatives(query.truth)
        allowed = {w for alt in alternatives for w in alt}
        record["correct"] = value is not None and any(set(alt) <= set(value) for alt in alternatives) \
            and not set(value) - allowed
    elif query.kind == "interval":  # the rule of reactbench.metrics.count_correct
        from .benchmarks.reactbench.metrics import count_correct

        low, high = query.truth  # the rule reads only the interval: any count inside it stands for the truth
        record["correct"] = count_correct(value, low, "interval", (low, high))
    else:
        record["correct"] = value is not None and value == query.truth
    return record
