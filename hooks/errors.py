"""One helper for "unknown name" errors, so every registry answers the same way."""

from __future__ import annotations

import difflib
from typing import Iterable


def unknown(what: str, name: str, known: Iterable[str]) -> str:
    """``"unknown <what> 'x'. Did you mean ['y']? Known: [...]"`` -- the message, for any registry."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=3)
    hint = f" Did you mean {close}?" if close else ""
    return f"unknown {what} {name!r}.{hint} Known: {known}"
