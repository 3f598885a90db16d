"""The feed-forward's first half on Hopper (sm_90), in Gluon: GEMM, bias and GEGLU, warp-specialized.

    h   = x @ W^T + b                 x: (M, K), W: (2D, K) as nn.Linear stores it, b: (2D,)
    out = h[:, :D] * gelu(h[:, D:])   (M, D)

Unfused, the GEMM writes h (2D wide) and kernels/geglu.py reads it back: at SD1.5's 64x64 level with CFG batch 16
that is 335 MB written and read again per block, for an output half that size. The same fusion in plain Triton (a
persistent TMA kernel) lost to cuBLAS + the GEGLU kernel where K is large (on an H100, K = 1280: 224 against 204 us
at CFG batch 16), because Triton 3.6 does not warp-specialize a GEMM: the warps that multiply also issue the loads
and stop for the epilogue. This kernel is scheduled the way cuBLAS's Hopper GEMMs are:

- One producer warp issues every TMA load (x's tile and W's value and gate tiles, from W's two halves in place)
  into a ring of STAGES shared-memory slots, running ahead across output tiles; mbarriers say full and free.
- Persistent: one CTA per SM walks the output tiles (grouped so that GROUP_M row tiles share a weight tile in L2).
- CONSUMERS math partitions of one warpgroup each take the CTA's tiles in turn (a pair of mbarriers passes the
  turn once a partition's data has all arrived), so while one partition runs its epilogue (bias, exact-erf GELU,
  the product, the fp16 store by TMA) the other's products keep the tensor cores busy: CUTLASS's "ping-pong".
- Each partition holds two fp32 accumulators (value and gate columns of the same rows), multiplied by asynchronous
  wgmma straight from shared memory; h is never rounded to fp16 (the unfused path rounds it once).

At SD's shapes it is bound by L2 bandwidth, not by the tensor cores: each 64-row tile reads its weight tile again
(262 MB through L2 at 8192 x 320 -> 2 x 1280 in 45.3 us, 5.8 TB/s on an H100, which keeps it 42% above cuBLAS's bare
GEMM there).

linear_geglu_sm90_fp8 runs the same kernel on e4m3 x and W (wgmma m64nNk32, 128 bytes of K a step as the fp16
tile), scales the products back by x_scale * w_scale and writes GEGLU's output in e4m3 (out / e4m3_scale) with its
max |out| in e4m3_amax: the FP8 mode's feed-forward first half (engines/fast/fp8.py). ~2% of its e4m3 values
(against ~1% for cuBLASLt + GEGLU) round the other way from an fp32 reference, most likely because wgmma
accumulates e4m3 products with fewer bits than cuBLASLt's fp32-promoted sums; the output's own e4m3 rounding sets its
error, the same as cuBLASLt + GEGLU's (tests/kernels/test_linear_geglu_sm90.py).

Only for sm_90; the fast engine times it against cuBLAS + the GEGLU kernel per shape (engines/fast/feed_forward.py).
The reference, linear_geglu_reference, is the unfused GEMM + GEGLU in plain torch.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._triton import sm_count
from .gluon_hopper import (  # noqa: F401 - gluon and available are part of this module's interface
    HALF_DTYPES, available, descriptor, fence_async_shared, gl, gluon, mbarrier, refusal, regs, tma, warpgroup_mma,
    warpgroup_mma_wait,
)
from .fp8 import E4M3, check_fp8_output, scale_refusal
from .gluon_hopper import tma_load as _tma_load
from .geglu import geglu_reference
from .gluon_hopper import tma_store as _tma_store

LOADER_REGS = regs(40)  # the producer warp only walks tiles and issues TMA
CONSUMER_REGS = regs(232)  # the second and later math partitions

__all__ = ["CONFIGS", "DEFAULT_CONFIG", "FP8_CONFIG", "available", "config_name", "linear_geglu_reference",
           "linear_geglu_sm90", "linear_geglu_sm90_fp8", "supports"]

# (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, CONSUMERS): BLOCK_N columns of each half, so a tile multiplies 2 * BLOCK_N
# columns of W; one warpgroup a consumer, each with its own output tile and a BLOCK_M x BLOCK_N staging buffer.
# On an H100 and an H200 (benchmarks/kernels/bench_gated_gemm.py) 64 x 128 with two consumers was the fastest or within
# 2% at every SD1.5 and SDXL feed-forward; one consumer (no epilogue under the other's products) is 30-40% slower.
CONFIGS = [
    (64, 128, 64, 4, 2), (128, 64, 64, 4, 2), (64, 128, 32, 8, 2), (64, 64, 64, 6, 2), (128, 64, 64, 5, 2),
    (64, 128, 64, 4, 1),
]
DEFAULT_CONFIG = CONFIGS[0]
# e4m3 operands: the same tile in bytes as the default (128 one-byte values of K a step, 128-byte rows).
FP8_CONFIG = (64, 128, 128, 4, 2)


def config_name(config: tuple) -> str:
    """(128, 64, 64, 4, 2) -> "128x64x64s4c2": tile, stages, consumers (what picks store, benchmarks print)."""
    block_m, block_n, block_k, stages, consumers = config
    return f"{block_m}x{block_n}x{block_k}s{stages}c{consumers}"


def linear_geglu_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                           approximate: str = "none") -> torch.Tensor:
    """diffusers' GEGLU on a Linear, in plain torch at x's dtype: what the tests trust."""
    return geglu_reference(F.linear(x, weight), bias, approximate)


if gluon is not None:

    @gluon.jit
    def _tile_offsets(tile, num_m, num_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
        """Grouped order: GROUP_M consecutive row tiles go through the weight's column tiles together."""
        per_group = GROUP_M * num_n
        first_m = (tile // per_group) * GROUP_M
        group_rows = gl.minimum(num_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_rows) * BLOCK_M
        off_n = ((tile % per_group) // group_rows) * BLOCK_N
        return off_m, off_n

    @gluon.jit
    def _loader(x_desc, value_desc, gate_desc, a_s, value_s, gate_s, ready_bars, free_bars,
                num_m, num_n, k_steps, num_programs,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                GROUP_M: gl.constexpr):
        """The producer warp: every K step of every tile this CTA owns, in order, as soon as a slot is free."""
        nbytes: gl.constexpr = x_desc.block_type.nbytes + 2 * value_desc.block_type.nbytes
        it = 0
        for tile in range(gl.program_id(0), num_m * num_n, num_programs):
            off_m, off_n = _tile_offsets(tile, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
            for ki in range(k_steps):
                slot = it % STAGES
                # A consumer frees a slot once per use; the first STAGES uses find it free.
                mbarrier.wait(free_bars.index(slot), ((it // STAGES) - 1) & 1, pred=it >= STAGES)
                bar = ready_bars.index(slot)
                mbarrier.expect(bar, nbytes)
                off_k = ki * BLOCK_K
                _tma_load(x_desc, [off_m, off_k], bar, a_s.index(slot))
                _tma_load(value_desc, [off_n, off_k], bar, value_s.index(slot))
                _tma_load(gate_desc, [off_n, off_k], bar, gate_s.index(slot))
                it += 1

    @gluon.jit
    def _consumer(a_s, value_s, gate_s, ready_bars, free_bars, turn_bars, o_s, out_desc, b_ptr,
                  x_scale_ptr, w_scale_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
                  M, D, num_m, num_n, k_steps, num_programs,
                  C: gl.constexpr, CONSUMERS: gl.constexpr, HAS_BIAS: gl.constexpr, TANH: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                  FP8: gl.constexpr):
        """One warpgroup: the CTA's tiles C, C + CONSUMERS, ...: their products, then bias, GEGLU and the store.
        FP8: e4m3 operands, the products scaled back by x_scale * w_scale, the output written in e4m3 as
        out / e4m3_scale (saturated) and max |out| recorded into e4m3_amax (kernels/fp8.py)."""
        INSTR_K: gl.constexpr = 32 if FP8 else 16  # wgmma's K: 32 bytes of operand a row either way
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, BLOCK_N, INSTR_K])
        col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        out_s = o_s.index(C)
        pid = gl.program_id(0)
        if FP8:
            product_scale = gl.load(x_scale_ptr) * gl.load(w_scale_ptr)
            inv_e4m3_scale = 1.0 / gl.load(e4m3_scale_ptr)
        for tile in range(pid + C * num_programs, num_m * num_n, CONSUMERS * num_programs):
            off_m, off_n = _tile_offsets(tile, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
            # The tile's place among the CTA's tiles, in the loader's order: its K steps are the ring's uses from
            # there on.
            local = (tile - pid) // num_programs
            it = local * k_steps
            if CONSUMERS == 2:
                # Take the turn: wait until the other partition has seen its previous tile's data arrive. An
                # mbarrier's phase is only a parity, so a waiter must never be more than one phase ahead of a slot;
                # taking turns keeps this partition's waits behind the other's.
                mbarrier.wait(turn_bars.index(1 - C), ((local - 1) // 2) & 1, pred=local > 0)
            slot = it % STAGES
            mbarrier.wait(ready_bars.index(slot), (it // STAGES) & 1)
            acc_v = warpgroup_mma(a_s.index(slot), value_s.index(slot).permute((1, 0)), zero, use_acc=False,
                                  is_async=True)
            acc_g = warpgroup_mma(a_s.index(slot), gate_s.index(slot).permute((1, 0)), zero, use_acc=False,
                                  is_async=True)
            # Waits for nothing (two may be in flight); it makes the loop's carried values tensors.
            acc_v, acc_g = warpgroup_mma_wait(num_outstanding=2, deps=(acc_v, acc_g))
            for ki in range(1, k_steps):
                prev = slot
                it += 1
                slot = it % STAGES
                mbarrier.wait(ready_bars.index(slot), (it // STAGES) & 1)
                acc_v = warpgroup_mma(a_s.index(slot), value_s.index(slot).permute((1, 0)), acc_v, is_async=True)
                acc_g = warpgroup_mma(a_s.index(slot), gate_s.index(slot).permute((1, 0)), acc_g, is_async=True)
                # The previous step's two products are done once at most these two are in flight: free its slot.
                acc_v, acc_g = warpgroup_mma_wait(num_outstanding=2, deps=(acc_v, acc_g))
                mbarrier.arrive(free_bars.index(prev))
            if CONSUMERS == 2:
                mbarrier.arrive(turn_bars.index(C))  # this tile's data is all here: the other partition's turn
            acc_v, acc_g = warpgroup_mma_wait(num_outstanding=0, deps=(acc_v, acc_g))
            mbarrier.arrive(free_bars.index(slot))

            if FP8:
                acc_v = acc_v * product_scale
                acc_g = acc_g * product_scale
            if HAS_BIAS:
                cols = off_n + gl.arange(0, BLOCK_N, layout=col_layout)
                col_ok = cols < D
                acc_v += gl.load(b_ptr + cols, mask=col_ok, other=0.0).to(gl.float32)[None, :]
                acc_g += gl.load(b_ptr + D + cols, mask=col_ok, other=0.0).to(gl.float32)[None, :]
            if TANH:
                # tanh(u) = 1 - 2 / (exp(2u) + 1): saturates cleanly to +-1 for large |u|.
                u = 0.7978845608028654 * (acc_g + 0.044715 * acc_g * acc_g * acc_g)
                gelu = 0.5 * acc_g * (2.0 - 2.0 / (gl.exp(2.0 * u) + 1.0))
            else:
                gelu = 0.5 * acc_g * (1.0 + gl.erf(acc_g * 0.7071067811865476))
            if FP8:
                rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
                cols_ok = (off_n + gl.arange(0, BLOCK_N, layout=col_layout)) < D
                gated = acc_v * gelu
                # Rows past M (TMA's zero fill) still get the bias: left out of the amax.
                seen = gl.where((rows < M)[:, None] & cols_ok[None, :], gl.abs(gated), 0.0)
                gl.atomic_max(e4m3_amax_ptr, gl.max(gl.max(seen, axis=1), axis=0))
                gated = gl.minimum(gl.maximum(gated * inv_e4m3_scale, -448.0), 448.0)
                out = gated.to(out_desc.dtype)  # the hardware's e4m3 conversion rounds to nearest even
            else:
                out = (acc_v * gelu).to(out_desc.dtype)
            tma.store_wait(0)  # this partition's previous tile has left the staging buffer
            out_s.store(out)
            fence_async_shared()
            _tma_store(out_desc, [off_m, off_n], out_s)
        tma.store_wait(0)

    # Sizes are not specialized on: no recompile per resolution or batch.
    @gluon.jit(do_not_specialize=["M"])
    def _linear_geglu_sm90_kernel(
        x_desc, value_desc, gate_desc, b_ptr, out_desc, x_scale_ptr, w_scale_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
        M, D, K, num_programs,
        HAS_BIAS: gl.constexpr, TANH: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
        GROUP_M: gl.constexpr, FP8: gl.constexpr,
    ):
        dtype: gl.constexpr = x_desc.dtype
        out_dtype: gl.constexpr = out_desc.dtype
        BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = value_desc.block_type.shape[0]
        num_m = gl.cdiv(M, BLOCK_M)
        num_n = gl.cdiv(D, BLOCK_N)
        k_steps = gl.cdiv(K, BLOCK_K)

        a_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
        value_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], value_desc.layout)
        gate_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], gate_desc.layout)
        o_s = gl.allocate_shared_memory(out_dtype, [CONSUMERS, BLOCK_M, BLOCK_N], out_desc.layout)
        ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        free_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready_bars.index(i), count=1)
            mbarrier.init(free_bars.index(i), count=1)  # one consumer reads each use of a slot
        for i in gl.static_range(2):
            mbarrier.init(turn_bars.index(i), count=1)
        fence_async_shared()

        # The first math partition is the kernel's own 4 warps; the others and the loader are workers. (Gluon
        # 3.6 cannot hold a partition's function in a variable, hence the spelled-out lists.)
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_consumer, (a_s, value_s, gate_s, ready_bars, free_bars, turn_bars, o_s, out_desc, b_ptr,
                             x_scale_ptr, w_scale_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
                             M, D, num_m, num_n, k_steps, num_programs, 0, CONSUMERS, HAS_BIAS, TANH,
                             BLOCK_M, BLOCK_N, STAGES, GROUP_M, FP8)),
                (_consumer, (a_s, value_s, gate_s, ready_bars, free_bars, turn_bars, o_s, out_desc, b_ptr,
                             x_scale_ptr, w_scale_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
                             M, D, num_m, num_n, k_steps, num_programs, 1, CONSUMERS, HAS_BIAS, TANH,
                             BLOCK_M, BLOCK_N, STAGES, GROUP_M, FP8)),
                (_loader, (x_desc, value_desc, gate_desc, a_s, value_s, gate_s, ready_bars, free_bars,
                           num_m, num_n, k_steps, num_programs, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M)),
            ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([
                (_consumer, (a_s, value_s, gate_s, ready_bars, free_bars, turn_bars, o_s, out_desc, b_ptr,
                             x_scale_ptr, w_scale_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
                             M, D, num_m, num_n, k_steps, num_programs, 0, CONSUMERS, HAS_BIAS, TANH,
                             BLOCK_M, BLOCK_N, STAGES, GROUP_M, FP8)),
                (_loader, (x_desc, value_desc, gate_desc, a_s, value_s, gate_s, ready_bars, free_bars,
                           num_m, num_n, k_steps, num_programs, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M)),
            ], [1], [LOADER_REGS])

        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready_bars.index(i))
            mbarrier.invalidate(free_bars.index(i))
        for i in gl.static_range(2):
            mbarrier.invalidate(turn_bars.index(i))


# ----------------------------------------------------------------- launcher

def supports(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why the kernel cannot take x (..., K) and W (2D, K) (None: it can). Both e4m3: linear_geglu_sm90_fp8."""
    problem = refusal(x, weight, (*HALF_DTYPES, torch.float8_e4m3fn))
    if problem:
        return problem
    if weight.dim() != 2 or weight.shape[0] % 2 or x.shape[-1] != weight.shape[1]:
        return f"x {tuple(x.shape)} and W {tuple(weight.shape)} (W must be (2D, K))"
    K, D = weight.shape[1], weight.shape[0] // 2
    # TMA: 16-byte aligned bases and row strides, dense rows.
    per_16_bytes = 16 // x.element_size()
    if K < 16 or K % per_16_bytes or D % per_16_bytes:
        return f"K = {K}, D = {D} (multiples of {per_16_bytes}, K >= 16)"
    if weight.stride(1) != 1 or weight.stride(0) % per_16_bytes or weight.data_ptr() % 16:
        return f"W is not 16-byte aligned for TMA (strides {tuple(weight.stride())})"
    return None


def linear_geglu_sm90(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      approximate: str = "none", *, config: Optional[tuple] = None) -> torch.Tensor:
    """(x @ W^T + b) split in value | gate, value * gelu(gate); x (..., K), W (2D, K) -> (..., D), on sm_90.

    config: (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, CONSUMERS), one of CONFIGS or any other with BLOCK_M 64 or 128,
    BLOCK_N and BLOCK_K powers of two from 16 to 256 and 1 or 2 consumers; None: DEFAULT_CONFIG.
    Raises ValueError for inputs it does not take.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if x.dtype == torch.float8_e4m3fn:
        raise ValueError("linear_geglu_sm90: e4m3 operands take linear_geglu_sm90_fp8 (with their scales)")
    reason = supports(x, weight)
    if reason:
        raise ValueError(f"linear_geglu_sm90: {reason}")
    block_m, block_n, block_k, stages, consumers = config or DEFAULT_CONFIG
    if (block_m not in (64, 128) or consumers not in (1, 2) or stages < 2
            or any(v < 16 or v > 256 or v & (v - 1) for v in (block_n, block_k))):
        raise ValueError(f"linear_geglu_sm90: config {config}")
    out = x.new_empty((*x.shape[:-1], weight.shape[0] // 2))
    return _launch("linear_geglu_sm90", x, weight, bias, approximate == "tanh",
                   (block_m, block_n, block_k, stages, consumers), out)


def _launch(name: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], tanh: bool,
            config: tuple, out: torch.Tensor, scales: Optional[tuple] = None) -> torch.Tensor:
    """The kernel over x (..., K) and W (2D, K) into out (..., D), x and W already checked (supports); scales:
    (x_scale, w_scale, e4m3_scale, e4m3_amax) for e4m3 operands and output. name: the caller's, for errors."""
    block_m, block_n, block_k, stages, consumers = config
    K, D = weight.shape[1], weight.shape[0] // 2
    if bias is not None:
        if bias.numel() != 2 * D:
            raise ValueError(f"{name}: bias of {bias.numel()} values for W {tuple(weight.shape)}")
        bias = bias.reshape(-1).contiguous()
    x2 = x.reshape(-1, K)
    if x2.stride(1) != 1 or x2.stride(0) % (16 // x.element_size()) or x2.data_ptr() % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)  # a fresh, aligned copy TMA can read
    M = x2.shape[0]
    if M == 0:
        return out

    tiles = -(-M // block_m) * -(-D // block_n)
    programs = min(tiles, sm_count(x2))
    dummy = bias if bias is not None else weight  # stands in for absent pointers (never read)
    _linear_geglu_sm90_kernel[(programs,)](
        descriptor(x2, [block_m, block_k]), descriptor(weight[:D], [block_n, block_k]),
        descriptor(weight[D:], [block_n, block_k]), dummy,
        descriptor(out.view(M, D), [block_m, block_n]), *(scales or (dummy,) * 4), M, D, K, programs,
        HAS_BIAS=bias is not None, TANH=tanh, STAGES=stages, CONSUMERS=consumers, GROUP_M=8, FP8=scales is not None,
        num_warps=4,
    )
    return out


def linear_geglu_sm90_fp8(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor,
                          bias: Optional[torch.Tensor], e4m3_scale: torch.Tensor, e4m3_amax: torch.Tensor,
                          approximate: str = "none", *, config: Optional[tuple] = None) -> torch.Tensor:
    """GEGLU((x * x_scale) @ (W * w_scale)^T + b) in e4m3, as out / e4m3_scale saturated, max |out| into e4m3_amax:
    the FP8 mode's feed-forward first half in one kernel (engines/fast/fp8.py). x (..., K) and W (2D, K) e4m3; the
    scales and amax 1-element float32 tensors; b (2D,) fp16 or bf16. config: FP8_CONFIG when None."""
    if x.dtype != E4M3 or weight.dtype != E4M3:
        raise ValueError(f"linear_geglu_sm90_fp8: x and W must be e4m3, got {x.dtype} / {weight.dtype}")
    reason = supports(x, weight)
    if reason:
        raise ValueError(f"linear_geglu_sm90_fp8: {reason}")
    reason = scale_refusal(x, x_scale=x_scale, w_scale=w_scale)
    if reason:
        raise ValueError(f"linear_geglu_sm90_fp8: {reason}")
    if not check_fp8_output(e4m3_scale, e4m3_amax, x):
        raise ValueError("linear_geglu_sm90_fp8: e4m3_scale and e4m3_amax are required")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    out = torch.empty((*x.shape[:-1], weight.shape[0] // 2), dtype=E4M3, device=x.device)
    return _launch("linear_geglu_sm90_fp8", x, weight, bias, approximate == "tanh", config or FP8_CONFIG, out,
                   (x_scale, w_scale, e4m3_scale, e4m3_amax))
