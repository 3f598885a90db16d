"""Convolutions through cuDNN or, where it times faster for the shape, one cuBLAS GEMM.

  "cudnn"  F.conv2d on the channels_last activation (cuDNN's implicit GEMM, autotuned by benchmark mode)
  "gemm"   a 1x1 convolution is a GEMM on the NHWC activation as it is; a k x k one a GEMM on its im2col matrix
           (kernels/im2col.py). The weight, channels_last, is already the (Cout, k*k*Cin) matrix: no copy

cuDNN wins wherever the output is large. At SD1.5's 8x8 level at CFG batch 2 a 3x3 convolution is a 128 x 11520 x
1280 problem: cuDNN leaves most of an H100's 132 SMs idle (23 us in the UNet), cuBLAS splits K (15 us) and the
im2col copy is 3 MB (benchmarks/kernels/bench_conv.py). The first call with a new shape times both from CUDA-graph
replays and keeps the faster correct one (kernel_pick.py), by name, so the engine cache can store it. Shapes whose
output or im2col matrix would pass MAX_PICK_BYTES are not tried (cuDNN wins there, and timing costs memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.im2col import im2col, output_size
from ..kernels.precompile import is_recording
from .kernel_pick import ShapePicks

CUDNN, GEMM = "cudnn", "gemm"
MAX_PICK_BYTES = 16 * 2**20
_PICKS = ShapePicks(CUDNN, enabled=True, weights=(1,))


def set_autotune(enabled: bool) -> None:
    """False: always cuDNN (the engine's `conv="cudnn"`)."""
    _PICKS.enabled = enabled


def cudnn_conv(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    return F.conv2d(x, weight, None, stride, padding)


def _gemm_layout(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """channels_last input and weight: the GEMM reads both as matrices without a copy."""
    return weight.permute(0, 2, 3, 1).is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def gemm_conv(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    """The convolution (no bias) as one GEMM; the result is a channels_last (N, Cout, Ho, Wo) tensor."""
    n, c, h, w = x.shape
    cout, _, k, _ = weight.shape
    w_nhwc = weight.permute(0, 2, 3, 1)
    if not _gemm_layout(x, weight):
        raise ValueError("gemm_conv: needs channels_last input and weight")
    ho, wo = output_size(h, k, stride, padding), output_size(w, k, stride, padding)
    if k == 1 and stride == 1 and padding == 0:
        cols = x.permute(0, 2, 3, 1).reshape(n * h * w, c)  # a view: NHWC memory is the token matrix
    else:
        cols = im2col(x, k, stride, padding)
    out = cols @ w_nhwc.reshape(cout, k * k * c).t()
    return out.view(n, ho, wo, cout).permute(0, 3, 1, 2)


_KERNELS = {CUDNN: cudnn_conv, GEMM: gemm_conv}


def gemm_may_pay(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> bool:
    """Whether the GEMM path is worth timing: only for small outputs (and im2col matrices). The GEMM wins where a
    convolution is too small to fill the GPU, and timing keeps the reference output and a candidate's alive at
    once: on the VAE's 512x512 convolutions that was 1 GB above the first image's peak at batch 8."""
    n, c, h, w = x.shape
    cout, k = weight.shape[0], weight.shape[-1]
    rows = n * output_size(h, k, stride, padding) * output_size(w, k, stride, padding)
    columns = rows * k * k * c if k > 1 else 0
    return max(rows * cout, columns) * x.element_size() <= MAX_PICK_BYTES


def conv2d(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """A square, ungrouped, undilated convolution without bias, through the path picked for its shape."""
    # Picks are made only while cuDNN autotunes (benchmark mode): the graph warm-up's first run, on cuDNN's
    # heuristics, would otherwise time cuDNN at an algorithm it is about to replace. A dry run recording Triton
    # kernels (no benchmark mode there) goes on to the pick, which then runs both paths and chooses nothing.
    # The picks are keyed by shape: a tensor of a picked shape in another layout (NCHW) takes cuDNN, which the GEMM
    # path could only match by copying it.
    if not (x.is_cuda and _PICKS.enabled and (torch.backends.cudnn.benchmark or is_recording()) and x.dim() == 4
            and weight.shape[-1] == weight.shape[-2] and _gemm_layout(x, weight)
            and gemm_may_pay(x, weight, stride, padding)):
        return cudnn_conv(x, weight, stride, padding)
    key = (f"x{list(x.shape)} w{list(weight.shape)} s{stride} p{padding} "
           f"{str(x.dtype).removeprefix('torch.')}")
    args = (x, weight, stride, padding)
    return _KERNELS[_PICKS.choose(key, args, lambda: _KERNELS)](*args)


def chosen_paths() -> dict[str, str]:
    return _PICKS.chosen()


def restore_paths(choices: dict[str, str]) -> None:
    _PICKS.restore(choices, set(_KERNELS))
