"""Attention over a short key sequence: the UNet's cross-attention (77 text tokens) in one pass.

    out[b, h] = softmax(q[b, h] k[b, h]^T * scale) v[b, h]        q: (B, H, Lq, d), k, v: (B, H, Lk, d)

With Lk <= 128 every key and value of a (batch, head) fits in one program's tile, so the softmax needs no
online rescaling: each program loads a block of queries and all keys, forms the whole score tile, normalizes
it in fp32 and multiplies by v. General kernels (FlashAttention, CUTLASS memory-efficient) are built for long
key sequences; at Lk = 77 they spend most of their time on bookkeeping, while this pass is bound by reading q
and writing the output. The attention engine times it against them per shape and keeps it only where it wins.

Inputs are any (B, H, L, d) views whose last dimension is dense, e.g. head-split views of packed QKV/KV
projections. The output is (B, H, Lq, d) backed by (B, Lq, H, d) memory, so merging heads afterwards
(transpose(1, 2).reshape) is free.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ._triton import next_pow2, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None

MAX_KEYS = 128  # the whole key/value block of one head is one tile
MAX_HEAD_DIM = 128


# ---------------------------------------------------------------- reference

def short_kv_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 scale: Optional[float] = None) -> torch.Tensor:
    """softmax(q k^T * scale) v in fp32, rounded once to q's dtype; what the tests trust."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale)
    return out.to(q.dtype)


# ------------------------------------------------------------------- kernel

if triton is not None:

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["Lq"])
    def _short_kv_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr,
        Lq, Lk, H, scale,
        stride_qb, stride_qh, stride_ql,
        stride_kb, stride_kh, stride_kl,
        stride_vb, stride_vh, stride_vl,
        stride_ob, stride_oh, stride_ol,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        m_ok = offs_m < Lq
        n_ok = offs_n < Lk

        q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_ql + offs_d[None, :],
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kl + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vl + offs_d[None, :],
                    mask=kv_mask, other=0.0)

        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BLOCK_M, BLOCK_N), fp32 accumulation
        s = tl.where(n_ok[None, :], s, float("-inf"))
        p = tl.exp(s - tl.max(s, axis=1)[:, None])
        denom = tl.sum(p, axis=1)
        o = tl.dot(p.to(v.dtype), v, input_precision=PRECISION) / denom[:, None]
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ol + offs_d[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


# ----------------------------------------------------------------- launcher

def qkv_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """What no attention kernel here takes (None: fine): not (B, H, L, d), mismatched shapes, no keys, a head dim
    that is not dense, mixed or unsupported dtypes. Each kernel's `supports` adds its own limits."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "expects (B, H, L, d) tensors"
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        return f"mismatched shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}"
    if k.shape[2] == 0:
        return "no keys"
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "the head dim must be dense"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not (q.dtype == k.dtype == v.dtype):
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    return None


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the kernel cannot take these inputs (None: it can)."""
    problem = qkv_problem(q, k, v)
    if problem:
        return problem
    if k.shape[2] > MAX_KEYS:
        return f"{k.shape[2]} keys (at most {MAX_KEYS})"
    if q.shape[-1] > MAX_HEAD_DIM:
        return f"head dim {q.shape[-1]} (at most {MAX_HEAD_DIM})"
    return None


def short_kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       scale: Optional[float] = None, *, block_m: int = 64, num_warps: int = 4) -> torch.Tensor:
    """softmax(q k^T * scale) v with at most MAX_KEYS keys; raises ValueError for inputs it does not take."""
    reason = supports(q, k, v)
    if reason:
        raise ValueError(f"short_kv_attention: {reason}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if not use_triton(q):
        return short_kv_attention_reference(q, k, v, scale)
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    out = torch.empty(B, Lq, H, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    grid = (triton.cdiv(Lq, block_m), B * H)
    _short_kv_attention_kernel[grid](
        q, k, v, out, Lq, Lk, H, scale,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=max(16, next_pow2(Lk)), BLOCK_D=max(16, next_pow2(d)),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 inputs: no silent TF32 rounding
        num_warps=num_warps,
    )
    return out
