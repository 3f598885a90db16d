"""Nearest 2x upsampling: the Triton kernel writes exactly what F.interpolate does, in channels_last memory."""

import pytest
import torch

from sdaccel.kernels.upsample import upsample_nearest2x, upsample_nearest2x_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 40, 8, 8), (1, 300, 5, 7), (3, 3, 4, 1)], ids=str)
def test_upsample_matches_interpolate(shape, dtype, device):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    out = upsample_nearest2x(x)
    assert out.shape == (shape[0], shape[1], 2 * shape[2], 2 * shape[3])
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, upsample_nearest2x_reference(x), rtol=0, atol=0)  # a pure copy


def test_other_layouts_take_the_reference(device):
    x = torch.randn(1, 8, 3, 3, device=device)  # NCHW memory
    torch.testing.assert_close(upsample_nearest2x(x), upsample_nearest2x_reference(x), rtol=0, atol=0)
