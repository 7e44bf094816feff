"""Paired attribution: which mechanism a mitigation fixes, which it breaks (issue 8)."""

from .stats import MIN_SUPPORT, mcnemar_exact, paired_bootstrap, support, verdict

__all__ = ["MIN_SUPPORT", "mcnemar_exact", "paired_bootstrap", "support", "verdict"]
