"""The transformer feed-forward's first half in one kernel: GEMM, bias and GEGLU.

    h   = x @ W^T + b                 x: (M, K), W: (2D, K) as nn.Linear stores it, b: (2D,)
    out = h[:, :D] * gelu(h[:, D:])   (M, D)

Unfused, the GEMM writes h (2D wide) and kernels/geglu.py reads it back: at SD1.5's 64x64 level with CFG batch 16
that is 335 MB written and read again per block, for an output half that size. Here each program computes the
value tile (columns j of W) and the matching gate tile (columns D + j) of the same rows with two accumulators,
and only the gated product leaves the chip. Accumulation is fp32; h is never rounded to fp16 (the unfused path
rounds it once), so the result is at least as close to fp32 as the unfused one.

Whether this beats cuBLAS + the GEGLU kernel depends on the shape and GPU: the fast engine times both per shape
(engines/feed_forward.py) and keeps the faster.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import launchable, use_triton
from .geglu import geglu_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None
else:
    from .geglu import gelu


def linear_geglu_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                           approximate: str = "none") -> torch.Tensor:
    """diffusers' GEGLU on a Linear, in plain torch at x's dtype: what the tests trust."""
    return geglu_reference(F.linear(x, weight), bias, approximate)


if triton is not None:

    @triton.jit
    def _linear_geglu_kernel(
        x_ptr, w_ptr, b_ptr, out_ptr,
        M, D, K,
        stride_xm, stride_wn, stride_om,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, TANH: tl.constexpr,
    ):
        # Grouped program order: GROUP_M row tiles share each weight tile while it is in L2.
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(D, BLOCK_N)
        per_group = GROUP_M * num_n
        first_m = (pid // per_group) * GROUP_M
        group_rows = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % group_rows
        pid_n = (pid % per_group) // group_rows

        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm < M
        n_ok = rn < D
        x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
        value_ptrs = w_ptr + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]  # (BLOCK_K, BLOCK_N) of W^T
        gate_ptrs = value_ptrs + D * stride_wn
        acc_value = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            if EVEN_K:
                a = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
                wv = tl.load(value_ptrs, mask=n_ok[None, :], other=0.0)
                wg = tl.load(gate_ptrs, mask=n_ok[None, :], other=0.0)
            else:
                k_ok = (k + rk) < K
                a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                wv = tl.load(value_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                wg = tl.load(gate_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc_value = tl.dot(a, wv, acc_value)
            acc_gate = tl.dot(a, wg, acc_gate)
            x_ptrs += BLOCK_K
            value_ptrs += BLOCK_K
            gate_ptrs += BLOCK_K

        if HAS_BIAS:
            acc_value += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            acc_gate += tl.load(b_ptr + D + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = (acc_value * gelu(acc_gate, TANH)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :], out,
                 mask=m_ok[:, None] & n_ok[None, :])


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): two 128x128 fp32 accumulators are 128 registers per thread at
# 8 warps; the smaller tiles are for few rows (cross-attention-sized M) or small GPUs.
CONFIGS = ((128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 3))


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Shapes and dtypes the kernel takes: 2-D-able x with K contiguous, fp16/bf16 on both sides."""
    return (x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype and weight.dim() == 2
            and weight.shape[0] % 2 == 0 and x.shape[-1] == weight.shape[1] and weight.stride(1) == 1
            and weight.shape[1] >= 16)


def linear_geglu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 approximate: str = "none", config: tuple[int, int, int, int, int] = CONFIGS[0]) -> torch.Tensor:
    """(x @ W^T + b) split in value | gate, value * gelu(gate); x (..., K), W (2D, K) -> (..., D).

    ``config``: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), one of CONFIGS or any other; the fast engine
    times CONFIGS per shape. Falls back to the reference where Triton cannot run on x.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if not supports(x, weight):
        raise ValueError(f"linear_geglu takes fp16/bf16 x (..., K) and W (2D, K) of the same dtype; got x "
                         f"{tuple(x.shape)} {x.dtype}, W {tuple(weight.shape)} {weight.dtype}")
    if not use_triton(x):
        return linear_geglu_reference(x, weight, bias, approximate)
    K = x.shape[-1]
    D = weight.shape[0] // 2
    x2 = x.reshape(-1, K)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = x.new_empty((*x.shape[:-1], D))
    block_m, block_n, block_k, num_warps, num_stages = config
    grid = (triton.cdiv(M, block_m) * triton.cdiv(D, block_n),)
    launchable(_linear_geglu_kernel, False)[grid](
        x2, weight, bias if bias is not None else weight, out,
        M, D, K, x2.stride(0), weight.stride(0), D,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
        EVEN_K=K % block_k == 0, HAS_BIAS=bias is not None, TANH=approximate == "tanh",
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
