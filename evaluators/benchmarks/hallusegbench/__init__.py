"""HalluSegBench (counterfactual segmentation hallucination)."""

from .loader import SegSample, load

__all__ = ["SegSample", "load"]
