"""Image distortions for contrast branches, applied to the *normalised* pixel tensor.

They act on whatever layout the model's vision encoder takes (``(N, C, H, W)`` images,
``(N, tiles, C, H, W)`` tiles, or Qwen's flattened patches ``(patches, C*T*P*P)``), so
each documents which layouts it supports. A seeded :class:`torch.Generator` makes the
noise reproducible.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

# VCD (Leng et al., CVPR 2024, Sec. 3.2 / reference implementation): forward diffusion with
# 1000 steps and a sigmoid beta schedule, noise step t = 500 by default.
DIFFUSION_STEPS = 1000


def sigmoid_betas(steps: int = DIFFUSION_STEPS, start: float = 1e-5, end: float = 5e-3) -> torch.Tensor:
    """``betas = sigmoid(linspace(-6, 6, steps)) * (end - start) + start`` (VCD's schedule)."""
    return torch.sigmoid(torch.linspace(-6, 6, steps, dtype=torch.float64)) * (end - start) + start


def diffusion_noise(pixels: torch.Tensor, *, step: int = 500, generator: torch.Generator | None = None) -> torch.Tensor:
    """VCD's distorted image: ``v' = sqrt(abar_t) * v + sqrt(1 - abar_t) * eps`` at step ``t``.

    Elementwise, so any pixel layout works (images, tiles, flattened patches).
    """
    if not isinstance(step, int) or not 0 <= step < DIFFUSION_STEPS:
        raise ValueError(f"noise_step must be an int in [0, {DIFFUSION_STEPS}), got {step!r}")
    abar = torch.cumprod(1.0 - sigmoid_betas(), dim=0)[step]
    eps = torch.randn(pixels.shape, generator=generator, dtype=torch.float32, device="cpu").to(pixels.device)
    return (math.sqrt(abar) * pixels.float() + math.sqrt(1.0 - abar) * eps).to(pixels.dtype)


def _as_images(pixels: torch.Tensor, what: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    if pixels.dim() < 4:
        raise ValueError(
            f"{what} needs pixels laid out as images (..., C, H, W); this model takes {pixels.dim()}-D "
            "patch rows -- use distortion='diffusion_noise', 'patch_mask' or 'no_image'"
        )
    shape = pixels.shape
    return pixels.reshape(-1, *shape[-3:]), shape


def gaussian_blur(pixels: torch.Tensor, *, sigma: float = 2.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """A separable Gaussian blur of each image/tile (reflect padding)."""
    if not sigma > 0:
        raise ValueError(f"blur_sigma must be positive, got {sigma!r}")
    images, shape = _as_images(pixels, "gaussian_blur")
    radius = max(1, int(math.ceil(3 * sigma)))
    x = torch.arange(-radius, radius + 1, dtype=torch.float32, device=pixels.device)
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = (kernel / kernel.sum()).to(images.dtype)
    c = images.shape[1]
    pad = min(radius, images.shape[-1] - 1, images.shape[-2] - 1)
    if pad < radius:  # tiny images: shrink the kernel to what reflect padding allows
        kernel = kernel[radius - pad : radius + pad + 1]
        kernel = kernel / kernel.sum()
        radius = pad
    out = torch.nn.functional.pad(images, (radius, radius, 0, 0), mode="reflect")
    out = torch.nn.functional.conv2d(out, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    out = torch.nn.functional.pad(out, (0, 0, radius, radius), mode="reflect")
    out = torch.nn.functional.conv2d(out, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
    return out.reshape(shape)


def patch_mask(
    pixels: torch.Tensor, *, ratio: float = 0.5, patch: int = 4, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Zero (the normalised mean) a random ``ratio`` of ``patch x patch`` cells of each image/tile.

    On patch rows -- flattened ``(patches, features)`` (Qwen-VL, GLM-4V) or per image
    ``(images, patches, features)`` (Gemma 4) -- whole patches are zeroed instead.
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"mask_ratio must be in (0, 1], got {ratio!r}")
    if pixels.dim() in (2, 3):  # patch rows: drop whole patches
        keep = torch.rand(pixels.shape[:-1], generator=generator) >= ratio
        return pixels * keep.to(pixels.device, pixels.dtype)[..., None]
    images, shape = _as_images(pixels, "patch_mask")
    n, _, h, w = images.shape
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    keep = (torch.rand(n, 1, gh, gw, generator=generator) >= ratio).to(images.dtype)
    keep = keep.repeat_interleave(patch, 2).repeat_interleave(patch, 3)[:, :, :h, :w].to(images.device)
    return (images * keep).reshape(shape)


DISTORTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "diffusion_noise": diffusion_noise,
    "gaussian_blur": gaussian_blur,
    "patch_mask": patch_mask,
}
