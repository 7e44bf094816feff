"""Decoding-time hallucination mitigations, attached with hooks to an unmodified HF VLM.

    from mitigate import attach, VCD
    with attach(model, VCD(alpha=1.0, beta=0.1)):
        out = model.generate(**inputs)        # plain generate(), pipelines too

Available: :class:`VCD` (visual contrastive decoding), :class:`Plausibility` (VCD's
plausibility constraint alone, a control), :class:`PriorSuppression` (context mode: an
attention bias on belief/assertion spans of the prompt; output mode: an image-free
contrast). Planned: crop-and-verify (issue 6).
"""

from .base import MITIGATIONS, Mitigation, MitigationHandle, attach, get_mitigation, register
from .branches import Branch, ContrastBranches
from .prior import PriorSuppression
from .spans import Span, find_prior_spans
from .vcd import VCD, Plausibility, plausibility_mask

__all__ = [
    "Branch", "ContrastBranches", "MITIGATIONS", "Mitigation", "MitigationHandle", "Plausibility", "PriorSuppression",
    "Span", "VCD", "attach", "find_prior_spans",
    "get_mitigation", "plausibility_mask", "register",
]
