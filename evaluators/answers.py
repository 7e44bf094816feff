"""Robust answer extraction from generated text.

Conventions follow VLMEvalKit (DESIGN.md §4): yes/no after stripping punctuation, "yes"
without "no" (and vice versa); one option letter, else the option text; numbers as
digits or words; boxes from coordinate tokens or JSON. Every parser returns ``None`` when
the answer cannot be read, so callers can count it as wrong *and* report an invalid rate.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Sequence

from .box_frames import DEFAULT_FRAME, get_box_frame

_WORD = re.compile(r"[a-z0-9]+")
NUMBER_WORDS = {
    "zero": 0, "none": 0, "no": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
}
#: Tens, which a unit word may follow ("twenty-one", "twenty one": 21); dense-counting
#: answers reach them, and "twenty-one" had been read as its last word, 1.
TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
#: Digits grouped by thousands ("1,500", "12,000"): one number, not 1 and 500.
_GROUPED = re.compile(r"(?<![\d,])\d{1,3}(?:,\d{3})+(?![\d,])")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


#: Hedges: an answer that says only one of these says neither yes nor no ("Not sure." had
#: been read as "no", right on every absent-object question; an audit, session 38).
_HEDGE = re.compile(r"\b(?:not (?:sure|certain)|no idea|unsure|uncertain|unclear|not clear|"
                    r"(?:do|does|did|can|could) not (?:know|tell|say|determine)|cannot (?:tell|say|determine)|"
                    r"(?:hard|impossible|difficult) to (?:tell|say|determine))\b")
#: Denials of existence without the word "no" ("There isn't a dog.", "I don't see a dog."):
#: read as no. Not every "not" (VLMEvalKit reads neither; "the dog is not on the table"
#: says there is one), only these constructions.
_DENIAL = re.compile(r"\bthere (?:is|are|s|was|were) not\b|"
                     r"\b(?:do|does|did|can|could) not (?:see|find|spot|notice|detect|observe|contain|show|"
                     r"include|have|appear)\b|\bcannot (?:see|find|spot|notice|detect|observe)\b|"
                     r"\bnot (?:present|visible|pictured|shown|in the (?:image|picture|photo))\b")


def is_hedge(text: str) -> bool:
    """Does ``text`` hedge ("not sure", "no idea", "I can't tell": :data:`_HEDGE`)? Such an
    answer to a yes/no question reads as neither (:func:`parse_yes_no`), but it is still a
    yes/no answer, not an attribute (:func:`mitigate.answer_kinds.answer_kind`)."""
    return bool(_HEDGE.search(" ".join(words(_expand_negations(text)))))


#: The question's own "yes or no" echoed ("Yes/No", "yes or no?", "yes and no"): it answers
#: nothing, and read by its first word it had been a "yes" (an audit, session 39).
_ECHO = re.compile(r"\byes\s*(?:/|\bor\b|\band\b)\s*no\b|\bno\s*(?:/|\bor\b|\band\b)\s*yes\b", re.I)
#: Idioms whose "no" denies nothing ("no doubt there is a cup").
_NOT_A_DENIAL = re.compile(r"\b(?:no doubt|without a doubt|no question)\b")
#: Colloquial and one-word answers: "Yep." / "Nope." / "Absent."
_YES_WORDS, _NO_WORDS = {"yes", "yeah", "yep", "yup"}, {"no", "nope", "nah"}
_ALONE = {"present": True, "visible": True, "absent": False}


def _about(plain: str, subject: str) -> bool | None:
    """What ``plain`` (lowered words) states of ``subject`` alone: True where it says the
    object is there ("there is a small cup in the image", "i can see two cups", "the cup is
    visible") and never denies it, False where it denies it ("no cup", "there isn't a cup",
    "i don't see any cup") and never says it is there, else None."""
    name = r"\s+".join(map(re.escape, words(subject)))
    if not name:
        return None
    name = rf"(?:{name})(?:s|es)?"
    lead = r"(?:\s+(?!no\b|not\b|any\b)\w+){0,3}?\s+"  # up to three words, none a negation
    there = bool(re.search(rf"\bthere (?:is|are|s)\b{lead}{name}\b", plain)
                 or re.search(rf"\bi (?:can )?(?:see|spot|notice)\b{lead}{name}\b", plain)
                 or re.search(rf"\b{name} (?:is|are) (?:present|visible|there|in the (?:image|picture|photo))\b", plain))
    denied = bool(re.search(rf"\b(?:no|not|without|nor|neither)\b(?:\s+\w+){{0,2}}?\s+{name}\b", plain)
                  or re.search(rf"\b{name} (?:is|are) not\b", plain))
    return True if there and not denied else False if denied and not there else None


def _plain(text: str) -> str:
    """``text`` as the yes/no rules read it: lowered words, negations spelled out, an echoed
    "yes or no", hedges and "no doubt"-style phrases removed."""
    plain = " ".join(words(_ECHO.sub(" ", _expand_negations(text))))
    return _NOT_A_DENIAL.sub(" ", _HEDGE.sub(" ", plain))


def parse_yes_no(text: str, subject: str | None = None) -> bool | None:
    """True for yes, False for no, None if neither appears, or both and the first word is
    neither ("there is a cup, yes, and no plate").

    VLMEvalKit's rule ("yes" without "no" and vice versa, DESIGN.md §4), with "not" as the
    first word and the denials of :data:`_DENIAL` ("there isn't", "I don't see") read as
    no, and the hedges of :data:`_HEDGE` ("not sure", "no idea", "can't tell") read as
    neither: they are removed before the rest is read, as are an echoed "yes or no" /
    "yes/no" / "yes and no" (:data:`_ECHO`) and "no doubt". "Yep" / "yeah" read as yes,
    "nope" / "nah" as no; a one-word "present" / "visible" as yes, "absent" as no, and
    "none" as no to an existence question (``subject``).
    Both a yes and a no: the first word decides when it is one ("yes, though there is no
    plate"), else None.

    ``subject``: the object an existence question asks about. An answer that does not open
    with yes or no is read for what it says of that object (:func:`_about`): "There is a
    small cup in the image." is yes, the counterpart of the denials (an audit, session 39:
    it was unreadable, a false denial on every present object), and "There is a cup next to
    the plate, but no spoon." is yes for the cup (it was no) and no for the spoon. Only the
    object asked about: "There is a cat." says nothing about a dog."""
    plain = _plain(text)
    w = plain.split()
    if len(w) == 1 and w[0] in _ALONE:
        return _ALONE[w[0]]
    if w == ["none"] and subject is not None:  # to "is there a cup ?"; elsewhere an abstention
        return False  # ("where is the dog ?" -> "none": a box answer) or a count
    if subject is not None and w and w[0] not in _YES_WORDS | _NO_WORDS | {"not"}:
        # an answer that does not open with yes or no, about the asked object: what it says
        # of that object ("there is a cup next to the plate, but no spoon" is yes for the cup)
        said = _about(plain, subject)
        if said is not None:
            return said
    yes = bool(_YES_WORDS & set(w))
    no = bool(_NO_WORDS & set(w)) or "not" in w[:1] or bool(_DENIAL.search(plain))
    if yes and not no:
        return True
    if no and not yes:
        return False
    if yes and no:  # "yes, there is no ..." is ambiguous; the first word decides when it is yes/no
        return True if w[0] in _YES_WORDS else False if w[0] in _NO_WORDS else None
    return None


#: An existence question ("is there a traffic light in the image ?"): its object, the last
#: one asked where a prompt's belief sentence names it first.
_EXISTENCE = re.compile(r"\b(?:is|are) there\s+(?:(?:an?|any|some)\s+)?([a-z][a-z ]*?)\s*(?:\bin\b|\bon\b|\bat\b|"
                        r"\bvisible\b|\bpresent\b|[?.,]|$)", re.I)


def existence_subject(prompt: str | None) -> str | None:
    """The object an existence question asks about (:data:`_EXISTENCE`), or None for any
    other yes/no question ("is the tree green ?") or no question, where an answer stating
    the object is there says nothing (:func:`parse_yes_no`'s ``subject``)."""
    if prompt is None:
        return None
    found = None
    for found in _EXISTENCE.finditer(prompt):
        pass
    return found.group(1).strip() if found and found.group(1).strip() else None


#: A closing answer: "the answer is ...", "final answer: ...". Not the bare word ("to answer
#: this", "this answer assumes", "please answer yes or no" echoed from the prompt).
_ANSWER_IS = re.compile(r"\banswer\s*(?:is\b|:)", re.I)


def answer_tail(text: str) -> str | None:
    """The first sentence after the last "answer is" / "answer:" in ``text`` ("... one fork
    on the left . final answer : 9 ." gives " 9 "), or None when there is none or it has no
    words. Chain-of-thought answers (ReactBench's cot mode asks for "the final answer")
    mention other numbers, colours and options on the way; the parse reads this part first
    and the whole text when this part says nothing it can read ("my answer is based on ...")."""
    last = None
    for last in _ANSWER_IS.finditer(text):
        pass
    if last is None:
        return None
    tail = re.split(r"[.;!?\n]", text[last.end():].lstrip(" \t:"), maxsplit=1)[0]
    return tail if words(tail) else None


def final_sentence(text: str) -> str | None:
    """The last sentence of ``text`` that has words, or None when ``text`` has one sentence
    or none (then it is the whole text)."""
    parts = [p for p in re.split(r"(?<=[.!?])\s+|\n+", text.strip()) if words(p)]
    return parts[-1] if len(parts) > 1 else None


#: the reasoning block of a "thinking" VLM: ``<think> ... </think>`` (Qwen3-VL-Thinking,
#: GLM-4.1V-Thinking, InternVL3.5's thinking mode) or ``◁think▷ ... ◁/think▷`` (Kimi-VL-Thinking)
_THINK_END = re.compile(r"</think>|◁/think▷", re.I)
_THINK_START = re.compile(r"<think>|◁think▷", re.I)
#: GLM-4.1V-Thinking puts its answer after the reasoning in ``<answer> ... </answer>``
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.I | re.S)


