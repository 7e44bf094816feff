"""Find the prompt spans that carry a prior about the image, and map them to tokens.

A *prior span* is a statement of belief or an assertion about what the image contains,
placed before the question: DO-Bench's graded templates ("I suspect / believe / am
certain there is no dog in the image.", Sec. 3.2) and MIOH's linguistic pressure
(sycophantic: "I looked carefully but don't see what I'm looking for", "I thought I saw
more than one backpack, but I'm not certain"; instructional override: "Analysis confirms
the target is not in these images", Sec. 4.3 and App. Fig. I-II).

:func:`find_prior_spans` splits the prompt into sentences and keeps a sentence when it
*asserts or believes something about the visual content* (a belief/assertion cue plus an
existence, seeing or finding cue) and is not itself a question or a plain instruction.
It deliberately errs on the side of leaving text alone: the question, "Answer Yes or
No.", "Based on the image, ..." are never suppressed. Users with other phrasings pass
spans explicitly (character offsets or a marked substring).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

# belief (hedged) and assertion (authoritative) openers, first person or impersonal
_BELIEF = (
    r"\b(i|we)\s+(?:strongly\s+|really\s+|honestly\s+)?(suspect|believe|think|thought|guess|feel|assume|"
    r"reckon|doubt|am\s+(?:fairly\s+|quite\s+|absolutely\s+|very\s+|pretty\s+)?(?:certain|sure|confident|convinced|positive)|"
    r"looked|searched|checked|saw|see|could\s*n[o']?t|can(?:\s*no|')t|was\s*n[o']?t\s+able|"
    r"was\s+unable|do\s*n[o']?t|did\s*n[o']?t|have\s*n[o']?t)\b"
)
_ASSERT = (
    r"\b(analysis|inspection|detection|the\s+(?:system|detector|annotation|metadata|caption|label)s?|"
    r"experts?|it\s+is|it's|this\s+is)\s+(?:has\s+been\s+|have\s+|has\s+)?"
    r"(confirm(?:s|ed)?|verif(?:y|ies|ied)|show(?:s|ed|n)?|establish(?:es|ed)|prove(?:s|d|n)?|"
    r"indicate(?:s|d)?|report(?:s|ed)?|state(?:s|d)?|certain|confirmed|known|clear|obvious)\b"
    r"|\b(definitely|certainly|clearly|obviously|undoubtedly)\b\s+(?:there\s+is|there\s+are|is|are|contains?|shows?)"
)
# the statement is about the visual content
_CONTENT = (
    r"\b(there\s+(?:is|are|was|were|isn't|aren't)|there's|in\s+(?:the|this|these|any)\s+(?:image|images|photo|picture|scene)s?|"
    r"(?:image|images|photo|picture|scene)s?\s+(?:contains?|shows?|has|have|includes?|depicts?)|"
    r"\bsee\b|\bsaw\b|\bfind\b|\bfound\b|\bspot(?:ted)?\b|\bpresent\b|\babsent\b|\bmissing\b|\btarget\b|"
    r"looking\s+for|anywhere)"
)
_QUESTION = re.compile(
    r"^\s*(is|are|was|were|do|does|did|can|could|how|what|which|where|who|in\s+which|based\s+on)\b", re.I
)
_INSTRUCTION = re.compile(r"^\s*(answer|please|respond|reply|choose|select|pick|output|describe|give|tell)\b", re.I)
_NO_BELIEF = r"\b(?:i|we)\s+(?:do|did)\s*n[o']?t\s+know\s+(?:if|whether|where|what|which|how)\b"
_SENTENCE = re.compile(r"[^.?!\n]+(?:[.?!]+|$|(?=\n))")
# chat-role labels that can start a "sentence" of a templated prompt ("USER: i suspect ...")
_ROLE = re.compile(r"^\s*(?:user|assistant|human|system|gpt|question)\s*:\s*", re.I)
# a multiple-choice option marker ("A) ", "(b) "): options run into the next sentence
# without punctuation ("E) None of the above I looked closely but ...", MIOH App. Fig. II)
_OPTION = re.compile(r"(?:^|\s)\(?[A-Ea-e]\)\s")


@dataclass(frozen=True)
class Span:
    """A character span ``[start, end)`` of the prompt, with the sentence it covers."""

    start: int
    end: int
    text: str
    kind: str  # "belief" | "assertion" | "user"


def _classify(sentence: str) -> str | None:
    s = _ROLE.sub("", sentence).strip()
    if not s or s.endswith("?") or _QUESTION.match(s) or _INSTRUCTION.match(s):
        return None
    lowered = s.lower().replace("\u2019", "'")
    if not re.search(_CONTENT, lowered):
        return None
    if re.search(_ASSERT, lowered):
        return "assertion"
    # "I don't know if / whether / where ..." states no belief: it is the question, hedged
    if re.search(_BELIEF, re.sub(_NO_BELIEF, " ", lowered)):
        return "belief"
    return None


def find_prior_spans(prompt: str) -> list[Span]:
    """Belief and assertion sentences about the image in ``prompt`` (character spans).

    A sentence that also contains the question after a comma ("I'm not sure. Based on the
    image, is there ...?") is split at the question: only the statement is returned. When
    multiple-choice options run into the statement without punctuation ("E) None of the
    above I looked closely but ..."), the span starts at the statement's cue ("I looked").
    """
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
    spans = []
    for match in _SENTENCE.finditer(prompt):
        sentence = match.group(0)
        # options run into the statement: only the text after the last option can be one
        options = list(_OPTION.finditer(sentence))
        offset = options[-1].end() if options else 0
        text = sentence[offset:]
        kind = _classify(text)
        if kind is None:
            continue
        role = _ROLE.match(text)
        lead = role.end() if role else len(text) - len(text.lstrip())
        if options:  # the statement starts at its cue, not at the last option's own words
            lowered = text.lower().replace("\u2019", "'")
            cue = [m.start() for m in (re.search(_BELIEF, lowered), re.search(_ASSERT, lowered)) if m]
            lead = max(lead, min(cue))
        tail = len(text.rstrip())
        start = match.start() + offset
        spans.append(Span(start + lead, start + tail, text[lead:tail], kind))
    return spans


def find_prior_spans_between(prompt: str, cuts: Iterable[int]) -> list[Span]:
    """:func:`find_prior_spans` with no sentence running across a character position in
    ``cuts`` (where an image sits in the decoded prompt): each stretch between cuts is
    searched on its own, and the spans are given in ``prompt``'s characters. A belief
    sentence interrupted by an image is therefore found only in the part that reads as one
    on its own (or not at all); mark such a sentence with ``spans=`` instead."""
    bounds = sorted({c for c in cuts if 0 < c < len(prompt)})
    spans = []
    for start, end in zip([0, *bounds], [*bounds, len(prompt)]):
        spans += [Span(s.start + start, s.end + start, s.text, s.kind) for s in find_prior_spans(prompt[start:end])]
    return spans


def _occurrences(text: str, piece: str, before: int | None = None) -> list[int]:
    """Start of every occurrence of ``piece`` in ``text`` (overlapping ones included),
    those starting before ``before`` only when it is given."""
    out, at = [], text.find(piece)
    while at >= 0 and (before is None or at < before):
        out.append(at)
        at = text.find(piece, at + 1)
    return out


def _loose(text: str) -> tuple[str, list[int]]:
    """``text`` case-folded and without whitespace, and for each of its characters the index
    in ``text`` it came from: the differences a tokenizer's decoding leaves between the text
    written and the text given back (a lower-casing vocabulary; spaces dropped before
    punctuation or collapsed)."""
    chars, where = [], []
    for i, c in enumerate(text):
        if not c.isspace():
            low = c.casefold()  # may be longer than one character ("ß" -> "ss"); final and medial sigma alike
            chars.append(low)
            where += [i] * len(low)
    return "".join(chars), where


def _find(prompt: str, piece: str, k: int, loose_k: int, loose_prompt: tuple[str, list[int]]) -> tuple[int, int] | None:
    """``(start, end)`` in ``prompt`` of the k-th occurrence of ``piece``, verbatim; failing
    that, of its ``loose_k``-th occurrence up to case and whitespace (``loose_prompt`` is
    ``_loose(prompt)``), the range running from its first to its last non-space character.
    None when neither has that many occurrences."""
    found = _occurrences(prompt, piece)
    if len(found) > k:
        return found[k], found[k] + len(piece)
    needle, _ = _loose(piece)
    found = _occurrences(loose_prompt[0], needle) if needle else []
    return _loose_range(loose_prompt, found[loose_k], needle) if len(found) > loose_k else None


def _loose_range(loose: tuple[str, list[int]], at: int, needle: str) -> tuple[int, int]:
    """The ``(start, end)`` in the original text of ``needle`` found at ``at`` of its loose form."""
    where = loose[1]
    return where[at], where[at + len(needle) - 1] + 1


def _without(text: str, hidden: Iterable[str]) -> str:
    """``text`` with every occurrence of each ``hidden`` string (special tokens, image
    placeholders) overwritten by NUL characters of the same length: offsets are kept, and
    nothing inside them is counted as an occurrence of the caller's text."""
    for h in sorted({h for h in hidden if h}, key=len, reverse=True):
        text = text.replace(h, "\0" * len(h))
    return text


def user_spans(prompt: str, spans: Iterable[tuple[int, int] | str], source: str | None = None,
               hidden: Iterable[str] = ()) -> list[Span]:
    """Spans given by the caller: a substring of ``prompt`` (the text the model sees, image
    and special tokens left out) to mark -- its first occurrence -- or ``(start, end)``
    character offsets.

    Offsets index ``prompt`` itself when ``source`` is None. With ``source`` -- the string
    the caller wrote, typically the chat-templated text given to the processor, whose
    special tokens and single image placeholder the decoded ``prompt`` does not keep
    character for character -- ``source[start:end]`` is looked up in ``prompt`` as the same
    text at the same occurrence (the k-th time it appears, counting overlapping matches
    from the start), so a sentence that occurs twice is marked where the caller pointed.

    Both are matched verbatim first. Where the tokenizer does not give the text back
    verbatim -- a lower-casing vocabulary, spaces dropped before punctuation ("dog ." read
    back as "dog.") -- they are matched again up to case and whitespace, the same
    occurrence counted the same way, so a sentence copied from the caller's own prompt is
    found. ``hidden``: strings of ``source`` the decoded prompt leaves out (the tokenizer's
    special tokens, the image placeholder), not counted as occurrences -- "image" in
    ``<image>`` is not the first "image" of "is there a dog in the image". For offsets the
    occurrence is counted up to case and whitespace whenever the decoded prompt holds as
    many occurrences that way as ``source`` does, since a lower-casing decoder can make
    another occurrence verbatim-equal to the piece. Text found neither way (a range inside a
    special token among it) and a blank substring are errors naming them, never a silent
    miss.
    """
    out = []
    loose_prompt = _loose(prompt)
    counted = None if source is None else _without(source, hidden)
    loose_counted = None if counted is None else _loose(counted)
    for span in spans:
        if isinstance(span, str):
            at = _find(prompt, span, 0, 0, loose_prompt) if span.strip() else None
            if at is None:
                raise ValueError(f"spans: {span!r} does not occur in the prompt, verbatim or up to case and "
                                 f"whitespace: {prompt!r}")
            start, end = at
        else:
            start, end = span
            text = prompt if source is None else source
            if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(text)):
                where = "the prompt" if source is None else "span_texts' string"
                raise ValueError(f"spans: ({start}, {end}) is outside {where} (length {len(text)})")
            if source is not None:
                piece = source[start:end]
                k = len(_occurrences(counted, piece, before=start))
                needle, _ = _loose(piece)
                in_source = _occurrences(loose_counted[0], needle) if needle else []
                loose_k = sum(loose_counted[1][i] < start for i in in_source)
                in_prompt = _occurrences(loose_prompt[0], needle) if needle else []
                if needle and len(in_source) == len(in_prompt) and loose_k < len(in_prompt):
                    # decoding kept every occurrence up to case and whitespace: the loose_k-th is
                    # the one pointed at, even where lower-casing made another one verbatim-equal
                    # ("There is" ... "there is"), which a verbatim count would pick instead
                    a, b = _loose_range(loose_prompt, in_prompt[loose_k], needle)
                    lead = len(piece) - len(piece.lstrip())
                    verbatim = a - lead >= 0 and prompt[a - lead : a - lead + len(piece)] == piece
                    at = (a - lead, a - lead + len(piece)) if verbatim else (a, b)
                else:  # text inside special tokens or placeholders the decoding drops: counted as written
                    at = _find(prompt, piece, k, loose_k, loose_prompt)
                if at is None:
                    raise ValueError(
                        f"spans: ({start}, {end}) = {piece!r} of span_texts' string occurs {len(_occurrences(prompt, piece))} "
                        f"time(s) in the prompt as the tokenizer decodes it (verbatim; up to case and whitespace "
                        f"too few as well), needed occurrence {k + 1}: {prompt!r}")
                start, end = at
        out.append(Span(start, end, prompt[start:end], "user"))
    return out


#: tokens of left context kept when a token's text is decoded (:func:`decode_with_offsets`)
DECODE_WINDOW = 8


def decode_with_offsets(tokenizer, ids: Sequence[int], skip: set[int],
                        window: int | None = DECODE_WINDOW) -> tuple[str, list[tuple[int, int]]]:
    """Text of ``ids`` and each token's ``(start, end)`` character range in it.

    Incremental decoding keeps each tokenizer's own spacing rules: a token's text is what
    decoding it adds after the tokens before it; when that text does not extend the text so
    far (a token that completes a multi-byte character rewrites the replacement character
    before it), the token gets an empty range at the end. Tokens in ``skip`` (image and
    special tokens) get an empty range.

    Each step decodes a window of the last ``window`` to ``2 * window`` kept tokens, as
    text-generation servers detokenise a stream, so a prompt of n tokens costs O(n)
    decoding; ``window=None`` decodes every whole prefix, O(n^2) (0.24 s against 7 ms for
    a 2,280-token byte-level BPE prompt, ``benchmarks/test_span_speed.py``). Where a window's text does not extend the previous window's (a
    completed character), the window's new text replaces its old one at the end of the
    text; and if the pieces do not add up to the whole decoded prompt, the whole-prefix
    decoding is redone for every token, so the text is always the tokenizer's own.
    """
    decode = _decoder(tokenizer)
    if window is None:
        return _decode_with_offsets(decode, ids, skip, None)
    windowed = _decode_with_offsets(decode, ids, skip, window)
    kept = [int(t) for t in ids if t not in skip]
    if windowed[0] == decode(kept):
        return windowed
    return _decode_with_offsets(decode, ids, skip, None)


def _decoder(tokenizer):
    """``ids -> text`` without special tokens or clean-up. A transformers fast tokenizer that
    does not change how it decodes is read through its Rust backend directly: the Python
    wrapper around it (argument checks, a conversion of every id) cost three times the
    decoding of a short window."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - older transformers
        TokenizersBackend = None
    kind = type(tokenizer)
    if (TokenizersBackend is not None and isinstance(tokenizer, TokenizersBackend)
            and kind.decode is TokenizersBackend.decode and kind._decode is TokenizersBackend._decode):
        backend = tokenizer.backend_tokenizer
        return lambda tokens: backend.decode(tokens, skip_special_tokens=True)
    return lambda tokens: tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _decode_with_offsets(decode, ids, skip, window: int | None) -> tuple[str, list[tuple[int, int]]]:
    """:func:`decode_with_offsets` with a left context of ``window`` tokens (None: all)."""
    text, offsets, kept = "", [], []
    first, before = 0, ""  # the window's first kept token, and the window's text so far
    for tok in ids:
        if tok in skip:
            offsets.append((len(text), len(text)))
            continue
        kept.append(int(tok))
        if window is None:
            new = decode(kept)
        else:
            now = decode(kept[first:])
            if now.startswith(before):
                new = text + now[len(before):]
            elif text.endswith(before):  # the token rewrote the window's text (a completed character)
                new = text[: len(text) - len(before)] + now
            else:
                new = decode(kept)
            before = now
            if len(kept) - first >= 2 * window:  # slide: keep the last `window` tokens as context
                first = len(kept) - window
                before = decode(kept[first:])
        start = len(text) if new.startswith(text) else len(new)
        offsets.append((start, len(new)))
        text = new
    return text, offsets


def spans_to_mask(offsets: list[tuple[int, int]], spans: Sequence[Span], length: int) -> torch.Tensor:
    """Tokens whose characters overlap a span (a ``(length,)`` boolean mask)."""
    mask = torch.zeros(length, dtype=torch.bool)
    for i, (a, b) in enumerate(offsets):
        if b > a and any(a < s.end and s.start < b for s in spans):
            mask[i] = True
    return mask
