"""Per-record values a metric may keep while its caller promises the records do not change.

A paired bootstrap (:func:`evaluators.report.stats.paired_bootstrap`) scores the same
records about a thousand times; a metric whose per-record work is heavy (HalluSegBench's
mask IoUs and CMS, Eqs. 1-3) keeps that work here for the duration of
:func:`records_unchanged`, and computes it once per record.

Outside such a block nothing is kept: every call computes from the record as it is now.
An earlier memo lived in the record itself and was trusted while the record held the same
mask *objects*, so a mask edited in place (``pred[:] = False``) kept its old score. Inside
the block, a value is keyed by the record object (not its contents), so a copy
``{**record, "pred_visual": other}`` is another record and is computed afresh; the block
holds the records it has seen, so an id is never reused within it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Iterator

_scopes: list[dict] = []
__all__ = ["per_record", "records_unchanged"]


@contextlib.contextmanager
def records_unchanged() -> Iterator[None]:
    """A block within which no record a metric reads is changed in place: per-record values
    (:func:`per_record`) are computed once each and dropped at the block's end."""
    _scopes.append({})
    try:
        yield
    finally:
        _scopes.pop()


def per_record(record: Any, key: Hashable, compute: Callable[[], Any]) -> Any:
    """``compute()`` for ``record`` under ``key`` (the metric and its options), kept for the
    innermost :func:`records_unchanged` block; computed on every call outside one."""
    if not _scopes:
        return compute()
    store = _scopes[-1]
    hit = store.get((id(record), key))
    if hit is not None and hit[0] is record:
        return hit[1]
    value = compute()
    store[(id(record), key)] = (record, value)
    return value
