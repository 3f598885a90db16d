"""PSNR, SSIM, max |diff| and relative error on inputs whose answer is known by construction or by hand."""

from __future__ import annotations

import math

import pytest
import torch

from sdaccel.quality.metrics import gaussian_window, max_abs_diff, psnr, relative_error, ssim, ssim_map


def textured(size: int = 128, seed: int = 0) -> torch.Tensor:
    """A (3, size, size) uint8 image with gradients and mid-frequency texture, values well inside 0..255."""
    g = torch.Generator().manual_seed(seed)
    y, x = torch.meshgrid(torch.arange(size, dtype=torch.float64), torch.arange(size, dtype=torch.float64),
                          indexing="ij")
    base = 60 + 60 * x / size + 40 * torch.sin(y / 7) * torch.cos(x / 11)
    channels = torch.stack([base, base.flip(0), base.flip(1)]) + 10 * torch.rand(3, size, size, generator=g,
                                                                                  dtype=torch.float64)
    return channels.round().clamp(0, 255).to(torch.uint8)


def add_noise(image: torch.Tensor, sigma: float, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    noisy = image.double() + sigma * torch.randn(image.shape, generator=g, dtype=torch.float64)
    return noisy.round().clamp(0, 255).to(torch.uint8)


def test_identical_images_psnr_inf_ssim_one_diff_zero():
    image = textured()
    assert psnr(image, image.clone()) == math.inf
    assert ssim(image, image.clone()) == pytest.approx(1.0, abs=1e-12)
    assert max_abs_diff(image, image.clone()) == 0
    assert relative_error(image, image.clone()) == 0


def test_psnr_of_known_gaussian_noise():
    # Mid-grey, so neither tail clips: MSE = sigma^2 (+ 1/12 from rounding to integers, 0.015 dB at sigma 5).
    grey = torch.full((3, 256, 256), 128, dtype=torch.uint8)
    for sigma in (3.0, 5.0, 12.0):
        expected = 10 * math.log10(255 ** 2 / sigma ** 2)
        assert abs(psnr(add_noise(grey, sigma), grey) - expected) < 0.5, sigma


def test_psnr_by_hand():
    a = torch.zeros(4)
    b = torch.tensor([0.0, 0.0, 0.0, 255.0])
    # MSE = 255^2 / 4 -> PSNR = 10 log10(4)
    assert psnr(a, b) == pytest.approx(10 * math.log10(4), abs=1e-12)
    assert psnr(a, b / 255, data_range=1.0) == pytest.approx(10 * math.log10(4), abs=1e-12)


def test_ssim_decreases_as_noise_grows():
    image = textured()
    scores = [ssim(add_noise(image, sigma), image) for sigma in (1, 3, 8, 20, 50)]
    assert all(earlier > later for earlier, later in zip(scores, scores[1:])), scores
    assert scores[0] > 0.9 and scores[-1] < 0.5


def test_ssim_of_constant_images_is_the_luminance_term():
    # Flat images: every variance and covariance is 0, so the contrast-structure factor is C2/C2 = 1 and
    # SSIM = (2 mu_a mu_b + C1) / (mu_a^2 + mu_b^2 + C1) with C1 = (0.01 * 255)^2.
    a = torch.full((1, 32, 32), 100, dtype=torch.uint8)
    b = torch.full((1, 32, 32), 110, dtype=torch.uint8)
    c1 = (0.01 * 255) ** 2
    assert ssim(a, b) == pytest.approx((2 * 100 * 110 + c1) / (100 ** 2 + 110 ** 2 + c1), rel=1e-12)


def test_ssim_map_matches_an_explicit_window_loop():
    # Independent of the convolution: weighted statistics of every 11x11 window, computed one window at a time.
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, 256, (14, 15), generator=g).double()
    b = (a + 30 * torch.randn(14, 15, generator=g, dtype=torch.float64)).clamp(0, 255)
    w = gaussian_window()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    fast = ssim_map(a, b)[0, 0]
    assert fast.shape == (4, 5)
    for i in range(4):
        for j in range(5):
            pa, pb = a[i:i + 11, j:j + 11], b[i:i + 11, j:j + 11]
            ma, mb = (w * pa).sum(), (w * pb).sum()
            va, vb = (w * (pa - ma) ** 2).sum(), (w * (pb - mb) ** 2).sum()
            cov = (w * (pa - ma) * (pb - mb)).sum()
            expected = (2 * ma * mb + c1) * (2 * cov + c2) / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2))
            assert fast[i, j].item() == pytest.approx(expected.item(), rel=1e-9)


def test_gaussian_window_is_normalised_and_peaks_in_the_middle():
    w = gaussian_window()
    assert w.shape == (11, 11) and w.sum().item() == pytest.approx(1.0)
    assert w.argmax().item() == 5 * 11 + 5
    # Ratio between neighbours along an axis: exp(-(1^2 - 0^2) / (2 * 1.5^2))
    assert (w[5, 6] / w[5, 5]).item() == pytest.approx(math.exp(-1 / 4.5))


def test_relative_error_by_hand():
    a = torch.tensor([3.0, 4.0])
    b = torch.tensor([0.0, 5.0])
    assert relative_error(a, b) == pytest.approx(math.sqrt(10) / 5, rel=1e-15)  # ||(3, -1)|| / ||(0, 5)||
    assert relative_error(torch.ones(3), torch.zeros(3)) == math.inf
    assert math.isnan(relative_error(torch.tensor([float("nan"), 1.0]), torch.ones(2)))


def test_max_abs_diff_does_not_wrap_around_uint8():
    a = torch.zeros(2, 2, dtype=torch.uint8)
    b = torch.full((2, 2), 255, dtype=torch.uint8)
    b[0, 0] = 3
    assert max_abs_diff(a, b) == 255 and max_abs_diff(b, a) == 255


def test_batched_images_and_shape_mismatch():
    batch = torch.stack([textured(seed=0), textured(seed=1)])
    assert ssim(batch, batch) == pytest.approx(1.0)
    noisy = torch.stack([batch[0], add_noise(batch[1], 10)])
    # A batch's SSIM is the mean over its images: one identical image (1.0) and one noisy one.
    assert ssim(noisy, batch) == pytest.approx((1.0 + ssim(noisy[1], batch[1])) / 2)
    with pytest.raises(ValueError, match="shapes differ"):
        psnr(batch, batch[0])