def after_reasoning(text: str) -> str | None:
    """What a reasoning model answered: the text after its last closing think tag, or inside
    its last ``<answer>`` block where it writes one; None when a think block opened and never
    closed -- the token limit cut the reasoning off, so no answer was given (read as
    unreadable, not from the reasoning, which weighs yes and no on its way). Text without
    these tags comes back as it is. (A chat template that opens the block in the prompt
    leaves only the closing tag in the answer: read after it the same way.)"""
    ends = list(_THINK_END.finditer(text))
    if ends:
        text = text[ends[-1].end():]
    elif _THINK_START.search(text):
        return None
    blocks = _ANSWER_BLOCK.findall(text)
    return blocks[-1] if blocks else text


def tail_first(text: str, read: Callable[[str], Any], *, yes_no: bool = False, final: bool = False) -> Any:
    """``read`` applied to the closing "answer is ..." part of ``text`` (:func:`answer_tail`)
    when that part reads (not None, not []), else to the whole text. With ``yes_no`` the part
    must start with "yes" or "no" ("the answer is not obvious, but there is a cat" states
    neither). With ``final``, the last sentence (:func:`final_sentence`) is read next, before
    the whole text: a chain-of-thought prompt asks for the final answer in a sentence of its
    own (ReactBench App. B.4: "explicitly stating the final answer in a standalone sentence"), and the
    reasoning before it names other counts ("in 2 rows ... in total there are 9") and says
    yes and no on the way. A reasoning model's think block is never read
    (:func:`after_reasoning`; one cut off before its end reads as nothing). One rule for the
    evaluators' grading and the mitigations' reading of an answer."""
    answered = after_reasoning(text)
    if answered is None:
        return read("")
    text = answered
    tail = answer_tail(text)
    if tail is not None and yes_no and words(tail)[0] not in ("yes", "no"):
        tail = None
    for part in (tail, final_sentence(text) if final else None):
        value = read(part) if part is not None else None
        if value not in (None, []):
            return value
    return read(text)


