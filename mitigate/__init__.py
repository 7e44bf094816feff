"""Decoding-time hallucination mitigations, attached with hooks to an unmodified HF VLM.

    from mitigate import attach, VCD
    with attach(model, VCD(alpha=1.0, beta=0.1)):
        out = model.generate(**inputs)        # plain generate(), pipelines too

Available: :class:`VCD` (visual contrastive decoding), :class:`Plausibility` (VCD's
plausibility constraint alone, a control), :class:`PriorSuppression` (context mode: an
attention bias on belief/assertion spans of the prompt; output mode: an image-free
contrast), :class:`CropVerify` (re-ask on DO-Bench's Cluster/Crop views of the region the
model's own attention points at, gated by the first answer's confidence): attached, it
verifies inside the model's own ``generate()`` (the attached processor remembers the
original images); ``CropVerify.answer(model, images, prompts)`` does the same from PIL
images and returns what each view said, and ``CropVerify.verify_caption`` checks a
caption's objects one by one.
"""

from .base import MITIGATIONS, Mitigation, MitigationHandle, attach, get_mitigation, register
from .branches import Branch, ContrastBranches
from .crop_verify import CropVerify
from .prior import PriorSuppression
from .spans import Span, find_prior_spans
from .vcd import VCD, Plausibility, plausibility_mask

__all__ = [
    "Branch", "ContrastBranches", "CropVerify", "MITIGATIONS", "Mitigation", "MitigationHandle", "Plausibility", "PriorSuppression",
    "Span", "VCD", "attach", "find_prior_spans",
    "get_mitigation", "plausibility_mask", "register",
]
