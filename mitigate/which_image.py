"""Multi-image existence questions, read as one existence question per image, so that
crop-and-verify can check each image on its own views: "in which image is there an X?"
(MIOH's selective question) and "is there an X in any of these images?" (its comprehensive
one, yes / no: :class:`AnyImage`, each image standing for "yes" and "no" for "none of the
above", so one policy serves both).

MIOH (Sec. 3, the selective existence task) asks "In which image is there a banana?" over
2-4 images with options "A) Image 1 ... E) None of the above"; its hard positives are small
or occluded objects, the failure DO-Bench's Crop view recovers for one image. Models also
answer such questions better decomposed, one image at a time (MIOH's NI-decomposed
condition; on the organism 77% against 29%, ``docs/results/prior_full.md``). This module
parses and decides, without a model: :class:`WhichImage` says which option names which
image and which one is "none of the above", and writes the per-image existence question;
:func:`decide` turns the images' "yes" evidence into the answer. The model calls live in
:meth:`mitigate.crop_verify.CropVerify.answer_which_image`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evaluators.answers import OPTION_LETTERS, parse_option, parse_yes_no, tail_first

#: the per-image question; ``{object}`` is the queried object as the question names it.
#: Lower case with spaced punctuation is what the organism was trained on; real models read
#: it as the usual "Is there a banana in the image? Answer yes or no."
EXISTENCE_TEMPLATE = "is there a {object} in the image ? answer yes or no ."

_QUESTION = re.compile(r"\bin\s+which\s+image\s+(?:is|are)\s+there\s+(?:an?\s+|any\s+|the\s+)?(?P<object>[^?]+?)\s*\?",
                       re.I)
_OPTION = re.compile(r"(?:^|\s)\(?(?P<letter>[a-z])\s*\)\s*(?P<text>image\s+(?P<index>\d+)|none\s+of\s+the\s+above)",
                     re.I)


@dataclass(frozen=True)
class WhichImage:
    """A parsed "in which image is there an X?" question."""

    object: str
    letters: dict[int, str]  # image index (0-based) -> its option letter
    none: str | None  # the "none of the above" letter, if there is one
    options: tuple[str, ...]  # the option texts in letter order (for parse_option)

    def choice(self, answer: str) -> str | None:
        """The option letter an answer picks (a lone letter, or a unique option text), read
        as the evaluators grade it: a closing "the answer is ..." first."""
        return tail_first(answer, lambda part: parse_option(part, self.options))

    def answer_with(self, letter: str) -> str:
        """The answer choosing option ``letter``: the letter and its option text, "b) image 2"."""
        return f"{letter}) {self.options[OPTION_LETTERS.index(letter)]}"

    def answer_for(self, image: int) -> str:
        """The answer naming ``image`` (0-based)."""
        return self.answer_with(self.letters[image])

    def answer_for_none(self) -> str:
        """The answer choosing "none of the above"."""
        if self.none is None:
            raise ValueError("this question offers no 'none of the above' option")
        return self.answer_with(self.none)

    def image_of(self, letter: str | None) -> int | None:
        """The image an option letter names (None for "none of the above" or unknown)."""
        return next((i for i, l in self.letters.items() if l == letter), None)

    def question(self, template: str = EXISTENCE_TEMPLATE) -> str:
        return template.format(object=self.object)


def parse_which_image(prompt: str, n_images: int) -> WhichImage | None:
    """The question's object and options, or None when ``prompt`` is not an "in which image
    is there ..." question whose options name each of the ``n_images`` images at most once
    and offer "none of the above" at most once (options naming images beyond ``n_images``
    are not this question either; two "none" letters would make a "none" answer's letter
    and the one :meth:`WhichImage.answer_for_none` writes disagree)."""
    if n_images < 1:
        raise ValueError(f"n_images must be >= 1, got {n_images}")
    found = _QUESTION.search(prompt)
    if not found:
        return None
    options = list(_OPTION.finditer(prompt[found.end():]))
    letters, none, texts = {}, None, {}
    for m in options:
        letter = m.group("letter").lower()
        texts[letter] = m.group("text").lower()
        if m.group("index") is None:
            if none is not None:  # "none of the above" twice: which letter is it?
                return None
            none = letter
            continue
        index = int(m.group("index")) - 1
        if not 0 <= index < n_images or index in letters:
            return None
        letters[index] = letter
    order = OPTION_LETTERS[: len(texts)]
    if not letters or sorted(texts) != list(order):  # options must be a, b, c ... in order
        return None
    return WhichImage(found.group("object").strip(), letters, none, tuple(texts[l] for l in order))


_ANY_IMAGE = re.compile(r"\bis\s+there\s+(?:an?\s+|any\s+|at\s+least\s+one\s+)?(?P<object>[^?]+?)\s+in\s+"
                        r"(?:any\s+of\s+)?(?:the|these|those)\s+images\s*\?", re.I)


@dataclass(frozen=True)
class AnyImage:
    """A parsed "is there an X in any of these images?" question (MIOH's comprehensive
    existence question, Sec. 5.5), with the interface of :class:`WhichImage`: every image
    stands for the answer "yes", and "no" is the "none of the above" of this question."""

    object: str
    letters: dict[int, str]  # image index -> "yes"
    none: str = "no"

    def choice(self, answer: str) -> str | None:
        """"yes" / "no" as the answer reads (a closing "the answer is ..." first, as the
        evaluators grade it), None when it is neither."""
        value = tail_first(answer, parse_yes_no, yes_no=True)
        return None if value is None else "yes" if value else "no"

    def answer_with(self, letter: str) -> str:
        return letter

    def question(self, template: str = EXISTENCE_TEMPLATE) -> str:
        return template.format(object=self.object)


#: objects that make the question something else: "is there no X ...", "is there a
#: difference between ...", "is there the same X ..." (MIOH's comparative questions)
_NOT_AN_OBJECT = re.compile(r"^(?:no|not|any\s+difference|a\s+difference|difference|the\s+same|same)\b", re.I)
_LETTERED_OPTION = re.compile(r"(?:^|\s)\(?[a-z]\s*\)", re.I)


def parse_any_image(prompt: str, n_images: int) -> AnyImage | None:
    """The object of an "is there an X in (any of) the images?" yes / no question over
    ``n_images`` images (two or more), or None when ``prompt`` is not one -- also when
    lettered options follow it (MIOH's multiple-choice form, "A) Yes, all of them ..."),
    whose answers are option letters, not yes / no."""
    if n_images < 1:
        raise ValueError(f"n_images must be >= 1, got {n_images}")
    found = _ANY_IMAGE.search(prompt)
    if n_images < 2 or not found or _LETTERED_OPTION.search(prompt[found.end():]):
        return None
    obj = found.group("object").strip()
    if _NOT_AN_OBJECT.match(obj):
        return None
    return AnyImage(obj, {k: "yes" for k in range(n_images)})


def parse_multi_image(prompt: str, n_images: int) -> WhichImage | AnyImage | None:
    """A multi-image existence question crop-and-verify can check image by image: "in which
    image is there ...?" (:func:`parse_which_image`) or "is there ... in the images?"
    (:func:`parse_any_image`); None for anything else."""
    return parse_which_image(prompt, n_images) or parse_any_image(prompt, n_images)


def decide(which: WhichImage | AnyImage, evidence: dict[int, float | None], tau: float, decompose: bool) -> int | str | None:
    """What a verified multi-image question becomes, from each image's "yes" evidence
    (``None``: that image's final answer is not "yes"): the image with the strongest
    evidence above ``tau`` (strict; ties go to the first image), else, when ``decompose``
    and the question offers it, ``"none"``; ``None`` keeps the first answer. The policy of
    :meth:`mitigate.crop_verify.CropVerify.answer_which_image`."""
    passed = {k: e for k, e in evidence.items() if e is not None and e > tau}
    if passed:
        return max(sorted(passed), key=lambda k: passed[k])
    if decompose and which.none is not None:
        return "none"
    return None


__all__ = ["AnyImage", "EXISTENCE_TEMPLATE", "WhichImage", "decide", "parse_any_image", "parse_multi_image",
           "parse_which_image"]