#: Option letters in order: MIOH's image sets reach ten images (its NI condition), and a
#: user's selective question may list each of them plus "none of the above", so five
#: letters (a-e) are not enough (the built-in suite lists four images of an 8- or 10-image
#: set, :mod:`evaluators.benchmarks.mioh.suite`).
OPTION_LETTERS = "abcdefghijklmnopqrstuvwxyz"


#: Markdown around an answer ("**B**", "`b`", "_image 2_"): read as the plain text.
_DECORATION = re.compile(r"[*_`]+")
#: Answers that say "in none of them" without the option's words: "None.", "None of them",
#: "Neither", "No image contains a cup", "In none of the images".
_SAYS_NONE = re.compile(r"^(?:none\b|neither\b|no\s+images?\b|in\s+none\b|not\s+in\s+any\b)")


def parse_option(text: str, options: Sequence[str], letters: Sequence[str] = OPTION_LETTERS) -> str | None:
    """The chosen option letter: a lone letter token ("b", "b)", "(B)", "[B]", "**B**"), an
    "option B" lead or a closing "the answer is (option) B" / "the correct option is B" /
    "... is B", else a unique option text. An answer that names no option and says "none"
    ("None.", "Neither", "No image contains a cup") is the option that starts with "none"
    ("none of the above"), when exactly one does; one that starts with "no" is the one
    option starting with "no" ("No, in none of them"), when there is exactly one.

    The papers give no parsing rule (MIOH Sec. 5: temperature 0, nothing on reading the
    options); these are the forms VLMEvalKit's option matching also accepts (DESIGN.md §4),
    kept strict: a letter that could be an article or a pronoun (a, i) is read only where
    it stands alone or in brackets, and an answer naming two options is unreadable."""
    if len(options) > len(letters):
        raise ValueError(f"options: {len(options)} options but only {len(letters)} letters to name them")
    lowered = _DECORATION.sub("", text).lower().strip()
    valid = [l.lower() for l in letters[: len(options)]]
    # a letter leads the answer ("b", "b)", "(b) a fork", "[b]", "b. a fork", "b\n<reasons>",
    # "b the fork", "option b: image 2"; but "a fork" starts with an article and "i think"
    # with a pronoun, not the letters a and i), or closes it ("the answer is (b).", "answer:
    # b", "the correct option is b.", "i think it's b")
    letter = (re.match(r"^[(\[]([a-z])[)\]]", lowered)
              or re.match(r"^([a-z])(?:[.):,]|\s*$|[ \t]*\n|\s*[-\u2013\u2014])", lowered)
              or re.match(r"^([b-hj-z])\s", lowered)
              or re.match(r"^(?:option|choice)\s*[(\[]?([a-z])(?![a-z])", lowered)
              or re.search(r"\b(?:answer|option|choice)(?:\s+is)?\s*:?\s*[(\[]?([a-z])[)\]]?\s*[.!]?\s*$", lowered)
              or re.search(r"\b(?:is|it['\u2019]?s)\s+(?:[(\[]([a-z])[)\]]|([b-hj-z]))\s*[.!]?\s*$", lowered))
    chosen = letter and next(g for g in letter.groups() if g)
    if chosen in valid:
        return chosen
    # whole words only: "image 1" is not said by "image 10"; and not where it is denied
    # ("there is not a fork" does not choose "a fork": an audit, session 39)
    hits = [valid[i] for i, opt in enumerate(options) if opt and _said(opt, lowered)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        return None
    if any(opt and _mention(opt).search(lowered) for opt in options):
        return None  # options named only to deny them ("neither image 1 nor image 2"): no choice
    # a count inside exactly one option's range ("9" for "eight to nine"): that option
    ranges = [parse_count(opt) if opt else None for opt in options]
    stated = parse_count(lowered)
    if isinstance(stated, int) and ranges and all(isinstance(r, tuple) for r in ranges):
        inside = [valid[i] for i, (lo, hi) in enumerate(ranges) if lo <= stated <= hi]
        if len(inside) == 1:
            return inside[0]
    first = words(lowered)[:1]
    starts = [valid[i] for i, opt in enumerate(options) if opt and words(opt)[:1] == ["none"]]
    if _SAYS_NONE.match(lowered) and len(starts) == 1:
        return starts[0]
    starts = [valid[i] for i, opt in enumerate(options) if opt and words(opt)[:1] == ["no"]]
    return starts[0] if first == ["no"] and len(starts) == 1 else None


def _mention(option: str) -> re.Pattern:
    """An option's text as whole words ("image 1" is not said by "image 10")."""
    return re.compile(rf"(?<!\w){re.escape(option.lower())}(?!\w)")


def _said(option: str, lowered: str) -> bool:
    """Does ``lowered`` name the option text ``option`` (whole words) somewhere it does not
    deny it (a negation among the two words before it in the same clause, as
    :func:`_affirmed` reads; a negation the option itself holds, "no, in none of them", is
    its own)?"""
    negations = NEGATIONS - set(words(option))
    text = _expand_negations(lowered)
    for found in _mention(option).finditer(text):
        before = re.split(r"[.,;:!?]", text[: found.start()])[-1]
        if not negations & set(words(before)[-2:]):
            return True
    return False


#: Idioms in which "one" counts nothing ("counting them one by one, there are 9"): an audit,
#: session 39, found the count read as 1.
_NOT_A_COUNT = re.compile(r"\bone (?:by one|at a time|another|after another)\b", re.I)


def _count_words(text: str) -> list[str]:
    """:func:`words`, with digit groups joined ("1,500" -> "1500") and a tens word joined
    to the unit word after it ("twenty-one", "twenty one" -> "21")."""
    w = words(_GROUPED.sub(lambda m: m.group(0).replace(",", ""), _NOT_A_COUNT.sub(" ", text)))
    out: list[str] = []
    for token in w:
        unit = NUMBER_WORDS.get(token)
        if out and out[-1] in TENS and unit is not None and 1 <= unit <= 9 and token != "no":
            out[-1] = str(TENS[out[-1]] + unit)
        else:
            out.append(token)
    return [str(TENS[t]) if t in TENS else t for t in out]


def parse_number(text: str) -> int | None:
    """The first number, as digits or words ("three", "3 dogs", "twenty-one", "1,500");
    None if there is none."""
    return next((n for n in map(_number, _count_words(text)) if n is not None), None)


def parse_count(text: str) -> int | tuple[int, int] | None:
    """A count, or a range when the answer states one ("between 3 and 5", "3 to 5",
    "3-5", "from three to five"): the first number, and the number after it when joined by
    "to" / "-" or, after "between", by "and". None if there is no number."""
    w = _count_words(text)
    for i, token in enumerate(w):
        first = _number(token)
        if first is None:
            continue
        joined = len(w) > i + 2 and (w[i + 1] == "to" or (w[i + 1] == "and" and i > 0 and w[i - 1] == "between"))
        second = _number(w[i + 2]) if joined else None
        if second is None and "-" in text:  # "3-5": the hyphen is not a word
            m = re.search(rf"\b{re.escape(token)}\s*-\s*([a-z0-9]+)", text.lower())
            second = _number(m.group(1)) if m else None
        return (first, second) if second is not None and first <= second else first
    return None


def count_value(text: str) -> int | None:
    """The count an answer gives: its number, or 0 when it denies ("no", "none", "there
    are no dogs"); None if it gives neither."""
    n = parse_number(text)
    if n is None and (parse_yes_no(text) is False or words(text)[:1] == ["none"]):
        return 0
    return n


def _number(token: str) -> int | None:
    if token.isdigit():
        return int(token)
    return NUMBER_WORDS[token] if token in NUMBER_WORDS and token != "no" else None


#: Words that negate the keyword right after them, or one word later ("no fork", "not a
#: fork"): a short answer that names the ground truth only to deny it is not right.
NEGATIONS = frozenset({"no", "not", "without", "never", "nothing", "none", "neither", "nor"})


_CONTRACTED = re.compile(r"(?:\b(ca|wo))?n[\'\u2019]t\b", re.I)


def _expand_negations(text: str) -> str:
    """"wasn't" / "can't" / "won't" as "was not" / "can not" / "will not", so the negation
    is a word (the tokenizer would split "wasn't" into "wasn" and "t")."""
    return _CONTRACTED.sub(lambda m: {"ca": "can", "wo": "will"}.get((m.group(1) or "").lower(), "") + " not", text)


#: Prepositions that make what follows a place ("on the left", "in the lower right", "next
#: to the knife", "from the left"): a word there says where, not what.
LOCATIVES = frozenset({"on", "in", "at", "near", "beside", "behind", "above", "below", "under", "next", "from",
                       "across", "inside", "within", "around"})


def _affirmed(text: str, wanted: Sequence[str], *, places: bool = True):
    """The members of ``wanted`` that ``text`` says, in order, each occurrence unless one of
    the two words before it, in the same clause (punctuation ends one: "No. A fork." says
    fork), is a negation (:data:`NEGATIONS`, "n't" included) that is not itself wanted ("no
    entry sign"). With ``places=False`` an occurrence with a preposition of place among the
    three words before it (:data:`LOCATIVES`, "in the lower right") is not said either."""
    wanted = set(wanted)
    negations = NEGATIONS - wanted
    for clause in re.split(r"[.,;:!?]", _expand_negations(text)):
        w = words(clause)
        yield from (t for i, t in enumerate(w) if t in wanted and not negations & set(w[max(0, i - 2) : i])
                    and (places or not LOCATIVES & set(w[max(0, i - 3) : i])))


def keywords_found(text: str, keywords: Sequence[str], *, places: bool = True) -> set[str]:
    """The members of ``keywords`` that ``text`` says and does not deny (:func:`_affirmed`);
    with ``places=False``, not where they only say a place ("on the left")."""
    return set(_affirmed(text, keywords, places=places))


def parse_choice(text: str, choices: Sequence[str], asked: Sequence[str] = ()) -> str | None:
    """The member of ``choices`` (e.g. colour names) said first in ``text`` and not denied
    ("it is not green ; it is red" is red: :func:`_affirmed`). Members the question itself
    names (``asked``: its words) come last: "what colour is the green tree ?" answered "the
    green tree is white" is white, the premise repeated is not the answer (an audit,
    session 39: it read green); "it is green" is still green."""
    said = list(_affirmed(text, choices))
    asked = set(asked)
    return next((c for c in said if c not in asked), said[0] if said else None)


#: PaliGemma's location tokens: 1024 bins, ``y0 x0 y1 x1`` (big_vision's PaliGemma README)
LOC_BINS = 1024
_LOC = re.compile(r"<loc(\d{4})>")
#: Qwen2-VL's text form of a box, ``(x0,y0),(x1,y1)`` (its box tokens decoded away)
_PAIRS = re.compile(r"\(\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*\)\s*,?\s*\(\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*\)")


def parse_box(
    text: str, size: float, bins: int = 16, *, height: float | None = None, frame: str = DEFAULT_FRAME,
    subject: str | Sequence[str] | None = None,
) -> tuple[float, float, float, float] | str | None:
    """A box in pixels of an image ``size`` wide (and ``height`` high, default ``size``) from:

    * coordinate tokens ``<c3> <c5> <c9> <c12>`` (``bins`` bins per side, inclusive end);
    * PaliGemma's location tokens ``<loc0256><loc0128><loc0768><loc0512>`` (1024 bins,
      ``y0 x0 y1 x1``);
    * a list ``[x0, y0, x1, y1]`` (JSON, also nested or under a key such as Qwen's
      ``bbox_2d``: the first innermost list of four numbers) or Qwen2-VL's ``(x0,y0),(x1,y1)``,
      in ``frame`` (:mod:`evaluators.box_frames`: ``pixels`` of the image by default,
      ``relative_1000`` for Qwen2-VL / Qwen3-VL / InternVL / GLM-4.xV, ``relative_1``).

    ``"none"`` for an abstention: ``none`` / ``no``, an empty JSON list, or -- given the asked
    object as ``subject`` -- a sentence that draws no box and denies that object ("There is no
    dog in the image"); None if unreadable. Corners out of order (a token
    ``x1 < x0``, a written ``x1 <= x0``), a bin past the grid (``<c16>`` of 16 bins) or a
    non-finite value is not a box: None. The token forms say their own frame, so ``frame``
    applies to written numbers only."""
    box_frame = get_box_frame(frame)  # an unknown frame is an error before any answer is read
    height = size if height is None else height
    tokens = [int(b) for b in re.findall(r"<c(\d+)>", text)]
    if len(tokens) >= 4:
        x0, y0, x1, y1 = tokens[:4]
        if max(x0, y0, x1, y1) >= bins or x1 < x0 or y1 < y0:
            return None
        sx, sy = size / bins, height / bins
        return (x0 * sx, y0 * sy, (x1 + 1) * sx, (y1 + 1) * sy)
    locs = [int(v) for v in _LOC.findall(text)]
    if len(locs) >= 4:
        y0, x0, y1, x1 = locs[:4]
        if max(locs[:4]) >= LOC_BINS or x1 <= x0 or y1 <= y0:
            return None
        return (x0 * size / LOC_BINS, y0 * height / LOC_BINS, x1 * size / LOC_BINS, y1 * height / LOC_BINS)
    vals = _written_box(text)
    if vals is not None:
        if not all(math.isfinite(v) for v in vals) or vals[2] <= vals[0] or vals[3] <= vals[1]:
            return None
        return box_frame.to_pixels(vals, size, height)
    # an abstention: "none" / "no"; a JSON answer that lists nothing ("[]", the JSON formats'
    # empty detection list); or -- as production VLMs abstain in prose -- an answer with no box
    # that denies the asked ``subject`` and never says it is there ("There is no dog in the
    # image", "I don't see a dog": :func:`denies`). Prose that mentions a "no" about anything
    # else ("The dog has no collar") or affirms the object, and draws no box, stays unreadable
    if words(text)[:1] in (["none"], ["no"]) or _EMPTY_JSON.fullmatch(text.strip()) \
            or (subject and denies(text, subject)):
        return "none"
    return None


#: a JSON answer with nothing in it, fenced or not: ``[]``, ``{}``, ``null``
_EMPTY_JSON = re.compile(r"(?:```(?:json)?\s*)?(?:\[\s*\]|\{\s*\}|null)(?:\s*```)?", re.I)


def denies(text: str, subject: str | Sequence[str]) -> bool:
    """Whether ``text`` denies ``subject`` ("there is no dog", "I don't see any dogs", "the
    image does not contain a dog") and never says it is there (:func:`_about`, the reading
    :func:`parse_yes_no` gives an answer about an asked object). Several subjects (a class
    and the description a reasoning query asks it by, "an animal that barks"): any one
    denied, none said to be there; a leading article is no part of a subject."""
    subjects = [subject] if isinstance(subject, str) else [s for s in subject if s]
    plain = _plain(text)
    said = []
    for name in (re.sub(r"^(?:an?|the|some|any)\s+", "", s.strip().lower()) for s in subjects):
        about = _about(plain, name)
        obj = r"\s+".join(map(re.escape, words(name)))
        if about is None and obj and re.search(rf"{_CANNOT_SEE}(?:\s+\w+){{0,2}}?\s+{obj}(?:s|es)?\b", plain):
            about = False  # "I cannot find a dog": a verb of seeing, then the object
        said.append(about)
    return False in said and True not in said


#: "cannot" denies only before a verb of seeing ("I cannot see the dog clearly" after "there
#: is a dog" is no denial: _about's "there is" decides that first)
_CANNOT_SEE = r"\bcannot (?:see|find|spot|notice|detect|locate|observe)\b"


def _written_box(text: str) -> tuple[float, float, float, float] | None:
    """The first box written as numbers: the first innermost ``[...]`` holding exactly four
    numbers (so ``[[x0, y0, x1, y1]]`` and ``{"point_2d": [x, y], "bbox_2d": [...]}`` read
    their box), else Qwen2-VL's ``(x0,y0),(x1,y1)``."""
    for found in re.finditer(r"\[[^\[\]]+\]", text):
        try:
            vals = [float(v) for v in json.loads(found.group(0))]
        except (ValueError, TypeError):
            continue
        if len(vals) == 4:
            return tuple(vals)  # type: ignore[return-value]
    pairs = _PAIRS.search(text)
    if pairs:
        try:
            return tuple(float(v) for v in pairs.groups())  # type: ignore[return-value]
        except ValueError:
            return None
    return None


def box_iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0
