"""Visual contrastive decoding (Leng et al., "Mitigating Object Hallucinations in Large
Vision-Language Models through Visual Contrastive Decoding", CVPR 2024), as hooks.

Next-token logits are contrasted with those of a distorted image ``v'`` (Eq. 3 of the
paper, in logit form)::

    l_vcd(y) = (1 + alpha) * l(y | v, x) - alpha * l(y | v', x)

restricted to the adaptive plausibility set (Eq. 4)::

    V_head = { y : p(y | v, x) >= beta * max_w p(w | v, x) },   l_vcd(y) = -inf outside it
    (in effect: see the choices below).

Defaults alpha = 1, beta = 0.1 and the distortion (forward diffusion noise at step 500 of
1000, sigmoid beta schedule, on the normalised pixels) are the paper's / reference code's.

Choices the paper leaves open, made here:

* ``alpha = 0`` turns VCD off entirely -- including the plausibility cut -- so that
  ``alpha = 0`` reproduces the unmitigated model exactly; the plausibility constraint on
  its own is a separate control, :class:`Plausibility` (the control arXiv 2504.10020
  shows matters).
* **Outside V_head the logits are finite, not -inf** (:func:`cut_implausible`): every
  implausible token sits :data:`IMPLAUSIBLE_GAP` below the lowest plausible one, in the
  model's own order. The cut runs inside the forward, before ``generate()``'s logits
  processors, and a processor may forbid every plausible token (``min_new_tokens`` while
  V_head is only the end token; ``bad_words_ids``, ``no_repeat_ngram_size``): with -inf
  the row was then all -inf, so greedy decoding emitted token 0 and sampling raised. The
  reference code applies its processors after the cut too and has the same failure. Here
  the model's best allowed token is taken instead. Elsewhere nothing changes: softmax
  gives the implausible tokens exactly 0 in float32, so greedy and sampled tokens are
  those of the -inf cut.
* The distortion is applied once per image per ``generate()`` call, with a generator
  seeded by ``seed`` and the image's content, so runs are reproducible and an image is
  distorted the same way whatever batch it is in.
"""

from __future__ import annotations

import math
import sys
import zlib
from dataclasses import dataclass
from typing import Sequence

import torch

from hooks import HookGroup, ModelPoints

from .base import Mitigation, register
from .checks import integer, real
from .branches import Branch, refuse_guidance
from .distortions import DISTORTIONS

DISTORTION_NAMES = (*DISTORTIONS, "no_image")


def plausibility_mask(logits: torch.Tensor, beta: float) -> torch.Tensor:
    """True where ``p(y) >= beta * max p`` under ``softmax(logits)`` (VCD Eq. 4)."""
    cutoff = logits.max(dim=-1, keepdim=True).values + math.log(beta)
    return logits >= cutoff


#: How far below the lowest plausible score :func:`cut_implausible` puts the implausible
#: tokens: exp(-1e4 / T) is 0 in float32 for any temperature T below about 100, so softmax
#: (and sampling) is that of an -inf cut.
IMPLAUSIBLE_GAP = 1e4


def cut_implausible(scores: torch.Tensor, logits: torch.Tensor, beta: float) -> torch.Tensor:
    """``scores`` on VCD's plausible set (Eq. 4, read from the model's own ``logits``) and,
    outside it, :data:`IMPLAUSIBLE_GAP` below the row's lowest plausible score, ordered by
    ``logits`` (module notes: finite, so a logits processor that forbids every plausible
    token leaves the model's best allowed one, not an all -inf row). Returned in float32 at
    least (a bf16 / fp16 model's logits come back as float32 where it is applied)."""
    keep = plausibility_mask(logits, beta)
    # in float32 at least: at 1e4 below, bf16 / fp16 steps are 64 / 8 apart, which would tie
    # every implausible token (and fp16 overflows near -6.5e4); generate() reads float32 anyway
    dtype = torch.promote_types(scores.dtype, torch.float32)
    scores, logits = scores.to(dtype), logits.to(dtype)
    lowest = scores.masked_fill(~keep, float("inf")).amin(dim=-1, keepdim=True)
    below = lowest - IMPLAUSIBLE_GAP + (logits - logits.amax(dim=-1, keepdim=True))
    return torch.where(keep, scores, below)


def refuse_length_penalty(depth: int = 24) -> None:
    """A clear error when the running ``generate()`` applies transformers'
    ``ExponentialDecayLengthPenalty`` (``exponential_decay_length_penalty``) after a
    plausibility cut: it adds ``|score| * (factor ** k - 1)`` to the end token's score, and
    the cut puts an implausible end token :data:`IMPLAUSIBLE_GAP` below the plausible ones,
    so the penalty lifted it by about 1e4 a step -- the end token went from impossible to
    certain as soon as ``factor ** k`` passed 2 (on the organism a 12-token description
    stopped after 5 tokens, where the unmitigated model wrote all 12). The reference's -inf
    cut gives NaN there. Found by the decoding loop's ``logits_processor`` list among the
    frames above the hook."""
    from transformers.generation.logits_process import ExponentialDecayLengthPenalty

    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return
        if "logits_processor" in frame.f_code.co_varnames:
            processors = frame.f_locals.get("logits_processor")
            if isinstance(processors, (list, tuple)) and any(isinstance(p, ExponentialDecayLengthPenalty)
                                                              for p in processors):
                raise ValueError(
                    "exponential_decay_length_penalty: transformers' penalty adds |score| * (factor ** k - 1) to the "
                    "end token's score, and a plausibility cut (VCD, Plausibility, prior suppression's output mode) "
                    f"puts an implausible end token {IMPLAUSIBLE_GAP:.0e} below the plausible ones, so the penalty "
                    "would make it certain once factor ** k passes 2; leave it unset while the cut is attached "
                    "(max_new_tokens or a stopping criterion end a generation without it)")
            return
        frame = frame.f_back


