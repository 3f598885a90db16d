"""kernels/group_norm_reference.py, the yardstick every GroupNorm kernel test measures against: torch's own GroupNorm
and SiLU composed by hand, at every fusion, and steadier than F.group_norm where the mean dwarfs the spread."""

import torch
import torch.nn.functional as F

from sdaccel.kernels.fp8 import quantize_e4m3_reference
from sdaccel.kernels.group_norm_reference import group_norm_reference

CL = torch.channels_last


def _inputs(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    N, C = shape[:2]
    x = (torch.randn(shape, generator=g) * 1.5 + 0.3).double()
    return x, (1 + 0.5 * torch.randn(C, generator=g)).double(), (0.5 * torch.randn(C, generator=g)).double(), \
        torch.randn(N, C, generator=g).double()


def test_matches_torch_at_every_fusion():
    """In fp64, against F.group_norm of the same sum: skip, add, SiLU, output_scale, and the concatenation."""
    x, w, b, add = _inputs((2, 64, 5, 7))
    skip = torch.randn_like(x)
    s = x + skip + add[:, :, None, None]
    want = F.silu(F.group_norm(s, 8, w, b, 1e-5)) * 0.25
    y, got_s = group_norm_reference(x, 8, w, b, silu=True, add=add, skip=skip, return_sum=True, output_scale=0.25)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_s, s, rtol=0, atol=0)
    torch.testing.assert_close(group_norm_reference(x, 8), F.group_norm(x, 8), rtol=1e-12, atol=1e-12)

    left, right = x[:, :24], x[:, 24:]
    y, s = group_norm_reference(left, 8, w, b, concat=right, return_sum=True)
    torch.testing.assert_close(y, F.group_norm(x, 8, w, b, 1e-5), rtol=1e-12, atol=1e-12)
    assert torch.equal(s, x) and y.is_contiguous(memory_format=CL)


def test_keeps_the_memory_format_and_rounds_once():
    x, w, b, _ = _inputs((2, 32, 4, 6), seed=1)
    assert group_norm_reference(x, 8, w, b).is_contiguous()
    assert group_norm_reference(x.contiguous(memory_format=CL), 8, w, b).is_contiguous(memory_format=CL)
    half = x.half()
    y = group_norm_reference(half, 8, w.half(), b.half(), silu=True)
    want = F.silu(F.group_norm(half.double(), 8, w.half().double(), b.half().double()))
    assert y.dtype == torch.float16
    # Computed in fp32 and rounded to fp16 once: within half an fp16 unit in the last place of the exact value.
    torch.testing.assert_close(y.double(), want, rtol=2.0 ** -11, atol=2.0 ** -24)


def test_variance_is_two_pass():
    """mean 300, std 0.5 in fp32: within 2e-4 of fp64 (one pass, E[x^2] - mean^2, would lose every digit)."""
    g = torch.Generator().manual_seed(1)
    x = 300.0 + 0.5 * torch.randn(2, 64, 12, 12, generator=g)
    err = (group_norm_reference(x, 8, eps=1e-6).double() - group_norm_reference(x.double(), 8, eps=1e-6)).abs()
    assert err.max().item() < 2e-4


def test_e4m3_output_quantizes_the_fp32_result_and_records_amax():
    x, w, b, add = _inputs((2, 32, 4, 4), seed=2)
    x16 = x.half()
    w16, b16, add16 = w.half(), b.half(), add.half()
    s16 = x16 + add16[:, :, None, None]  # the sum is formed at x's dtype, the norm in fp32
    ref32 = group_norm_reference(s16.float(), 8, w16.float(), b16.float(), silu=True, output_scale=0.5)
    e4m3_scale, amax = torch.tensor([0.01]), torch.zeros(1)
    q = group_norm_reference(x16, 8, w16, b16, silu=True, add=add16, output_scale=0.5, e4m3_scale=e4m3_scale,
                             e4m3_amax=amax)
    assert q.dtype == torch.float8_e4m3fn
    assert torch.equal(q.float(), quantize_e4m3_reference(ref32, e4m3_scale).float())
    assert amax.item() == ref32.abs().max().item()
