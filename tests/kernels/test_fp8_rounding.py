"""The e4m3 rounding the FP8-writing kernels share (kernels/fp8.py): the same values as torch's cast, also where
Triton's CPU interpreter's own cast is wrong (a rounding carry into the exponent, subnormals)."""

import pytest
import torch

from sdaccel.kernels.fp8 import E4M3, E4M3_MAX, check_fp8_output, quantize_e4m3_reference

triton = pytest.importorskip("triton")
tl = triton.language

from sdaccel.kernels.fp8 import record_amax, to_e4m3  # noqa: E402


@triton.jit
def _quantize_kernel(x_ptr, out_ptr, e4m3_scale_ptr, e4m3_amax_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(x_ptr + offs, mask=mask, other=0.0)
    record_amax(e4m3_amax_ptr, y[None, :], mask[None, :])
    tl.store(out_ptr + offs, to_e4m3(y, 1.0 / tl.load(e4m3_scale_ptr)), mask=mask)


def _quantize(x: torch.Tensor, scale: float):
    out = torch.empty(x.shape, dtype=E4M3, device=x.device)
    amax = torch.zeros(1, device=x.device)
    _quantize_kernel[(1,)](x, out, torch.tensor([scale], device=x.device), amax, x.numel(),
                           BLOCK=triton.next_power_of_2(x.numel()))
    return out, amax


def test_rounding_matches_torch_everywhere(device):
    g = torch.Generator().manual_seed(0)
    values = torch.cat([
        torch.randn(2000, generator=g) * 40,                      # the normal range, with carries (31.7 -> 32)
        torch.randn(1000, generator=g) * 0.01,                    # subnormals (below 2^-6) and their edge
        torch.tensor([0.0, -0.0, 448.0, -448.0, 470.0, 1e6, -1e6, 2.0 ** -6, 2.0 ** -10, 3 * 2.0 ** -10]),
        torch.tensor([1.0625, 1.1875, 17.0, 19.0, 2.0 ** -9 * 0.5, 2.0 ** -9 * 1.5]),  # ties: to even
    ])
    x = values.to(device)
    for scale in (1.0, 0.05):
        got, amax = _quantize(x, scale)
        want = (values / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        assert torch.equal(got.cpu().float(), want.float()), f"scale {scale}"  # -0 == +0: no sign of zero kept
        assert amax.item() == values.abs().max().item()


def test_reference_quantizes_and_records_amax():
    y = torch.tensor([[0.5, -900.0], [3.0, 0.25]])
    amax = torch.tensor([100.0])
    q = quantize_e4m3_reference(y, torch.tensor([2.0]), amax)
    assert q.dtype == E4M3 and q.float().tolist() == [[0.25, -448.0], [1.5, 0.125]]
    assert amax.item() == 900.0
    quantize_e4m3_reference(y[:1, :1], torch.tensor([1.0]), amax)
    assert amax.item() == 900.0  # a running maximum


def test_fp8_output_arguments_are_checked():
    x = torch.zeros(2, 3)
    assert not check_fp8_output(None, None, x)
    assert check_fp8_output(torch.ones(1), torch.zeros(1), x)
    with pytest.raises(ValueError, match="e4m3_amax without e4m3_scale"):
        check_fp8_output(None, torch.zeros(1), x)
    with pytest.raises(ValueError, match="e4m3_amax must be a 1-element float32"):
        check_fp8_output(torch.ones(1), None, x)
    with pytest.raises(ValueError, match="e4m3_scale must be a 1-element float32"):
        check_fp8_output(torch.ones(2), torch.zeros(1), x)
    with pytest.raises(ValueError, match="e4m3_scale must be a 1-element float32"):
        check_fp8_output(torch.ones(1, dtype=torch.float16), torch.zeros(1), x)
