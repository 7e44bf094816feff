"""Reading a record's true / false fields (``correct``, ``invalid``, ``pred_yes``) the one
way every benchmark's metrics read them: a bool, nothing else.

A record written by the runner holds real bools, but a user who scores their own records
through the metric functions may hold the strings of a CSV or a spreadsheet export:
``bool("False")`` is True, so read by truthiness a record marked wrong counted as right
and an answer "no" as "yes" (audits of Causal-HalBench, DO-Bench and ReactBench, sessions
38-39). Such a value is refused with the field's name.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["flag", "optional_flag"]

_MISSING = object()


def flag(record: Mapping[str, Any], name: str, default: Any = _MISSING) -> bool:
    """``record[name]`` as a bool; ``default`` when the field is absent (KeyError without
    one). Anything but a bool (Python's or numpy's) is a ValueError naming the field."""
    value = record.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise KeyError(f"record lacks the field {name!r}")
        return default
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"record field {name!r} must be true or false, got {value!r}")
    return bool(value)


def optional_flag(record: Mapping[str, Any], name: str) -> bool | None:
    """``record[name]`` as True / False, or None where it is None (an answer that could not
    be read: ``pred_yes``); absent is a KeyError, anything else a ValueError."""
    if record.get(name, False) is None:
        return None
    return flag(record, name)
