"""The transformer feed-forward's first half in one kernel: GEMM, bias and GEGLU.

    h   = x @ W^T + b                 x: (M, K), W: (2D, K) as nn.Linear stores it, b: (2D,)
    out = h[:, :D] * gelu(h[:, D:])   (M, D)

Unfused, the GEMM writes h (2D wide) and kernels/geglu.py reads it back: at SD1.5's 64x64 level with CFG batch 16
that is 335 MB written and read again per block, for an output half that size. Here each program computes the
value tile (columns j of W) and the matching gate tile (columns D + j) of the same rows with two accumulators,
and only the gated product leaves the chip. Accumulation is fp32; h is never rounded to fp16 (the unfused path
rounds it once), so the result is at least as close to fp32 as the unfused one.

Two versions of the kernel:
  pointer  one program per output tile, operands loaded through pointers (any GPU Triton runs on);
  tma      Hopper and later: persistent (one program per SM walks the tiles), operands and the output moved by the
           Tensor Memory Accelerator, and the tile loop flattened into the K loop so the next tile's loads are
           issued while this tile's epilogue runs. At SD's K (320 to 1280: 5 to 20 K steps) a tile's load and
           store are a large part of its time; overlapping them is what cuBLAS does and the pointer kernel does not.

Whether this beats cuBLAS + the GEGLU kernel depends on the shape and GPU: the fast engine times both per shape
(engines/feed_forward.py) and keeps the faster.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import launchable, sm_count, use_triton
from .geglu import geglu_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None
else:
    from .geglu import gelu

try:  # host-side TMA descriptors: Triton 3.4+
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the pointer kernel only
    TensorDescriptor = None


def linear_geglu_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                           approximate: str = "none") -> torch.Tensor:
    """diffusers' GEGLU on a Linear, in plain torch at x's dtype: what the tests trust."""
    return geglu_reference(F.linear(x, weight), bias, approximate)


if triton is not None:

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["M"])
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


    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["M"])
    def _linear_geglu_tma_kernel(
        x_desc, value_desc, gate_desc, b_ptr, out_desc,
        M, D, K,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_PROGRAMS: tl.constexpr, HAS_BIAS: tl.constexpr, TANH: tl.constexpr, OUT_BF16: tl.constexpr,
    ):
        # value_desc / gate_desc are W's two halves, (D, K) each: TMA zero-fills past their ends, so a tile that
        # overhangs D reads zeros instead of the other half, and the output descriptor clips the store.
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(D, BLOCK_N)
        per_group = GROUP_M * num_n
        k_steps = tl.cdiv(K, BLOCK_K)
        for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=True):
            first_m = (tile // per_group) * GROUP_M
            group_rows = tl.minimum(num_m - first_m, GROUP_M)
            off_m = (first_m + (tile % per_group) % group_rows) * BLOCK_M
            off_n = ((tile % per_group) // group_rows) * BLOCK_N
            acc_value = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_steps):
                off_k = ki * BLOCK_K
                a = x_desc.load([off_m, off_k])
                acc_value = tl.dot(a, value_desc.load([off_n, off_k]).T, acc_value)
                acc_gate = tl.dot(a, gate_desc.load([off_n, off_k]).T, acc_gate)
            if HAS_BIAS:
                rn = off_n + tl.arange(0, BLOCK_N)
                n_ok = rn < D
                acc_value += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                acc_gate += tl.load(b_ptr + D + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            out = acc_value * gelu(acc_gate, TANH)
            out_desc.store([off_m, off_n], out.to(tl.bfloat16 if OUT_BF16 else tl.float16))


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): two 128x128 fp32 accumulators are 128 registers per thread at
# 8 warps; the smaller tiles are for few rows (cross-attention-sized M) or small GPUs.
CONFIGS = ((128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 3))


# The TMA kernel's: 8 warps (two warpgroups) share a 128-row tile's two accumulators; its stages hold the x tile and
# both weight tiles (48 KB per stage at 128x128x64, fp16), plus the output tile.
TMA_CONFIGS = ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (128, 64, 64, 8, 4),
               (64, 128, 64, 4, 4), (128, 128, 32, 8, 5))


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Shapes and dtypes the kernel takes: 2-D-able x with K contiguous, fp16/bf16 on both sides."""
    return (x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype and weight.dim() == 2
            and weight.shape[0] % 2 == 0 and x.shape[-1] == weight.shape[1] and weight.stride(1) == 1
            and weight.shape[1] >= 16)


def supports_tma(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the TMA kernel can take these: Triton with host descriptors, a Hopper-or-later GPU (or the
    interpreter), and 16-byte aligned rows and bases for x, W's two halves and the output."""
    if TensorDescriptor is None or not supports(x, weight):
        return False
    if x.is_cuda and torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    K, D = x.shape[-1], weight.shape[0] // 2
    per_16_bytes = 16 // x.element_size()
    row_stride = x.stride(-2) if x.dim() > 1 else K
    return (K % per_16_bytes == 0 and D % per_16_bytes == 0 and weight.stride(0) % per_16_bytes == 0
            and row_stride % per_16_bytes == 0 and weight.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 0)


def linear_geglu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 approximate: str = "none", config: tuple[int, int, int, int, int] = CONFIGS[0],
                 tma: bool = False) -> torch.Tensor:
    """(x @ W^T + b) split in value | gate, value * gelu(gate); x (..., K), W (2D, K) -> (..., D).

    ``config``: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), one of CONFIGS (TMA_CONFIGS with ``tma``) or
    any other; the fast engine times them per shape. ``tma``: the persistent TMA kernel (supports_tma() must
    hold). Falls back to the reference where Triton cannot run on x.
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
    if tma:
        if not supports_tma(x2, weight):
            raise ValueError(f"linear_geglu(tma=True) needs Triton's TensorDescriptor, a Hopper or later GPU and "
                             f"16-byte aligned rows; got x {tuple(x.shape)}, W {tuple(weight.shape)}")
        _launch_tma(x2, weight, bias, out.view(M, D), approximate, config)
        return out
    grid = (triton.cdiv(M, block_m) * triton.cdiv(D, block_n),)
    launchable(_linear_geglu_kernel, False)[grid](
        x2, weight, bias if bias is not None else weight, out,
        M, D, K, x2.stride(0), weight.stride(0), D,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
        EVEN_K=K % block_k == 0, HAS_BIAS=bias is not None, TANH=approximate == "tanh",
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def _launch_tma(x2, weight, bias, out2, approximate, config):
    M, K = x2.shape
    D = weight.shape[0] // 2
    block_m, block_n, block_k, num_warps, num_stages = config
    tiles = triton.cdiv(M, block_m) * triton.cdiv(D, block_n)
    programs = min(tiles, sm_count(x2))
    launchable(_linear_geglu_tma_kernel, False)[(programs,)](
        TensorDescriptor.from_tensor(x2, [block_m, block_k]),
        TensorDescriptor.from_tensor(weight[:D], [block_n, block_k]),
        TensorDescriptor.from_tensor(weight[D:], [block_n, block_k]),
        bias if bias is not None else weight,
        TensorDescriptor.from_tensor(out2, [block_m, block_n]),
        M, D, K,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, NUM_PROGRAMS=programs,
        HAS_BIAS=bias is not None, TANH=approximate == "tanh", OUT_BF16=x2.dtype == torch.bfloat16,
        num_warps=num_warps, num_stages=num_stages,
    )
