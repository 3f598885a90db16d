"""Attention over a long key sequence (the UNet's self-attention), FlashAttention-style, for SD's head dims.

    out[b, h] = softmax(q[b, h] k[b, h]^T * scale) v[b, h]        q: (B, H, Lq, d), k, v: (B, H, Lk, d)

Each program takes BLOCK_M queries of one (batch, head) and walks the keys BLOCK_N at a time with an online
softmax: a running row max m and row sum l (fp32), and an fp32 accumulator rescaled by exp(m_old - m_new)
whenever the max grows, so the (Lq, Lk) score matrix never leaves the chip. Exponentials are base 2: scale *
log2(e) is folded into the scores, so each score costs one FMA and one exp2. The softmax is all fp32 (SD2.1 in
fp16 overflows otherwise); only p is rounded to v's dtype for the tensor-core p @ v.

Why another FlashAttention: SD1.5's head dims are 40, 80 and 160 (SD2/SDXL use 64). cuDNN and FlashAttention
pad the head dim to their tile sizes, 40 -> 64 (60% wasted tensor-core work) and 80 -> 128. Triton tiles
must be powers of two too, so the head dim is split in two power-of-two parts, D0 = the largest power of two
<= d (at least 16) and D1 = the rest rounded up to a power of two (at least 16; 0 when d == D0):

    40 -> 32 + 16 (48 computed, not 64)    80 -> 64 + 16    160 -> 128 + 32    64 -> 64 + 0    24 -> 16 + 16

and every product is done per part: S = q0 k0^T + q1 k1^T, acc0 += p v0, acc1 += p v1. Masked loads fill the
padding of the second part with zeros, which add nothing to S and are never stored; one padding column of v can
carry ones instead, so that the tensor cores also form the softmax's row sums.

Measured on an H100 (benchmarks/kernels/bench_attention.py): faster than cuDNN at 256 tokens, head dim 160, and on
cross-attention; 5-9% slower at 4096 tokens, head dim 40, despite a quarter less arithmetic (cuDNN's Hopper kernel
overlaps the softmax with the matrix products; this one does not). The engine times it per shape like every other
candidate.

Inputs are any (B, H, L, d) views whose last dimension is dense, e.g. head-split views of a packed QKV
projection. The output is (B, H, Lq, d) backed by (B, Lq, H, d) memory, so merging heads afterwards
(transpose(1, 2).reshape) is free.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._triton import config_name, next_pow2, use_triton  # noqa: F401 - config_name names CONFIGS entries
# Exact attention in fp32, rounded once: the same reference as the short-KV kernel's.
from .short_kv_attention import qkv_problem
from .short_kv_attention import short_kv_attention_reference as flash_attention_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None

MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634

# (BLOCK_M, BLOCK_N, num_warps, num_stages) worth timing on an H100 (benchmarks/kernels/bench_attention.py; the
# engine runs flash_attention_auto, with the two that won there). From ptxas for sm_90a (Triton 3.9, fp16): 128x64
# at 4 warps (the FlashAttention-2 default) fits d <= 80 without spills but spills at d = 160, where 8 warps fit;
# the 3-stage 128-key tiles need more shared memory than an H100 has at d = 160 (they fail to launch there); the
# 64-row tiles give more programs for short sequences (256 and 64 tokens).
CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 2), (128, 32, 4, 2), (64, 128, 4, 3)]


def split_head_dim(d: int) -> tuple[int, int]:
    """(D0, D1): two power-of-two tile widths, each at least 16 (D1 = 0: no second part), covering d."""
    d0 = max(16, 1 << (int(d).bit_length() - 1))
    rest = d - d0
    return d0, (max(16, next_pow2(rest)) if rest > 0 else 0)


# ------------------------------------------------------------------- kernel

if triton is not None:

    @triton.jit
    def _load_tile(ptrs, rows_ok, cols_ok, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
        """A (rows, cols) tile, zero where masked; only the masks a launch needs are compiled in."""
        if MASK_ROWS:
            if MASK_COLS:
                tile = tl.load(ptrs, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)
            else:
                tile = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
        else:
            if MASK_COLS:
                tile = tl.load(ptrs, mask=cols_ok[None, :], other=0.0)
            else:
                tile = tl.load(ptrs)
        return tile

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["Lq", "Lk"])
    def _flash_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr,
        Lq, Lk, H, qk_scale,
        stride_qb, stride_qh, stride_ql,
        stride_kb, stride_kh, stride_kl,
        stride_vb, stride_vh, stride_vl,
        stride_ob, stride_oh, stride_ol,
        HEAD_DIM: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr, ALIGN: tl.constexpr,
        PRECISION: tl.constexpr, SUM_IN_PV: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)  # int64: b * stride_qb passes 2^31 at large batches and images
        h = (bh % H).to(tl.int64)
        # Head offsets are multiples of ALIGN elements (the launcher checked); Triton cannot see that through a
        # runtime stride like 40 (d of a packed QKV) and would otherwise fall back to 2-byte loads.
        q_ptr += tl.multiple_of(b * stride_qb + h * stride_qh, ALIGN)
        k_ptr += tl.multiple_of(b * stride_kb + h * stride_kh, ALIGN)
        v_ptr += tl.multiple_of(b * stride_vb + h * stride_vh, ALIGN)
        o_ptr += tl.multiple_of(b * stride_ob + h * stride_oh, ALIGN)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d0 = tl.arange(0, D0)
        m_ok = offs_m < Lq
        d0_ok = offs_d0 < HEAD_DIM  # D0 > d only for d < 16
        MASK_D0: tl.constexpr = D0 > HEAD_DIM
        MASK_N: tl.constexpr = not EVEN_N

        q0 = _load_tile(q_ptr + offs_m[:, None] * stride_ql + offs_d0[None, :], m_ok, d0_ok, True, MASK_D0)
        k0_ptrs = k_ptr + offs_n[:, None] * stride_kl + offs_d0[None, :]
        v0_ptrs = v_ptr + offs_n[:, None] * stride_vl + offs_d0[None, :]
        acc0 = tl.zeros([BLOCK_M, D0], dtype=tl.float32)
        if D1 > 0:  # the second head-dim part; columns >= HEAD_DIM load as zeros
            offs_d1 = D0 + tl.arange(0, D1)
            d1_ok = offs_d1 < HEAD_DIM
            MASK_D1: tl.constexpr = D0 + D1 > HEAD_DIM
            q1 = _load_tile(q_ptr + offs_m[:, None] * stride_ql + offs_d1[None, :], m_ok, d1_ok, True, MASK_D1)
            k1_ptrs = k_ptr + offs_n[:, None] * stride_kl + offs_d1[None, :]
            v1_ptrs = v_ptr + offs_n[:, None] * stride_vl + offs_d1[None, :]
            acc1 = tl.zeros([BLOCK_M, D1], dtype=tl.float32)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of the base-2 scores
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(score - m_i)
        for start_n in range(0, Lk, BLOCK_N):
            n_ok = (start_n + offs_n) < Lk
            k0 = _load_tile(k0_ptrs, n_ok, d0_ok, MASK_N, MASK_D0)
            s = tl.dot(q0, tl.trans(k0), input_precision=PRECISION)  # fp32 accumulation
            if D1 > 0:
                k1 = _load_tile(k1_ptrs, n_ok, d1_ok, MASK_N, MASK_D1)
                s = tl.dot(q1, tl.trans(k1), s, input_precision=PRECISION)
            if MASK_N:  # only when Lk % BLOCK_N != 0; keys past Lk get no weight
                s = tl.where(n_ok[None, :], s, float("-inf"))
            # qk_scale > 0 (the launcher checks), so max(s) * qk_scale is the max of the scaled scores, and
            # scaling and shifting a score is one FMA (spelled out: Triton 3.10 stops fusing by default).
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            x = tl.fma(s, qk_scale, -m_new[:, None])  # <= 0
            alpha = tl.exp2(m_i - m_new)  # 0 on the first block (m_i = -inf)
            v0 = _load_tile(v0_ptrs, n_ok, d0_ok, MASK_N, MASK_D0)
            # (Exponentials in fp16, two per instruction through ex2.approx.f16x2, measured 1-8% slower on an
            # H100: the exp unit is not what limits this kernel.)
            p = tl.exp2(x)
            if not SUM_IN_PV:
                l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
            p = p.to(v0.dtype)
            acc0 = tl.dot(p, v0, acc0 * alpha[:, None], input_precision=PRECISION)
            k0_ptrs += BLOCK_N * stride_kl
            v0_ptrs += BLOCK_N * stride_vl
            if D1 > 0:
                v1 = _load_tile(v1_ptrs, n_ok, d1_ok, MASK_N, MASK_D1)
                if SUM_IN_PV:  # a padding column of v1 set to 1: the tensor cores sum p into acc1[:, d - D0]
                    v1 = tl.where((offs_d1 == HEAD_DIM)[None, :], 1.0, v1).to(v1.dtype)
                acc1 = tl.dot(p, v1, acc1 * alpha[:, None], input_precision=PRECISION)
                k1_ptrs += BLOCK_N * stride_kl
                v1_ptrs += BLOCK_N * stride_vl

        if SUM_IN_PV:
            l_i = tl.sum(tl.where((offs_d1 == HEAD_DIM)[None, :], acc1, 0.0), axis=1)
        inv_l = 1.0 / l_i  # every row saw at least one key, so l_i >= 1
        out_ty = o_ptr.dtype.element_ty
        tl.store(o_ptr + offs_m[:, None] * stride_ol + offs_d0[None, :], (acc0 * inv_l[:, None]).to(out_ty),
                 mask=m_ok[:, None] & d0_ok[None, :])
        if D1 > 0:
            tl.store(o_ptr + offs_m[:, None] * stride_ol + offs_d1[None, :], (acc1 * inv_l[:, None]).to(out_ty),
                     mask=m_ok[:, None] & d1_ok[None, :])


# ----------------------------------------------------------------- launcher

def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the kernel cannot take these inputs (None: it can)."""
    problem = qkv_problem(q, k, v)
    if problem:
        return problem
    if q.shape[-1] > MAX_HEAD_DIM or q.shape[-1] == 0:
        return f"head dim {q.shape[-1]} (1 to {MAX_HEAD_DIM})"
    return None


