"""Validation of a mitigation's numeric settings, one rule for all of them.

A setting is a real number -- a Python ``int`` / ``float`` or a numpy scalar (``np.float32``
from an array: ``float32`` had been refused while ``float64``, a ``float`` subclass, passed)
-- never a ``bool`` (``alpha=True`` is a slip, not 1) and never a string; NaN fails every
range. A numpy scalar is stored as a Python ``float`` so that a run's recorded settings stay
JSON; an ``int`` or ``float`` is kept as given (its repr is part of a run's identity).
"""

from __future__ import annotations

import math
import numbers
from typing import Callable

__all__ = ["integer", "real"]


def real(value, name: str, rule: str, ok: Callable[[float], bool]):
    """``value`` if it is a real number for which ``ok`` holds (numpy scalars as ``float``);
    else ``ValueError("<name> must be <rule>, got <value>")``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number ({rule}), got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range (10**400)
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number) or not ok(number):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return value if type(value) in (int, float) else number


def integer(value, name: str, rule: str, ok: Callable[[int], bool]) -> int:
    """``value`` as an ``int`` if it is an integer (Python or numpy; not a bool) for which
    ``ok`` holds; else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int ({rule}), got {value!r}")
    if not ok(int(value)):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return int(value)
