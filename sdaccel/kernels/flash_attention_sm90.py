"""Attention over a long key sequence on Hopper (sm_90), written in Gluon: TMA loads and asynchronous wgmma.

    out[b, h] = softmax(q[b, h] k[b, h]^T * scale) v[b, h]        q: (B, H, Lq, d), k, v: (B, H, Lk, d)

The same online softmax as kernels/flash_attention.py (and its head-dim split: 40 -> 32 + 16, so 48 columns are
multiplied where cuDNN multiplies 64), but scheduled the way Hopper wants it, which plain Triton does not do:

- K and V tiles arrive by TMA into a ring of STAGES shared-memory slots, issued by one producer warp (a warp-
  specialized partition) as soon as the math warps free a slot; mbarriers say full and free. The descriptors are
  4-D over the (B, H, L, d) view, so a head-split view of a packed QKV projection is read in place, and the
  head-dim padding (columns 40-47) arrives as TMA's zero fill.
- SPLIT: a 128-row block's two halves go to two math partitions of 4 warps that share only the ring, so one's
  softmax runs beside the other's products; with 80 registers a thread, two CTAs share an SM as well.
- The products are asynchronous warpgroup MMAs. Each step issues S_j = Q K_j^T, then O += P_{j-1} V_{j-1}, waits
  only for S_j, and runs the softmax of block j while the tensor cores still multiply block j-1's probabilities
  (FlashAttention-3's intra-warpgroup overlap). At SD1.5's head dim 40 the softmax (one exp per score) costs more
  than both products, so hiding the products under it is where the time goes.
- P stays in registers as the A operand of the P V product; S's accumulator layout is already its operand layout.

What ptxas makes of the overlap. Compiled by Triton 3.6's ptxas for sm_90a (head dim 40, DEFAULT_CONFIG), a math
warp's loop body is 279 SASS instructions, and ptxas places the wait for P_{j-1} V_{j-1} right after the wait for S_j
and the row max: all 34 exponentials run after the product is done, at any register cap (80 to 128), with or without
the slot-freeing arrive. PTX has them before the wait; the wait has no register operands in PTX (Triton's deps are a
comment there), so ptxas may hoist it, and does. The overlap the step above describes only happens between partitions
and CTAs, not within one. On an H200 the kernel is bound by no single pipe at head dim 40: with no exponentials at all
it was only 9% faster, with 8 more FMA-pipe instructions per score 40% slower. Timed there (benchmarks/kernels/
bench_attention.py, ms; cuDNN in the same process): 0.158 at 2 x 8 x 4096 x 40 (cuDNN 0.158), 1.226 at 16 x 8 x 4096 x
40 (cuDNN 1.246), with SHORT_CONFIG 0.0207 at 2 x 8 x 1024 x 80 (cuDNN 0.0227). The row sums on the tensor cores (P
times a ones tile) or behind an always-taken branch (which keeps the wait for P V below the exponentials) were tried
and measured slower there (or, on the tensor cores at 16 x 8 x 4096 x 40, within the spread), so the kernel computes
them in registers.

Only for sm_90 (wgmma); the fast engine times it against cuDNN, FlashAttention and kernels/flash_attention.py per
shape (engines/fast/attention.py) and keeps the fastest. The reference is flash_attention's.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .flash_attention import LOG2E, flash_attention_reference, split_head_dim, supports as _supports_shapes
from .gluon_hopper import (  # noqa: F401 - gluon and available are part of this module's interface
    HALF_DTYPES, TensorDescriptor, available, descriptor, device_refusal, fence_async_shared, gl, gluon, mbarrier,
    regs, warpgroup_mma, warpgroup_mma_wait,
)
from .gluon_hopper import tma_load as _tma_load

LOADER_REGS = regs(24)  # the producer warp only issues TMA copies
SPLIT_CONSUMER_REGS = regs(104)  # SPLIT's second math partition

__all__ = ["CONFIGS", "available", "default_config", "flash_attention_sm90", "flash_attention_reference", "supports"]

# (BLOCK_M, BLOCK_N, num_warps, STAGES[, maxnreg[, SPLIT]]) worth timing
# (benchmarks/kernels/bench_attention.py).
# num_warps counts the math warps (per partition with SPLIT); the producer warp comes on top. maxnreg caps the
# registers a thread so that two CTAs share an SM (one's softmax beside the other's products); SPLIT puts the
# block's two 64-row halves in two independent partitions. On an H100:
# SPLIT 128 x 64, 3 stages, 80 registers is the best at 4096 tokens, head dim 40 (cuDNN's speed at CFG batch 2,
# 5% faster at 16); 64 x 128 at 128 registers at 1024 tokens, head dim 80 (9% faster than cuDNN); cuDNN stays
# ahead at head dim 64.
CONFIGS = [
    (128, 64, 4, 3, 80, True), (128, 64, 4, 2, 80, True), (64, 128, 4, 2, 128), (64, 64, 4, 3, 128),
    (128, 64, 8, 2, 80), (128, 128, 8, 2),
]
DEFAULT_CONFIG = (128, 64, 4, 3, 80, True)
SHORT_CONFIG = (64, 128, 4, 2, 128)  # a second engine candidate: the 1024-token levels


if gluon is not None:

    @gluon.jit
    def _loader(q0_desc, q1_desc, k0_desc, k1_desc, v0_desc, v1_desc, q0_s, q1_s, k0_s, k1_s, v0_s, v1_s,
                q_bar, k_bars, v_bars, free_bars, b, h, off_m, num_n,
                D0: gl.constexpr, HAS_D1: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """The producer warp: Q once, then each key block's K and V into the ring as soon as its slot is free."""
        q_bytes: gl.constexpr = q0_desc.block_type.nbytes + (q1_desc.block_type.nbytes if HAS_D1 else 0)
        k_bytes: gl.constexpr = k0_desc.block_type.nbytes + (k1_desc.block_type.nbytes if HAS_D1 else 0)
        v_bytes: gl.constexpr = v0_desc.block_type.nbytes + (v1_desc.block_type.nbytes if HAS_D1 else 0)
        mbarrier.expect(q_bar, q_bytes)
        _tma_load(q0_desc, [b, h, off_m, 0], q_bar, q0_s)
        if HAS_D1:
            _tma_load(q1_desc, [b, h, off_m, D0], q_bar, q1_s)
        for j in range(num_n):
            slot = j % STAGES
            # The consumer frees a slot once per use; the first STAGES uses find it free.
            mbarrier.wait(free_bars.index(slot), ((j // STAGES) - 1) & 1, pred=j >= STAGES)
            n = j * BLOCK_N
            k_bar = k_bars.index(slot)
            mbarrier.expect(k_bar, k_bytes)
            _tma_load(k0_desc, [b, h, n, 0], k_bar, k0_s.index(slot))
            if HAS_D1:
                _tma_load(k1_desc, [b, h, n, D0], k_bar, k1_s.index(slot))
            v_bar = v_bars.index(slot)
            mbarrier.expect(v_bar, v_bytes)
            _tma_load(v0_desc, [b, h, n, 0], v_bar, v0_s.index(slot))
            if HAS_D1:
                _tma_load(v1_desc, [b, h, n, D0], v_bar, v1_s.index(slot))

    @gluon.jit
    def _softmax_step(s, m_i, l_i, qk_scale):
        """Online softmax over one block of scores: the new row max, the rescale of what came before, the
        probabilities (fp32 scores shifted by their row max, then exponentiated) and the new row sums (the
        running ones rescaled to the new row max, plus this block's)."""
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)  # 0 on the first block (m_i = -inf)
        p = gl.exp2(gl.fma(s, qk_scale, -m_new[:, None]))
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return m_new, alpha, p, l_i

    @gluon.jit
    def _issue_scores(q0, q1, k0_s, k1_s, slot, s_zero, BLOCK_N: gl.constexpr, D0: gl.constexpr, D1: gl.constexpr,
                      HAS_D1: gl.constexpr):
        """S = Q K^T of one ring slot, issued (not waited for), both head-dim parts into one accumulator."""
        s = warpgroup_mma(q0, k0_s.index(slot).reshape([BLOCK_N, D0]).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        if HAS_D1:
            s = warpgroup_mma(q1, k1_s.index(slot).reshape([BLOCK_N, D1]).permute((1, 0)), s, is_async=True)
        return s

    @gluon.jit
    def _issue_pv(p, v0_s, v1_s, slot, acc0, acc1, p0_layout: gl.constexpr, p1_layout: gl.constexpr,
                  BLOCK_N: gl.constexpr, D0: gl.constexpr, D1: gl.constexpr, HAS_D1: gl.constexpr):
        """O += P V of one ring slot, issued (not waited for), P from registers. Returns the accumulators and
        the operands the caller must keep alive (pass them to the wait) until the products are done."""
        p0 = gl.convert_layout(p, p0_layout)
        acc0 = warpgroup_mma(p0, v0_s.index(slot).reshape([BLOCK_N, D0]), acc0, is_async=True)
        p1 = p0
        if HAS_D1:
            p1 = gl.convert_layout(p, p1_layout)
            acc1 = warpgroup_mma(p1, v1_s.index(slot).reshape([BLOCK_N, D1]), acc1, is_async=True)
        return acc0, acc1, p0, p1

    @gluon.jit
    def _consumer(q0_s, q1_s, k0_s, k1_s, v0_s, v1_s, q_bar, k_bars, v_bars, free_bars, o_ptr,
                  b, h, off_m, num_n, Lq, Lk, qk_scale, stride_ob, stride_oh, stride_ol,
                  HEAD_DIM: gl.constexpr, D0: gl.constexpr, D1: gl.constexpr, HAS_D1: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, EVEN_N: gl.constexpr,
                  ROW0: gl.constexpr, ROWS: gl.constexpr, num_warps: gl.constexpr):
        """The math warps: the products on the tensor cores and the online softmax between them, for rows
        ROW0 .. ROW0 + ROWS of the query block (SPLIT: two such partitions, each on its own 64 rows)."""
        dtype: gl.constexpr = k0_s.dtype
        # Accumulators in wgmma's layout; each warp owns BLOCK_M / num_warps rows, one warpgroup per 64.
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o0_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, D0, 16])
        o1_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                            instr_shape=[16, D1, 16])
        p0_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o0_layout, k_width=2)
        p1_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o1_layout, k_width=2)
        row_o0: gl.constexpr = gl.SliceLayout(1, o0_layout)
        row_o1: gl.constexpr = gl.SliceLayout(1, o1_layout)

        # wgmma takes 2-D views of the 4-D TMA tiles (leading dims 1): same bytes, same swizzle.
        q0 = q0_s.reshape([BLOCK_M, D0]).slice(ROW0, ROWS)
        q1 = q1_s.reshape([BLOCK_M, D1]).slice(ROW0, ROWS)
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        acc0 = gl.zeros([ROWS, D0], gl.float32, o0_layout)
        acc1 = gl.zeros([ROWS, D1], gl.float32, o1_layout)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
        mbarrier.wait(q_bar, 0)

        # Block 0: S, then the first row max and probabilities.
        mbarrier.wait(k_bars.index(0), 0)
        s = _issue_scores(q0, q1, k0_s, k1_s, 0, s_zero, BLOCK_N, D0, D1, HAS_D1)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        if not EVEN_N:
            s = gl.where((offs_n < Lk)[None, :], s, float("-inf"))
        m_i, alpha, p, l_i = _softmax_step(s, m_i, l_i, qk_scale)
        p = p.to(dtype)

        for j in range(1, num_n):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            # S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; both in flight while the softmax waits for S_j only.
            mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
            s = _issue_scores(q0, q1, k0_s, k1_s, slot, s_zero, BLOCK_N, D0, D1, HAS_D1)
            mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
            acc0, acc1, p0, p1 = _issue_pv(p, v0_s, v1_s, prev, acc0, acc1, p0_layout, p1_layout, BLOCK_N, D0, D1,
                                           HAS_D1)
            # Each product issued is one group: wait until only those issued after S_j are left.
            s = warpgroup_mma_wait(num_outstanding=1 + HAS_D1, deps=(s,))

            if not EVEN_N:
                s = gl.where((j * BLOCK_N + offs_n < Lk)[None, :], s, float("-inf"))
            m_i, alpha, p_next, l_i = _softmax_step(s, m_i, l_i, qk_scale)

            if HAS_D1:
                acc0, acc1, p0, p1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, p0, p1))
                acc1 = acc1 * gl.convert_layout(alpha, row_o1)[:, None]
            else:
                acc0, p0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, p0))
            mbarrier.arrive(free_bars.index(prev))  # K_{j-1} and V_{j-1} are read: the loader may refill
            acc0 = acc0 * gl.convert_layout(alpha, row_o0)[:, None]
            p = p_next.to(dtype)

        last = (num_n - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((num_n - 1) // STAGES) & 1)
        acc0, acc1, p0, p1 = _issue_pv(p, v0_s, v1_s, last, acc0, acc1, p0_layout, p1_layout, BLOCK_N, D0, D1, HAS_D1)
        if HAS_D1:
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
        else:
            acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0,))

        inv_l = 1.0 / l_i  # every row saw at least one key
        o_base = o_ptr + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
        offs_m0 = off_m + ROW0 + gl.arange(0, ROWS, layout=row_o0)
        offs_d0 = gl.arange(0, D0, layout=gl.SliceLayout(0, o0_layout))
        out0 = (acc0 * gl.convert_layout(inv_l, row_o0)[:, None]).to(dtype)
        gl.store(o_base + offs_m0[:, None] * stride_ol + offs_d0[None, :], out0,
                 mask=(offs_m0 < Lq)[:, None] & (offs_d0 < HEAD_DIM)[None, :])
        if HAS_D1:
            offs_m1 = off_m + ROW0 + gl.arange(0, ROWS, layout=row_o1)
            offs_d1 = D0 + gl.arange(0, D1, layout=gl.SliceLayout(0, o1_layout))
            out1 = (acc1 * gl.convert_layout(inv_l, row_o1)[:, None]).to(dtype)
            gl.store(o_base + offs_m1[:, None] * stride_ol + offs_d1[None, :], out1,
                     mask=(offs_m1 < Lq)[:, None] & (offs_d1 < HEAD_DIM)[None, :])

    # Sizes are not specialized on: no recompile per resolution or batch.
    @gluon.jit(do_not_specialize=["Lq", "Lk", "H"])
    def _attention_sm90_kernel(
        q0_desc, q1_desc, k0_desc, k1_desc, v0_desc, v1_desc, o_ptr,
        Lq, Lk, H, qk_scale,
        stride_ob, stride_oh, stride_ol,
        HEAD_DIM: gl.constexpr, HAS_D1: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr, EVEN_N: gl.constexpr, SPLIT: gl.constexpr, num_warps: gl.constexpr,
    ):
        dtype: gl.constexpr = k0_desc.dtype
        D0: gl.constexpr = k0_desc.block_type.shape[3]
        D1: gl.constexpr = k1_desc.block_type.shape[3]
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        off_m = gl.program_id(0) * BLOCK_M
        num_n = gl.cdiv(Lk, BLOCK_N)

        q0_s = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D0], q0_desc.layout)
        q1_s = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D1], q1_desc.layout)
        k0_s = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D0], k0_desc.layout)
        k1_s = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D1], k1_desc.layout)
        v0_s = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D0], v0_desc.layout)
        v1_s = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D1], v1_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        free_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
            mbarrier.init(free_bars.index(i), count=2 if SPLIT else 1)  # every consumer frees each slot
        fence_async_shared()

        # One producer warp feeds the ring (FlashAttention-3's split): the math warps never stop to issue loads,
        # and no CTA-wide barrier ties them to the loads. SPLIT: the block's two 64-row halves in two partitions
        # of 4 warps that synchronize with nothing but the ring, so one's softmax runs beside the other's products.
        if SPLIT:
            HALF: gl.constexpr = BLOCK_M // 2
            gl.warp_specialize([
                (_consumer, (q0_s, q1_s, k0_s, k1_s, v0_s, v1_s, q_bar, k_bars, v_bars, free_bars, o_ptr,
                             b, h, off_m, num_n, Lq, Lk, qk_scale, stride_ob, stride_oh, stride_ol,
                             HEAD_DIM, D0, D1, HAS_D1, BLOCK_M, BLOCK_N, STAGES, EVEN_N, 0, HALF,
                             num_warps)),
                (_consumer, (q0_s, q1_s, k0_s, k1_s, v0_s, v1_s, q_bar, k_bars, v_bars, free_bars, o_ptr,
                             b, h, off_m, num_n, Lq, Lk, qk_scale, stride_ob, stride_oh, stride_ol,
                             HEAD_DIM, D0, D1, HAS_D1, BLOCK_M, BLOCK_N, STAGES, EVEN_N, HALF, HALF,
                             num_warps)),
                (_loader, (q0_desc, q1_desc, k0_desc, k1_desc, v0_desc, v1_desc, q0_s, q1_s, k0_s, k1_s, v0_s, v1_s,
                           q_bar, k_bars, v_bars, free_bars, b, h, off_m, num_n, D0, HAS_D1, BLOCK_N, STAGES)),
            ], [num_warps, 1], [SPLIT_CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([
                (_consumer, (q0_s, q1_s, k0_s, k1_s, v0_s, v1_s, q_bar, k_bars, v_bars, free_bars, o_ptr,
                             b, h, off_m, num_n, Lq, Lk, qk_scale, stride_ob, stride_oh, stride_ol,
                             HEAD_DIM, D0, D1, HAS_D1, BLOCK_M, BLOCK_N, STAGES, EVEN_N, 0, BLOCK_M,
                             num_warps)),
                (_loader, (q0_desc, q1_desc, k0_desc, k1_desc, v0_desc, v1_desc, q0_s, q1_s, k0_s, k1_s, v0_s, v1_s,
                           q_bar, k_bars, v_bars, free_bars, b, h, off_m, num_n, D0, HAS_D1, BLOCK_N, STAGES)),
            ], [1], [LOADER_REGS])

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))
            mbarrier.invalidate(free_bars.index(i))


