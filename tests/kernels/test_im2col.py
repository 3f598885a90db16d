"""im2col: the Triton kernel copies exactly what the torch reference gathers, and a GEMM on either matrix with the
channels_last weight is the convolution."""

import pytest
import torch
import torch.nn.functional as F

from sdaccel.kernels.im2col import im2col, im2col_reference


def _x(shape, dtype, device, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape,kernel,stride,pad", [
    ((2, 40, 8, 8), 3, 1, 1),     # SD1.5's 8x8 level, fewer channels
    ((1, 300, 5, 7), 3, 1, 1),    # channels past one 256-wide block, not a power of two; non-square
    ((3, 24, 9, 6), 3, 2, 1),     # a downsampler's stride 2
    ((2, 16, 6, 6), 3, 1, 0),     # no padding
    ((2, 33, 4, 4), 1, 1, 0),     # 1x1
], ids=str)
def test_im2col_matches_reference_and_convolution(shape, kernel, stride, pad, dtype, device):
    x = _x(shape, dtype, device)
    cols = im2col(x, kernel, stride, pad)
    torch.testing.assert_close(cols, im2col_reference(x, kernel, stride, pad), rtol=0, atol=0)  # a pure copy
    # The GEMM with the weight's channels_last memory as a (Cout, k*k*C) matrix is the convolution.
    cout = 5
    w = torch.randn(cout, shape[1], kernel, kernel, generator=torch.Generator().manual_seed(1))
    w = w.contiguous(memory_format=torch.channels_last)
    out = cols.float().cpu() @ w.permute(0, 2, 3, 1).reshape(cout, -1).t()
    want = F.conv2d(x.float().cpu(), w, None, stride, pad).permute(0, 2, 3, 1).reshape(-1, cout)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_im2col_refuses_other_layouts(device):
    x = torch.randn(1, 8, 4, 4, device=device)  # contiguous NCHW, 8 channels: not channels_last memory
    with pytest.raises(ValueError, match="channels_last"):
        im2col(x, 3, 1, 1)