def allowed(scores: torch.Tensor) -> torch.Tensor:
    """Where ``scores`` (logits as VCD, :class:`Plausibility` or prior suppression's output
    mode return them, or a -inf-cut reference) keep a token in the plausible set: within
    half of :data:`IMPLAUSIBLE_GAP` of the row's best score."""
    return scores >= scores.amax(dim=-1, keepdim=True) - IMPLAUSIBLE_GAP / 2


def _check_beta(beta: float) -> float:
    return real(beta, "beta", "in (0, 1] (the plausibility threshold of VCD Eq. 4)", lambda v: 0.0 < v <= 1.0)


@register
@dataclass
class VCD(Mitigation):
    """Visual contrastive decoding. ``VCD(alpha=1.0, beta=0.1, distortion="diffusion_noise")``.

    ``distortion``: ``"diffusion_noise"`` (default, ``noise_step``), ``"gaussian_blur"``
    (``blur_sigma``), ``"patch_mask"`` (``mask_ratio``) or ``"no_image"`` (the branch
    cannot attend to the image tokens). ``seed`` makes the noise reproducible.
    """

    alpha: float = 1.0
    beta: float = 0.1
    distortion: str = "diffusion_noise"
    noise_step: int = 500
    blur_sigma: float = 2.0
    mask_ratio: float = 0.5
    seed: int = 0

    name = "vcd"

    def __post_init__(self) -> None:
        self.alpha = real(self.alpha, "alpha", "a finite number >= 0 (VCD Eq. 3)", lambda v: 0 <= v < math.inf)
        self.beta = _check_beta(self.beta)
        if self.distortion not in DISTORTION_NAMES:
            raise ValueError(f"distortion must be one of {DISTORTION_NAMES}, got {self.distortion!r}")
        # validate every distortion parameter now, not at the first image
        self.noise_step = integer(self.noise_step, "noise_step", "in [0, 1000)", lambda v: 0 <= v < 1000)
        self.blur_sigma = real(self.blur_sigma, "blur_sigma", "positive", lambda v: 0 < v < math.inf)
        self.mask_ratio = real(self.mask_ratio, "mask_ratio", "in (0, 1]", lambda v: 0 < v <= 1)

    @property
    def extra_rows(self) -> int:
        return 1

    def _distort(self, pixels: torch.Tensor) -> torch.Tensor:
        """Distort each image with noise seeded by ``seed`` and the image's own content, so an
        image gets the same distortion whatever batch it is in (batch-size invariance).
        Flattened patches (Qwen) arrive one image at a time: the branches split them by the
        adapter's ``pixel_grids`` (:meth:`mitigate.branches.ContrastBranches._distorted`)."""
        if pixels.dim() >= 4 and pixels.shape[0] > 1:
            return torch.cat([self._distort(p[None]) for p in pixels], dim=0)
        content = zlib.crc32(pixels.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + content)
        if self.distortion == "diffusion_noise":
            return DISTORTIONS["diffusion_noise"](pixels, step=self.noise_step, generator=generator)
        if self.distortion == "gaussian_blur":
            return DISTORTIONS["gaussian_blur"](pixels, sigma=self.blur_sigma)
        return DISTORTIONS["patch_mask"](pixels, ratio=self.mask_ratio, generator=generator)

    def branches(self, points: ModelPoints) -> list[Branch]:
        if self.distortion == "no_image":
            return [Branch("vcd:no_image", hide_image=True)]
        return [Branch(f"vcd:{self.distortion}", pixels=self._distort)]

    def combine(self, logits: torch.Tensor, branch_logits: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.alpha == 0:
            return logits
        refuse_length_penalty()
        (contrast,) = branch_logits
        out = (1 + self.alpha) * logits - self.alpha * contrast
        return cut_implausible(out, logits, self.beta)


@register
@dataclass
class Plausibility(Mitigation):
    """VCD's adaptive plausibility constraint alone (Eq. 4), without any contrast branch.

    The control arXiv 2504.10020 asks for: it turns sampling into near-greedy decoding,
    which by itself explains much of contrastive decoding's reported gain.
    """

    beta: float = 0.1
    name = "plausibility"

    def __post_init__(self) -> None:
        self.beta = _check_beta(self.beta)

    def attach_hooks(self, points: ModelPoints, group: HookGroup) -> None:
        beta = self.beta

        def cut(module, args, kwargs, output):
            refuse_guidance("the plausibility cut", "it would cut the unconditional logits too, and the guidance, "
                            "which adds guidance_scale - 1 times their difference, would then lift every token "
                            "plausible in one forward and not in the other by about (guidance_scale - 1) * 1e4")
            refuse_length_penalty()
            labels = kwargs.get("labels")
            if labels is not None and bool((labels != -100).any()):
                # the loss was computed inside forward from the uncut logits: it would score the
                # unmitigated model beside logits that are cut (PaliGemma's all -100 labels score nothing)
                raise ValueError("the plausibility cut is an inference-time mitigation; do not pass labels (the "
                                 "returned loss would be the unmitigated model's)")
            output.logits = cut_implausible(output.logits, output.logits, beta)
            return output

        group.add_forward_hook(points.model, cut)
