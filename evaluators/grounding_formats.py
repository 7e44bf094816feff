"""How each VLM family is asked for a box, and the frame its answer comes in (HalluSegBench).

HalluSegBench's queries ask a model to locate an object ("where is the dog ?" on the
toolkit's suites, the organism's training template). A production VLM asked that way
answers in prose ("The dog is lying on the grass to the left") with no box in it, which the
benchmark must score as unreadable: IoU 0 on the factual query, full leakage on the
counterfactual ones. Each family that was trained to ground has its own request wording and
its own answer form; a :class:`GroundingFormat` holds both:

================  =================================================================  ===============
format            request (``{expression}``: the label or description asked for)     answer frame
================  =================================================================  ===============
``toolkit``       the query's own prompt ("where is the dog ?")                       the family's
``qwen2_vl``      "Please provide the bounding box coordinates of the region this     relative_1000
                  sentence describes: <|object_ref_start|>dog<|object_ref_end|>"
``qwen2_5_vl``    "Locate the dog, output its bbox coordinates using JSON format."    pixels
``qwen3_vl``      the same request                                                    relative_1000
``internvl``      "Please provide the bounding box coordinate of the region this      relative_1000
                  sentence describes: <ref>dog</ref>"
``paligemma``     "detect dog"                                                        its <loc> tokens
``llava_1_5``     "Please provide the bounding box coordinate of the region this      relative_1
                  sentence describes: dog"
================  =================================================================  ===============

Sources: Qwen2.5-VL's spatial-understanding cookbook (its referring request, answered with
``bbox_2d`` in pixels of the resized input); Qwen3-VL's 2D-grounding cookbook (``bbox_2d``
relative to 1000; its own examples ask for categories, "Locate every instance that belongs
to the following categories: ...": our choice is the cookbook's single-object request
above, since a HalluSegBench query asks for one object and the scoring reads the first box);
InternVL's RefCOCO evaluation script (``eval/refcoco/evaluate_grounding.py``); PaliGemma's
prompt syntax page ("detect {object}"); LLaVA-1.5's referring instruction data
(``llava_v1_5_mix665k``), whose fractions (``relative_1``) the LLaVA repository's issues
606 / 822 report as relative to the image padded to a square for Visual Genome and unclear
for RefCOCO (on a non-square image the padded reading differs, and no frame here models it):
it is therefore a named format only, not the ``llava`` default. Qwen2-VL's technical report marks a referred phrase with
``<|object_ref_start|>`` / ``<|object_ref_end|>`` and answers ``(x0,y0),(x1,y1)`` relative
to 1000; the sentence around the phrase is our choice, the RefCOCO one InternVL and Qwen-VL
evaluate with. GLM-4.1V / 4.5V answer in relative_1000 too, but we found no documented
request wording for them, so they keep the toolkit's prompt (pass ``--grounding_format``).

A reasoning query (HalluSegBench's reasoning split in user data) carries a whole question
rather than an expression; the ``question`` template words it (the question, then the
family's request for the box: our choice, as no family documents one).

:data:`MODEL_TYPE_FORMATS` is the per-family default (data, keyed by ``config.model_type``);
a family not listed, the ``llava`` one included (our own organism is a ``llava`` model
trained on the toolkit's wording), gets ``toolkit``. ``vlm-eval`` / ``vlm-report``
``--grounding_format`` and ``HFModel(grounding_format=...)`` override it. The frame boxes
are read in is the checkpoint's (:data:`evaluators.box_frames.MODEL_TYPE_FRAMES`) where its
family is listed, whatever wording asks it; a format's frame applies to a family that is
not (a llava checkpoint asked in ``qwen3_vl``'s wording), and ``--box_frame`` overrides both.

A box answer is long: a family's JSON answer takes 30-60 new tokens (Qwen tokenizers write
each digit as its own token). ``answer_tokens`` says how many a format needs, and the model
under test generates its grounding queries' answers with at least that many, apart from the
rest, which keep ``max_new_tokens`` (``vlm-eval``'s default of 8 would cut every box off).

The runner fingerprints each query as the model is asked it, so a folder resumes only under
the wording its boxes were asked in, and ``samples.jsonl`` keeps that wording
(``asked_prompt``) where it is not the query's own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

#: the keys of :attr:`evaluators.query.Query.grounding`: what a grounding query asks for
GROUNDING_KEYS = ("expression", "question")


@dataclass(frozen=True)
class GroundingFormat:
    """``referring``: the request for a box, with ``{expression}`` (None: the query's own
    prompt); ``question``: the same for a whole question, with ``{question}``; ``frame``: the
    box frame its answers are written in (:mod:`evaluators.box_frames`; None: the model
    family's); ``answer_tokens``: new tokens a box answer in this form needs;
    ``empty_abstains``: an empty answer is this form's "nothing found" (PaliGemma's detect
    answers no box at all), scored as an abstention rather than as unreadable."""

    name: str
    referring: str | None
    question: str | None
    frame: str | None = None
    answer_tokens: int = 0
    empty_abstains: bool = False

    def words(self, grounding: Mapping[str, str] | None, prompt: str) -> str:
        """The prompt a grounding query is asked with: ``prompt`` (the query's own) for a
        query that asks for no box or a format with no wording of its own."""
        if not grounding or self.referring is None:
            return prompt
        if "question" in grounding:
            return self.question.format(question=grounding["question"])
        return self.referring.format(expression=grounding["expression"])


GROUNDING_FORMATS: dict[str, GroundingFormat] = {}


def register_grounding_format(fmt: GroundingFormat, overwrite: bool = False) -> GroundingFormat:
    """Add ``fmt`` to :data:`GROUNDING_FORMATS`; a ``ValueError`` for a taken name (unless
    ``overwrite``), an unknown frame, or templates without their field."""
    from .box_frames import get_box_frame

    if fmt.name in GROUNDING_FORMATS and not overwrite:
        raise ValueError(f"grounding format {fmt.name!r} is already registered (overwrite=True replaces it)")
    if fmt.frame is not None:
        get_box_frame(fmt.frame)
    if (fmt.referring is None) != (fmt.question is None):
        raise ValueError(f"grounding format {fmt.name!r}: give both templates or neither")
    if fmt.referring is not None and ("{expression}" not in fmt.referring or "{question}" not in fmt.question):
        raise ValueError(f"grounding format {fmt.name!r}: referring needs {{expression}}, question needs {{question}}")
    if fmt.answer_tokens < 0:
        raise ValueError(f"grounding format {fmt.name!r}: answer_tokens must be >= 0, got {fmt.answer_tokens}")
    GROUNDING_FORMATS[fmt.name] = fmt
    return fmt


_REFCOCO = "Please provide the bounding box coordinate of the region this sentence describes: "
_QWEN_JSON = "output its bbox coordinates using JSON format."
for _fmt in (
    GroundingFormat("toolkit", None, None),
    GroundingFormat("qwen2_vl", "Please provide the bounding box coordinates of the region this sentence describes: "
                                "<|object_ref_start|>{expression}<|object_ref_end|>",
                    "{question} Please provide the bounding box coordinates of the region it asks for.",
                    "relative_1000", 40),
    GroundingFormat("qwen2_5_vl", "Locate the {expression}, " + _QWEN_JSON,
                    "{question} Locate it, and " + _QWEN_JSON, "pixels", 64),
    GroundingFormat("qwen3_vl", "Locate the {expression}, " + _QWEN_JSON,
                    "{question} Locate it, and " + _QWEN_JSON, "relative_1000", 64),
    GroundingFormat("internvl", _REFCOCO + "<ref>{expression}</ref>", _REFCOCO + "<ref>{question}</ref>",
                    "relative_1000", 40),
    # PaliGemma's "detect" answers each object found as four <loc> tokens and its name,
    # ";"-separated (big_vision's README), so nothing found is an empty answer: our reading,
    # not checked against a checkpoint here
    GroundingFormat("paligemma", "detect {expression}", "detect {question}", None, 8, empty_abstains=True),
    GroundingFormat("llava_1_5", _REFCOCO + "{expression}", _REFCOCO + "{question}", "relative_1", 32),
):
    register_grounding_format(_fmt)

DEFAULT_FORMAT = "toolkit"

#: ``config.model_type`` -> the grounding format its checkpoints were trained with (the
#: module docstring gives each source); a family not listed gets :data:`DEFAULT_FORMAT`.
MODEL_TYPE_FORMATS: dict[str, str] = {
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl",
    "qwen3_5": "qwen3_vl",
    "qwen3_5_moe": "qwen3_vl",
    "internvl": "internvl",
    "paligemma": "paligemma",
}


def get_grounding_format(name: str) -> GroundingFormat:
    """The registered format ``name``; a ``ValueError`` naming the known ones otherwise."""
    if name not in GROUNDING_FORMATS:
        from hooks.errors import unknown

        raise ValueError(unknown("grounding_format", name, GROUNDING_FORMATS))
    return GROUNDING_FORMATS[name]


def default_grounding_format(model) -> str:
    """The format ``model`` (a transformers model) was trained to ground in, by its ``config.model_type``."""
    from .box_frames import model_type_of

    return MODEL_TYPE_FORMATS.get(model_type_of(model), DEFAULT_FORMAT)


def check_grounding(grounding: Mapping[str, str] | None) -> None:
    """A query's ``grounding``: None, or exactly one of :data:`GROUNDING_KEYS` with a non-empty text."""
    if grounding is None:
        return
    if len(grounding) != 1 or next(iter(grounding)) not in GROUNDING_KEYS:
        raise ValueError(f"grounding must hold exactly one of {GROUNDING_KEYS}, got {dict(grounding)!r}")
    (text,) = grounding.values()
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"grounding: the text asked for must be a non-empty string, got {text!r}")


def worded(query, fmt: GroundingFormat):
    """``query`` with the prompt ``fmt`` asks its box with (the query itself when nothing changes)."""
    prompt = fmt.words(query.grounding, query.prompt)
    return query if prompt == query.prompt else dataclasses.replace(query, prompt=prompt)


__all__ = ["DEFAULT_FORMAT", "GROUNDING_FORMATS", "GROUNDING_KEYS", "GroundingFormat", "MODEL_TYPE_FORMATS",
           "check_grounding", "default_grounding_format", "get_grounding_format", "register_grounding_format",
           "worded"]
