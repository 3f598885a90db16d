"""Nearest-neighbour 2x upsampling of channels_last activations (the UNet's and VAE's Upsample2D, before its conv).

    out[n, c, 2h + i, 2w + j] = x[n, c, h, w]          i, j in {0, 1}

Each program reads a tile of pixels x channels once and writes it to its four output positions, every access
contiguous along the channels. PyTorch's NHWC kernel computes a source index per output element: on an H100 the
SD1.5 VAE decoder's three upsamplings took 0.69 ms of its 7.0 ms at batch 1 (0.3 TB/s for 270 MB of traffic).
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


# ---------------------------------------------------------------- reference

def upsample_nearest2x_reference(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=2.0, mode="nearest").contiguous(memory_format=torch.channels_last)


# ------------------------------------------------------------------- kernel

if triton is not None:

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["pixels", "H", "W"])
    def _upsample_nearest2x_kernel(
        x_ptr, out_ptr, pixels, H, W, C,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (p < pixels)[:, None] & (c < C)[None, :]
        v = tl.load(x_ptr + p[:, None] * C + c[None, :], mask=mask)
        n = p // (H * W)
        r = p % (H * W)
        h = r // W
        w = r % W
        top = (n * (2 * H) + 2 * h) * (2 * W) + 2 * w  # output pixel (2h, 2w); the others follow
        for i in tl.static_range(2):
            for j in tl.static_range(2):
                dst = (top + i * (2 * W) + j) * C
                tl.store(out_ptr + dst[:, None] + c[None, :], v, mask=mask)


# ----------------------------------------------------------------- launcher

def upsample_nearest2x(x: torch.Tensor, *, block_p: int = 32, num_warps: int = 4) -> torch.Tensor:
    """(N, C, H, W) channels_last -> (N, C, 2H, 2W) channels_last; other layouts take the reference."""
    if x.dim() != 4 or not x.is_contiguous(memory_format=torch.channels_last) or not use_triton(x):
        return upsample_nearest2x_reference(x)
    n, c, h, w = x.shape
    out = torch.empty((n, c, 2 * h, 2 * w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    block_c = min(128, next_pow2(c))
    grid = (triton.cdiv(n * h * w, block_p), triton.cdiv(c, block_c))
    _upsample_nearest2x_kernel[grid](x, out, n * h * w, h, w, c, BLOCK_P=block_p, BLOCK_C=block_c,
                                     num_warps=num_warps)
    return out
