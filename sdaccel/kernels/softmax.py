"""Softmax over the last axis of fp32 scores, written in a narrower dtype: one read of the scores, one write.

    out[..., j] = exp(x[..., j] - max(x[...])) / sum(exp(x[...] - max(x[...])))      in fp32, out in out_dtype

engines/fast/attention.py's matmul_softmax_attention needs it: cuBLAS writes q k^T in fp32 (rounded to fp16 the scores
gave 2-7x SDPA's error at the VAE decoder's attention, on an H200), and PyTorch's softmax writes its input's dtype, so
fp16 probabilities for the p @ v GEMM would cost a softmax in fp32 and a cast: 14 bytes of traffic a score where this
kernel takes 6 (on an H200 it runs at the speed of a plain fp32 -> fp16 copy). One program takes one row and holds it in
registers, up to MAX_COLS values (a 2048x2048 image's decoder: 65536 keys). Compiled for sm_90a with Triton 3.6
(offline), 16 warps hold 32768 values at 128 registers a thread without spilling; 65536 spills 464 bytes a thread (216
at 32 warps). The launch rule was timed up to 16384 only.
"""

from __future__ import annotations

import torch

from ._triton import next_pow2, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None

MAX_COLS = 1 << 16


# ---------------------------------------------------------------- reference

def softmax_rows_reference(x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return torch.softmax(x.float(), dim=-1).to(out_dtype)


# ------------------------------------------------------------------- kernel

if triton is not None:

    # One program a row: the row count is the grid's, never the kernel's (no recompile per batch or resolution).
    @triton.jit
    def _softmax_rows_kernel(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * cols + offs, mask=mask, other=float("-inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))  # the masked tail: exp(-inf) = 0
        p = e / tl.sum(e, axis=0)
        tl.store(out_ptr + row * cols + offs, p.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------- launcher

def softmax_rows(x: torch.Tensor, out_dtype: torch.dtype = torch.float16, *,
                 num_warps: int | None = None) -> torch.Tensor:
    """softmax over x's last axis (any float dtype, computed in fp32), as a new tensor of out_dtype. num_warps:
    the launch's (None: the rule below). Raises ValueError past MAX_COLS columns or for an empty last axis."""
    cols = x.shape[-1] if x.dim() else 0
    if not 0 < cols <= MAX_COLS:
        raise ValueError(f"softmax_rows: {cols} columns (1 to {MAX_COLS})")
    if not use_triton(x):
        return softmax_rows_reference(x, out_dtype)
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rows = x.numel() // cols
    if rows:
        block = next_pow2(cols)
        # 16 values a thread up to 8192 columns, then 16 warps (32 values a thread at SDXL's 16384 keys).
        num_warps = num_warps or max(1, min(16, block // 512))
        _softmax_rows_kernel[(rows,)](x, out, cols, BLOCK=block, num_warps=num_warps)
    return out
