"""im2col on channels_last activations: the patches of a k x k convolution as rows of one matrix.

    cols[(n, oh, ow), (kh, kw, c)] = x[n, c, oh * stride - pad + kh, ow * stride - pad + kw]   (0 outside x)

Columns are ordered (kh, kw, c), which is the memory order of a channels_last weight (Cout, kh, kw, Cin): the
convolution is then one GEMM, cols @ weight.view(Cout, -1).T, and the result is already NHWC. This pays where
cuDNN's implicit GEMM leaves the GPU idle: SD1.5's 8x8 level at CFG batch 2 is a 128 x 11520 x 1280 problem,
few output tiles for 132 SMs, which cuBLAS splits along K and cuDNN does not (benchmarks/kernels/bench_conv.py).
The engine's convolution pick (engines/fast/convolution.py) times both per shape. Used by the fast engine only, never
traced by torch.compile, so no torch.library op is registered.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton import next_pow2, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None


def output_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


# ---------------------------------------------------------------- reference

def im2col_reference(x: torch.Tensor, kernel: int, stride: int = 1, pad: int = 0) -> torch.Tensor:
    """(N, C, H, W) -> (N * Ho * Wo, kernel * kernel * C) with torch ops (a padded copy, then a strided gather)."""
    n, c, h, w = x.shape
    nhwc = F.pad(x.permute(0, 2, 3, 1), (0, 0, pad, pad, pad, pad)) if pad else x.permute(0, 2, 3, 1)
    ho, wo = output_size(h, kernel, stride, pad), output_size(w, kernel, stride, pad)
    s_n, s_h, s_w, s_c = nhwc.stride()
    patches = nhwc.as_strided((n, ho, wo, kernel, kernel, c), (s_n, stride * s_h, stride * s_w, s_h, s_w, s_c))
    return patches.reshape(n * ho * wo, kernel * kernel * c)


# ------------------------------------------------------------------- kernel

if triton is not None:

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["rows", "H", "W", "Ho", "Wo"])
    def _im2col_kernel(
        x_ptr, out_ptr,
        rows, H, W, C, Ho, Wo,
        stride_n, stride_h, stride_w,
        KERNEL: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # One program: BLOCK_P output positions x BLOCK_C channels of one tap (kh, kw).
        tap = tl.program_id(1)
        kh = tap // KERNEL
        kw = tap % KERNEL
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        n = p // (Ho * Wo)
        r = p % (Ho * Wo)
        ih = (r // Wo) * STRIDE - PAD + kh
        iw = (r % Wo) * STRIDE - PAD + kw
        row_ok = p < rows
        inside = row_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        c_ok = c < C
        src = n.to(tl.int64) * stride_n + ih * stride_h + iw * stride_w
        v = tl.load(x_ptr + src[:, None] + c[None, :], mask=inside[:, None] & c_ok[None, :], other=0.0)
        dst = p.to(tl.int64)[:, None] * (KERNEL * KERNEL * C) + tap * C + c[None, :]
        tl.store(out_ptr + dst, v, mask=row_ok[:, None] & c_ok[None, :])


# ----------------------------------------------------------------- launcher

def im2col(x: torch.Tensor, kernel: int, stride: int = 1, pad: int = 0, *, block_p: int = 16,
           num_warps: int = 4) -> torch.Tensor:
    """(N, C, H, W) channels_last -> (N * Ho * Wo, kernel * kernel * C); other layouts raise ValueError."""
    if x.dim() != 4 or not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("im2col: expects a channels_last (N, C, H, W) tensor")
    if not use_triton(x):
        return im2col_reference(x, kernel, stride, pad)
    n, c, h, w = x.shape
    ho, wo = output_size(h, kernel, stride, pad), output_size(w, kernel, stride, pad)
    rows = n * ho * wo
    out = torch.empty(rows, kernel * kernel * c, dtype=x.dtype, device=x.device)
    block_c = min(256, next_pow2(c))
    grid = (triton.cdiv(rows, block_p), kernel * kernel, triton.cdiv(c, block_c))
    _im2col_kernel[grid](
        x, out, rows, h, w, c, ho, wo, x.stride(0), x.stride(2), x.stride(3),
        KERNEL=kernel, STRIDE=stride, PAD=pad, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=num_warps,
    )
    return out
