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

__all__ = ["real"]


def real(value, name: str, rule: str, ok: Callable[[float], bool]):
    """``value`` if it is a real number for which ``ok`` holds (numpy scalars as ``float``);
    else ``ValueError("<name> must be <rule>, got <value>")``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or not ok(float(value)):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return value if type(value) in (int, float) else float(value)