# ----------------------------------------------------------------- launcher

def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the kernel cannot take these inputs (None: it can)."""
    problem = _supports_shapes(q, k, v) or device_refusal(q.device)
    if problem:
        return problem
    if q.dtype not in HALF_DTYPES:
        return f"dtype {q.dtype} (fp16 or bf16)"
    d = q.shape[-1]
    d0, d1 = split_head_dim(d)
    if d < 16 or d0 + d1 > 256:
        return f"head dim {d} (16 to 256)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        # TMA: 16-byte aligned base and strides, dense last dimension.
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(t.stride(i) * t.element_size() % 16 for i in range(3)):
            return f"{name} is not 16-byte aligned for TMA (strides {tuple(t.stride())})"
    return None


def _descriptor(t: torch.Tensor, rows: int, cols: int) -> "TensorDescriptor":
    return descriptor(t, [1, 1, rows, cols])  # over the 4-D (B, H, L, d) view: a packed QKV's heads in place


def default_config(head_dim: int) -> tuple:
    """DEFAULT_CONFIG where its 80-register cap holds the accumulators (padded head dim <= 96: SD's 40, 64, 80),
    else SHORT_CONFIG (ptxas cannot fit d = 160 in 80 registers a thread)."""
    return DEFAULT_CONFIG if sum(split_head_dim(head_dim)) <= 96 else SHORT_CONFIG


def flash_attention_sm90(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None, *,
                         config: Optional[tuple] = None) -> torch.Tensor:
    """softmax(q k^T * scale) v on an sm_90 GPU; raises ValueError for inputs it does not take.

    config: (BLOCK_M, BLOCK_N, num_warps, STAGES[, maxnreg[, SPLIT]]), one of CONFIGS or any other with BLOCK_M a
    multiple of 16 * num_warps (of 32 * num_warps with SPLIT) and powers of two >= 16; None: default_config.
    """
    reason = supports(q, k, v)
    if reason:
        raise ValueError(f"flash_attention_sm90: {reason}")
    block_m, block_n, num_warps, stages, *extra = config or default_config(q.shape[-1])
    maxnreg, split = list(extra) + [None, False][len(extra):]
    if block_m % (16 * num_warps * (2 if split else 1)) or any(x < 16 or x & (x - 1) for x in (block_m, block_n)):
        raise ValueError(f"flash_attention_sm90: tile {block_m} x {block_n} at {num_warps} warps")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not scale > 0:
        raise ValueError(f"flash_attention_sm90: scale must be positive, got {scale}")
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    out = torch.empty(B, Lq, H, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    if out.numel() == 0:
        return out
    d0, d1 = split_head_dim(d)
    d1_tile = d1 if d1 else 16  # a placeholder descriptor when there is no second part (never loaded)
    grid = (-(-Lq // block_m), B * H)
    _attention_sm90_kernel[grid](
        _descriptor(q, block_m, d0), _descriptor(q, block_m, d1_tile),
        _descriptor(k, block_n, d0), _descriptor(k, block_n, d1_tile),
        _descriptor(v, block_n, d0), _descriptor(v, block_n, d1_tile), out,
        Lq, Lk, H, scale * LOG2E, out.stride(0), out.stride(1), out.stride(2),
        HEAD_DIM=d, HAS_D1=d1 > 0, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, EVEN_N=Lk % block_n == 0,
        SPLIT=split, num_warps=num_warps,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    return out
