"""Visual contrastive decoding (Leng et al., "Mitigating Object Hallucinations in Large
Vision-Language Models through Visual Contrastive Decoding", CVPR 2024), as hooks.

Next-token logits are contrasted with those of a distorted image ``v'`` (Eq. 3 of the
paper, in logit form)::

    l_vcd(y) = (1 + alpha) * l(y | v, x) - alpha * l(y | v', x)

restricted to the adaptive plausibility set (Eq. 4)::

    V_head = { y : p(y | v, x) >= beta * max_w p(w | v, x) },   l_vcd(y) = -inf outside it.

Defaults alpha = 1, beta = 0.1 and the distortion (forward diffusion noise at step 500 of
1000, sigmoid beta schedule, on the normalised pixels) are the paper's / reference code's.

Choices the paper leaves open, made here:

* ``alpha = 0`` turns VCD off entirely -- including the plausibility cut -- so that
  ``alpha = 0`` reproduces the unmitigated model exactly; the plausibility constraint on
  its own is a separate control, :class:`Plausibility` (the control arXiv 2504.10020
  shows matters).
* The distortion is applied once per image per ``generate()`` call, with a generator
  seeded by ``seed`` and the image's content, so runs are reproducible and an image is
  distorted the same way whatever batch it is in.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Sequence

import torch

from hooks import HookGroup, ModelPoints

from .base import Mitigation, register
from .branches import Branch
from .distortions import DISTORTIONS

DISTORTION_NAMES = (*DISTORTIONS, "no_image")


def plausibility_mask(logits: torch.Tensor, beta: float) -> torch.Tensor:
    """True where ``p(y) >= beta * max p`` under ``softmax(logits)`` (VCD Eq. 4)."""
    cutoff = logits.max(dim=-1, keepdim=True).values + math.log(beta)
    return logits >= cutoff


def _check_beta(beta: float) -> float:
    if not isinstance(beta, (int, float)) or not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must be in (0, 1] (the plausibility threshold of VCD Eq. 4), got {beta!r}")
    return float(beta)


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
        if not isinstance(self.alpha, (int, float)) or not self.alpha >= 0 or math.isinf(self.alpha):
            raise ValueError(f"alpha must be a finite number >= 0 (VCD Eq. 3), got {self.alpha!r}")
        _check_beta(self.beta)
        if self.distortion not in DISTORTION_NAMES:
            raise ValueError(f"distortion must be one of {DISTORTION_NAMES}, got {self.distortion!r}")
        # validate every distortion parameter now, not at the first image
        if not isinstance(self.noise_step, int) or not 0 <= self.noise_step < 1000:
            raise ValueError(f"noise_step must be an int in [0, 1000), got {self.noise_step!r}")
        if not self.blur_sigma > 0:
            raise ValueError(f"blur_sigma must be positive, got {self.blur_sigma!r}")
        if not 0 < self.mask_ratio <= 1:
            raise ValueError(f"mask_ratio must be in (0, 1], got {self.mask_ratio!r}")

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
        (contrast,) = branch_logits
        out = (1 + self.alpha) * logits - self.alpha * contrast
        return out.masked_fill(~plausibility_mask(logits, self.beta), float("-inf"))


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
        _check_beta(self.beta)

    def attach_hooks(self, points: ModelPoints, group: HookGroup) -> None:
        beta = self.beta

        def cut(module, args, kwargs, output):
            output.logits = output.logits.masked_fill(~plausibility_mask(output.logits, beta), float("-inf"))
            return output

        group.add_forward_hook(points.model, cut)
