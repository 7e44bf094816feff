"""Paired attribution: which mechanism a mitigation fixes, which it breaks (issue 8)."""

from .stats import mcnemar_exact, paired_bootstrap, verdict

__all__ = ["mcnemar_exact", "paired_bootstrap", "verdict"]
