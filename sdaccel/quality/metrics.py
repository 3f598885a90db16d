"""Image and tensor error metrics, computed in float64 on whatever device the inputs live on.

Conventions: `a` is the candidate, `b` the reference. Images are (H, W), (C, H, W) or (B, C, H, W); uint8 images
have data range 255. No metric here changes its inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Wang et al. (2004): an 11x11 Gaussian window with sigma 1.5, and stabilising constants K1 = 0.01, K2 = 0.03.
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03


def _pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return a.detach().to(torch.float64), b.detach().to(a.device, torch.float64)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b||_2 / ||b||_2, Frobenius norms over every element (b is the reference).

    0 when a == b; inf when b is all zeros and a is not; nan when either holds a NaN.
    """
    a, b = _pair(a, b)
    diff = torch.linalg.vector_norm(a - b).item()
    ref = torch.linalg.vector_norm(b).item()
    if ref == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / ref


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max_i |a_i - b_i| (in the inputs' units: 0..255 for uint8 images)."""
    a, b = _pair(a, b)
    return (a - b).abs().max().item()


def mse(a: torch.Tensor, b: torch.Tensor) -> float:
    """mean_i (a_i - b_i)^2 over every element."""
    a, b = _pair(a, b)
    return (a - b).square().mean().item()


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB: 10 log10(L^2 / MSE), L = data_range (255 for uint8 images).

    MSE is the mean over every element of every image in the batch (one number per batch, not a mean of per-image
    PSNRs). Identical inputs give math.inf (no cap): callers that need a finite number choose their own.
    """
    err = mse(a, b)
    if err == 0.0:
        return math.inf
    return 10.0 * math.log10(data_range ** 2 / err)


def gaussian_window(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA, dtype=torch.float64,
                    device=None) -> torch.Tensor:
    """(size, size) weights w(x, y) ∝ exp(-(x² + y²) / (2 sigma²)) centred on the middle pixel, summing to 1."""
    offsets = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2
    g = torch.exp(-offsets.square() / (2 * sigma ** 2))
    g = g / g.sum()
    return torch.outer(g, g)


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    """(H, W) -> (1, 1, H, W); (C, H, W) -> (1, C, H, W); (B, C, H, W) unchanged."""
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[None]
    if x.dim() == 4:
        return x
    raise ValueError(f"expected an image of 2, 3 or 4 dimensions, got shape {tuple(x.shape)}")


def ssim_map(a: torch.Tensor, b: torch.Tensor, data_range: float = 255.0, window: int = SSIM_WINDOW,
             sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """Per-window SSIM, (B, C, H - window + 1, W - window + 1): every channel on its own.

    With Gaussian-weighted local statistics (w the window, * a 'valid' correlation):
        mu_a = w * a,   sigma_a^2 = w * a^2 - mu_a^2,   sigma_ab = w * (a b) - mu_a mu_b
        SSIM = (2 mu_a mu_b + C1)(2 sigma_ab + C2) / ((mu_a^2 + mu_b^2 + C1)(sigma_a^2 + sigma_b^2 + C2))
    with C1 = (K1 L)^2, C2 = (K2 L)^2, L = data_range. Images smaller than the window use the largest odd window
    that fits (the statistic then averages fewer pixels; documented rather than refused).
    """
    a, b = _pair(a, b)
    a, b = _as_batch(a), _as_batch(b)
    size = min(window, a.shape[-1], a.shape[-2])
    size -= 1 - size % 2  # odd, so the window has a centre pixel
    channels = a.shape[1]
    w = gaussian_window(size, sigma, device=a.device).expand(channels, 1, size, size)

    def local_mean(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, groups=channels)  # depthwise: one window per channel, no padding ('valid')

    mu_a, mu_b = local_mean(a), local_mean(b)
    var_a = local_mean(a * a) - mu_a.square()
    var_b = local_mean(b * b) - mu_b.square()
    cov = local_mean(a * b) - mu_a * mu_b
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    return ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a.square() + mu_b.square() + c1) * (var_a + var_b + c2))


def ssim(a: torch.Tensor, b: torch.Tensor, data_range: float = 255.0) -> float:
    """Mean SSIM (Wang et al. 2004, 11x11 Gaussian window, sigma 1.5, K1 = 0.01, K2 = 0.03) of every channel,
    averaged over channels and images: 1 for identical images, lower as they differ. See `ssim_map`."""
    return ssim_map(a, b, data_range).mean().item()