def _alignment(*tensors: torch.Tensor) -> int:
    """The largest power of two, at most 16, dividing every batch and head offset (in elements)."""
    g = 16
    for t in tensors:
        for dim in (0, 1):
            if t.shape[dim] > 1:  # a size-1 dim's stride is never multiplied by anything but 0
                g = math.gcd(g, t.stride(dim))
    return g  # a divisor of 16


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None, *,
                    block_m: int = 128, block_n: int = 64, num_warps: int = 4, num_stages: int = 2,
                    sum_in_pv: Optional[bool] = None) -> torch.Tensor:
    """softmax(q k^T * scale) v for any number of keys; raises ValueError for inputs it does not take.

    block_m / block_n / num_warps / num_stages: the tile (one of CONFIGS or any other powers of two >= 16);
    tiles larger than the sequence are shrunk to it. Falls back to the reference where Triton cannot run on q.
    sum_in_pv: the softmax row sums from the p @ v product, through a padding column of v set to 1, instead of
    a reduction on the CUDA cores (None: wherever the head dim has padding, e.g. 40 in 32 + 16; 7% faster at
    d = 40 on an H100).
    """
    reason = supports(q, k, v)
    if reason:
        raise ValueError(f"flash_attention: {reason}")
    if any(b < 16 or b & (b - 1) for b in (block_m, block_n)):
        raise ValueError(f"flash_attention: block_m {block_m}, block_n {block_n} must be powers of two >= 16")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not scale > 0:
        raise ValueError(f"flash_attention: scale must be positive, got {scale}")
    if not use_triton(q):
        return flash_attention_reference(q, k, v, scale)
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    out = torch.empty(B, Lq, H, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    if out.numel() == 0:
        return out
    block_m = min(block_m, max(16, next_pow2(Lq)))  # no tile larger than the sequence (e.g. 64 tokens)
    block_n = min(block_n, max(16, next_pow2(Lk)))
    d0, d1 = split_head_dim(d)
    padded = d1 > 0 and d0 + d1 > d
    if sum_in_pv is None:
        sum_in_pv = padded
    if sum_in_pv and not padded:
        raise ValueError(f"flash_attention: sum_in_pv needs a padded head dim, {d} = {d0} + {d1} has none")
    grid = (triton.cdiv(Lq, block_m), B * H)
    _flash_attention_kernel[grid](
        q, k, v, out, Lq, Lk, H, scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HEAD_DIM=d, D0=d0, D1=d1, BLOCK_M=block_m, BLOCK_N=block_n, EVEN_N=Lk % block_n == 0,
        ALIGN=_alignment(q, k, v, out),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 inputs: no silent TF32 rounding
        SUM_IN_PV=sum_in_pv, num_warps=num_warps, num_stages=num_stages,
    )
    return out


def flash_attention_auto(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """flash_attention with the tile measured best on an H100 for the sequence length: 64 x 64 at 4 warps for
    <= 256 queries (more programs for short sequences), else 128 x 64 at 8 warps."""
    if q.shape[2] <= 256:
        return flash_attention(q, k, v, block_m=64, block_n=64, num_warps=4, num_stages=2)
    return flash_attention(q, k, v, block_m=128, block_n=64, num_warps=8, num_stages=3)
