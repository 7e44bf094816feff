"""Where a templated prompt holds the model's own earlier answers (assistant turns).

Context-mode prior suppression (:mod:`mitigate.prior`) looks for belief and assertion
sentences about the image in the prompt. In a conversation the prompt also holds the
model's earlier answers ("USER: <image> describe the image . ASSISTANT: i see a dog in the
image . </s> USER: what colour is it ?"), and "i see a dog in the image" reads as a belief:
suppressed, the follow-up question lost what "it" refers to. Those turns are not the
user's pressure, so the detector leaves them alone.

The turns are told by the chat template itself, not by a guess at role names: a
conversation of three sentinel messages (user, assistant, user) is rendered, and the text
between the first user message and the assistant's (``open``: "ASSISTANT:", or
``<|im_end|>\\n<|im_start|>assistant\\n``) and between the assistant's and the next user
message (``close``) are the markers. They are found in the prompt's tokens read with the
special tokens written out (a marker made of special tokens cannot occur in user text), up
to case and whitespace; an assistant turn runs from the end of the last ``open`` before a
``close`` to that ``close``. A turn must be closed: the generation prompt's ``open`` at the
end opens none, and neither do a role's words in the user's own text ("assistant: i think
there is a dog ...", with plain-text markers such as the organism's " ASSISTANT: "), unless
the template's own ``close`` follows them before any other ``open``.

Without a chat template (PaliGemma), or with one whose rendering does not hold the
sentinels in that order, nothing is told apart and the whole prompt is searched, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .spans import _loose  # case-folded, whitespace-free text and where each character came from

__all__ = ["TurnMarkers", "assistant_token_ranges", "turn_markers"]

_SENTINELS = ("QQUSERQQ", "QQASSISTANTQQ", "QQNEXTQQ")


@dataclass(frozen=True)
class TurnMarkers:
    """The text that opens and closes an assistant turn in a chat template."""

    open: str
    close: str


def _template_of(tokenizer: Any, template: Any) -> str | None:
    template = template if template is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def turn_markers(tokenizer: Any, template: Any = None) -> TurnMarkers | None:
    """The assistant turn's markers in ``template`` (default: the tokenizer's own chat
    template), or None where they cannot be read (module notes)."""
    template = _template_of(tokenizer, template)
    render = getattr(tokenizer, "apply_chat_template", None)
    if template is None or not callable(render):
        return None
    user, assistant, following = _SENTINELS
    for as_list in (True, False):  # multimodal templates read a list of parts, text ones a string
        def message(role: str, text: str) -> dict:
            return {"role": role, "content": [{"type": "text", "text": text}] if as_list else text}

        try:
            text = render([message("user", user), message("assistant", assistant), message("user", following)],
                          chat_template=template, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - a template that cannot render this conversation: try the other form
            continue
        if not isinstance(text, str):
            continue
        a, b, c = (text.find(s) for s in _SENTINELS)
        if 0 <= a < b < c:
            opening, closing = text[a + len(user) : b], text[b + len(assistant) : c]
            # a text template given the list form prints the list ("[{'type': 'text', 'text': '...")
            printed = any(q in opening + closing for q in ("'type'", '"type"'))
            if opening.strip() and closing.strip() and not printed:
                return TurnMarkers(opening, closing)
    return None


def assistant_token_ranges(ids: Sequence[int], offsets: Sequence[tuple[int, int]], text: str, tokenizer: Any,
                           markers: TurnMarkers) -> list[tuple[int, int]]:
    """``(start, end)`` token ranges (end exclusive) of the assistant turns of ``ids``, whose
    decoded ``text`` and per-token character ``offsets`` are
    :func:`mitigate.spans.decode_with_offsets`'s. A token that decodes to nothing there (a
    special token, by the tokenizer's own flag, which ``all_special_ids`` may not list:
    Gemma's ``<start_of_turn>``) is written out by its token string for the markers to be
    matched."""
    to_tokens = getattr(tokenizer, "convert_ids_to_tokens", None)
    pieces, owner = [], []  # the prompt with its special tokens written out, and each char's token
    for j, (tok, (start, end)) in enumerate(zip(ids, offsets)):
        piece = (to_tokens(int(tok)) or "") if start == end and to_tokens else text[start:end]
        pieces.append(piece)
        owner += [j] * len(piece)
    loose, where = _loose("".join(pieces))

    def found(marker: str) -> list[tuple[int, int]]:  # token ranges of each occurrence
        key = _loose(marker)[0]
        out, at = [], loose.find(key)
        while key and at >= 0:
            out.append((owner[where[at]], owner[where[at + len(key) - 1]] + 1))
            at = loose.find(key, at + len(key))
        return out

    opens, closes = found(markers.open), found(markers.close)
    # a turn is closed: it runs from the last open before a close (after the previous close)
    # to that close. An open with no close after it is the generation prompt -- or the role's
    # words in the user's own text ("assistant: i think ..."), which must not hide what follows
    turns, after = [], 0
    for start, stop in closes:
        begin = max((b for a, b in opens if a >= after and b <= start), default=None)
        if begin is not None and start > begin:
            turns.append((begin, start))
        after = stop
    return turns
