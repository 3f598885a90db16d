"""softmax_rows: fp32 scores in, probabilities out in a narrower dtype, as torch's fp32 softmax rounded once."""

import pytest
import torch

from sdaccel.kernels.softmax import MAX_COLS, softmax_rows, softmax_rows_reference


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(3, 300), (2, 2, 77), (1, 1), (5, 1024)], ids=str)
def test_softmax_rows_matches_fp32_softmax_rounded_once(shape, out_dtype, device):
    g = torch.Generator().manual_seed(0)
    x = (4 * torch.randn(shape, generator=g)).to(device)
    out = softmax_rows(x, out_dtype)
    assert out.dtype == out_dtype and out.shape == x.shape
    want = softmax_rows_reference(x, out_dtype)
    # Both round the same fp32 values once; exp's last bit may differ between Triton and torch.
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[out_dtype]
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol * 1e-2)


def test_softmax_rows_stays_finite_far_from_zero(device):
    """Scores in the tens of thousands (an attention that picks one key) and a row of equal ones."""
    x = torch.tensor([[3.0e4, -3.0e4, 2.9e4, 0.0], [-5e4, -5e4, -5e4, -5e4]], device=device)
    out = softmax_rows(x, torch.float16).float()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, softmax_rows_reference(x, torch.float16).float())
    torch.testing.assert_close(out[1], torch.full((4,), 0.25, device=device))


def test_softmax_rows_reads_a_strided_input(device):
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(1)).to(device).t()  # not contiguous
    torch.testing.assert_close(softmax_rows(x, torch.float32), softmax_rows_reference(x, torch.float32))


@pytest.mark.parametrize("cols", [0, MAX_COLS + 1])
def test_softmax_rows_refuses_rows_it_cannot_hold(cols):
    with pytest.raises(ValueError, match=f"{cols} columns"):
        softmax_rows(torch.zeros(2, cols))
