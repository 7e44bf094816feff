"""Causal-HalBench (co-occurrence / spurious-correlation hallucination)."""

from .loader import QAItem, load, pairs

__all__ = ["QAItem", "load", "pairs"]
