"""What crop-and-verify may do with an answer, by its kind.

A view (Crop, Cluster) is a part of the image, so it is evidence of what is there, never of
what is not. :func:`answer_kind` sorts a first answer into the kinds the combine policy of
:class:`mitigate.CropVerify` treats differently (see its module docstring): a yes/no, a
count, a short attribute, a box (or a grounding abstention), or free text -- the last two
are never replaced by a view's answer, so they are not re-asked
(:meth:`mitigate.CropVerify.gate_rows`).
"""

from __future__ import annotations

import re

from evaluators.answers import count_value, existence_subject, is_hedge, parse_box, parse_number, parse_yes_no, words

#: Answers of at most this many words (and neither yes/no, a number nor a box) are
#: ``short`` -- an attribute ("yellow", "dark red") -- longer ones ``free_form``. Our choice:
#: an attribute rarely takes more than a few words, a caption or a sentence does.
SHORT_ANSWER_WORDS = 3


_HOW_MANY = re.compile(r"\bhow\s+many\b", re.I)


def answer_kind(text: str, question: str | None = None) -> str:
    """``"yes_no"``, ``"box"``, ``"count"``, ``"short"`` or ``"free_form"``: what the
    combine policy may do with an answer (module docstring). With the ``question``, a
    "how many" question's short answer is a count whatever its words ("no" is 0);
    without it the answer alone decides. A grounding abstention ("none") is a box answer.
    An answer longer than :data:`SHORT_ANSWER_WORDS` words is free text unless it is a
    yes/no -- "There are 3 dogs on the grass." is a sentence a view must not replace."""
    short = len(words(text)) <= SHORT_ANSWER_WORDS
    if question is not None and _HOW_MANY.search(question):
        return "count" if short and count_value(text) is not None else "free_form"
    # read as the evaluators read it (on an existence question "There is a cup." is a yes);
    # a hedge ("not sure") is an undecided yes/no
    if parse_yes_no(text, existence_subject(question)) is not None or is_hedge(text):
        return "yes_no"
    if isinstance(parse_box(text, 1.0), tuple) or words(text)[:1] == ["none"]:
        return "box"
    if not short:
        return "free_form"
    return "count" if parse_number(text) is not None else "short"
