"""GroupNorm with each block of groups staged in a thread-block cluster's shared memory (Hopper), written in Gluon.

    s = x + add[n, c]                             (add optional; x may be the channel concatenation [x, x2])
    y = act((s - mean[n, g]) * rstd[n, g] * weight[c] + bias[c]) * scale
                                                  (optionally written in e4m3 as y / e4m3_scale, max |y| recorded)

the same function as kernels/group_norm.py (whose reference the tests use), for the UNet's 64x64 level, where that
module's split kernels take two launches and three passes over the tensor (13.2 us at SD1.5's 2 x 320 x 64 x 64
+ time embedding + SiLU on an H200, where a copy of the tensor takes 2.6), and where the register-held cluster
kernel (group_norm_cluster.py) loses: it spends about 4.5 registers on each value it holds, so a CTA's share of a
64x64 group does not fit (benchmarks/README.md, twenty-seventh session).

A cluster of CTAS CTAs takes a sample's block of GROUPS adjacent groups (their channels contiguous in each NHWC
row: 40 channels, 80 bytes, for SD1.5's 10-channel groups), CTA r the rows [r * ROWS, (r + 1) * ROWS):
  1. every thread issues asynchronous copies (cp.async, 16 bytes each) of its share of the CTA's rows into shared
     memory, all at once, so the whole read is in flight together, and no register holds it;
  2. from shared memory, CHUNK rows at a time: each group's mean over the CTA's rows, then its M2 about that mean;
  3. the partials go to global memory, barrier.cluster, every CTA merges them (Chan et al.), as the cluster
     kernel does;
  4. from shared memory again, normalize and store.
x is read once and y written once, in one launch. Like the cluster kernel's, its layouts split a leading axis over the
cluster's CTAs, and every reduction stays within a CTA (Triton 3.6 cannot reduce across one). Layouts replicated
over the cluster instead compiled too, but then Triton stores only from CTA 0 (it takes the other copies for
duplicates): the first version of this kernel, offline.

Only for sm_90. group_norm.py's launcher runs it when asked by name (path="staged") and, by default, in place of the
kernels named in its STAGED_TAKES (empty until it is timed on a GPU: benchmarks/README.md).
"""

from __future__ import annotations

import torch

from . import next_pow2
from .group_norm_cluster import CTAS, DTYPES, machine_refusal
from .gluon_hopper import async_copy, cp_async_load, gl, gluon, thread_barrier

# Rows a CTA normalizes per step from shared memory (its registers hold CHUNK x BLOCK_C values at a time).
CHUNK = 64
# Shared memory a CTA may stage (bytes): the rows it holds x BLOCK_C lanes x the element size.
MAX_STAGED_BYTES = 160 * 1024
# 16-byte copies a thread issues at most: every copy's address is live until they are all issued. Offline (Triton
# 3.6's ptxas, fp16), SD1.5's 64x64 level at 4 warps is 32 copies a thread in 172 registers, its concatenation (two
# sources) 64 copies at the 255-register limit (a draft of the kernel spilled there); at 8 warps, 136.
MAX_COPIES_PER_THREAD = 32
MIN_WARPS, MAX_WARPS = 4, 16


def groups_per_block(group_size: int, element_size: int) -> int:
    """Fewest adjacent groups whose channels start every block on a 16-byte boundary (cp.async's vector): 4 of
    SD1.5's 10-channel groups (80 bytes in fp16), 2 of SDXL's 20, 1 of 40."""
    per_vector = 16 // element_size
    groups = 1
    while (groups * group_size) % per_vector:
        groups += 1
    return groups


def block_lanes(group_size: int, element_size: int) -> int:
    return next_pow2(groups_per_block(group_size, element_size) * group_size)


def warps_for(hw: int, group_size: int, element_size: int, concat: bool = False) -> int:
    """A CTA's warps: enough that no thread issues more than MAX_COPIES_PER_THREAD copies (a concatenation's two
    sources each copy the whole tile, masked), at least MIN_WARPS."""
    copies = (hw // CTAS) * block_lanes(group_size, element_size) * element_size // 16 * (2 if concat else 1)
    threads = -(-copies // MAX_COPIES_PER_THREAD)
    return min(MAX_WARPS, max(MIN_WARPS, next_pow2(threads) // 32))


def refusal(x: torch.Tensor, hw: int, num_groups: int, group_size: int) -> str | None:
    """Why the kernel cannot take x (N, C1, H, W), the first source of a concatenation or the whole input, for
    num_groups groups of group_size channels over all sources (None: it can)."""
    problem = machine_refusal(x.device)
    if problem:
        return problem
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype}"
    if not x.is_contiguous(memory_format=torch.channels_last):
        return "x is not dense channels_last"
    if (x.shape[1] * x.element_size()) % 16:
        return f"{x.shape[1]} channels a row do not end on a 16-byte boundary"
    groups = groups_per_block(group_size, x.element_size())
    if num_groups % groups:
        return f"{num_groups} groups do not split into blocks of {groups}"
    rows = hw // CTAS
    if hw % CTAS or rows % CHUNK:
        return f"{hw} rows do not split into {CTAS} CTAs of whole {CHUNK}-row chunks"
    if rows * block_lanes(group_size, x.element_size()) * x.element_size() > MAX_STAGED_BYTES:
        return f"{rows} rows x {groups * group_size} channels a CTA exceed its shared memory"
    return None


if gluon is not None:
    from .group_norm_cluster import _cluster_barrier, _everywhere_layout, _merged  # the cluster kernel's

    # Layouts whose first axis is split over the cluster (CTA bit i: index 2^i), so each CTA holds its own rows:
    # values the compiler took for copies on every CTA would be stored by one CTA only.
    @gluon.constexpr_function
    def _tile_layout(block_c, num_warps):
        """(CTA, row, channel): 8 consecutive channels (16 bytes in fp16) a thread, whole rows a warp."""
        per_thread = min(8, block_c)
        threads_c = min(32, block_c // per_thread)
        return gl.BlockedLayout([1, 1, per_thread], [1, 32 // threads_c, threads_c], [1, num_warps, 1], [2, 1, 0],
                                cga_layout=[[1, 0, 0], [2, 0, 0], [4, 0, 0]])

    @gluon.constexpr_function
    def _stage_layout():
        """Shared memory, row-major and unswizzled (a warp's 16-byte reads of whole rows hit every bank once), each
        CTA's own rows in its own."""
        return gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0], cga_layout=[[1, 0, 0], [2, 0, 0], [4, 0, 0]])

    @gluon.jit
    def _chunk(stage, add, k: gl.constexpr, layout: gl.constexpr, HAS_ADD: gl.constexpr, WRITE_SUM: gl.constexpr):
        """Chunk k of the staged rows in fp32: the sum s the norm sees (x + add, rounded to x's dtype if written)."""
        raw = stage.index(k).load(layout)
        v = raw.to(gl.float32)
        if HAS_ADD:
            v += add
        if WRITE_SUM:
            v = v.to(raw.dtype).to(gl.float32)
        return v

    @gluon.jit(do_not_specialize=["HW"])
    def _group_norm_staged_kernel(
        x_ptr, x2_ptr, add_ptr, sum_ptr, weight_ptr, bias_ptr, out_ptr, part_ptr, e4m3_scale_ptr, amax_ptr,
        HW, C1, C2, eps, out_scale, stride_add_n, stride_add_c,
        GROUP_SIZE: gl.constexpr, GROUPS: gl.constexpr, ROWS: gl.constexpr, CHUNK: gl.constexpr,
        BLOCK_C: gl.constexpr, HAS_X2: gl.constexpr, HAS_ADD: gl.constexpr, WRITE_SUM: gl.constexpr,
        HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr, APPLY_SILU: gl.constexpr, FP8_OUT: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        tile: gl.constexpr = _tile_layout(BLOCK_C, num_warps)
        everywhere: gl.constexpr = _everywhere_layout(num_warps)
        lanes: gl.constexpr = gl.SliceLayout(1, tile)  # (CTA, channel)
        CLUSTER: gl.constexpr = 8  # CTAS
        STEPS: gl.constexpr = ROWS // CHUNK
        blk = gl.program_id(0)  # the cluster's groups: blk * GROUPS, ...
        n = gl.program_id(1)
        r = gl.arange(0, CLUSTER, layout=gl.SliceLayout(1, gl.SliceLayout(2, tile)))
        i = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, gl.SliceLayout(2, tile)))
        j = gl.arange(0, BLOCK_C, layout=gl.SliceLayout(0, gl.SliceLayout(1, tile)))
        lane = j[None, None, :]
        c = blk * (GROUPS * GROUP_SIZE) + lane
        c_ok = lane < GROUPS * GROUP_SIZE
        tile_ok = c_ok & (r[:, None, None] >= 0) & (i[None, :, None] >= 0)  # the lanes that are channels, everywhere
        in_group = gl.arange(0, BLOCK_C, layout=gl.SliceLayout(0, lanes))[None, :] // GROUP_SIZE  # (1, BLOCK_C)
        rank = gl.arange(0, CLUSTER, layout=gl.SliceLayout(1, lanes))  # r again, as the per-CTA partials hold it
        first = r[:, None, None] * ROWS + i[None, :, None]  # the CTA's rows of chunk 0
        C = C1 + C2
        sample = n.to(gl.int64) * HW
        add = gl.zeros([CLUSTER, 1, BLOCK_C], gl.float32, tile)  # the time embedding, per channel
        if HAS_ADD:
            add += gl.load(add_ptr + n * stride_add_n + c * stride_add_c, mask=c_ok, other=0.0).to(gl.float32)

        # 1. The CTA's rows into shared memory, every copy in flight at once. x, out and the sum are dense
        # channels_last (C channels a row); with a concatenation x has C1 and x2 C2.
        stage = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STEPS, CLUSTER, CHUNK, BLOCK_C], _stage_layout())
        for k in gl.static_range(STEPS):
            rows = sample + first + k * CHUNK
            if HAS_X2:
                cp_async_load(stage.index(k), x_ptr + rows * C1 + c, mask=tile_ok & (c < C1))
                cp_async_load(stage.index(k), x2_ptr + rows * C2 + (c - C1), mask=tile_ok & (c >= C1))
            else:
                cp_async_load(stage.index(k), x_ptr + rows * C + c, mask=tile_ok)
        async_copy.commit_group()
        async_copy.wait_group(0)
        thread_barrier()  # every thread's copies, seen by all

        # 2. Each group's mean over this CTA's rows, then its M2 about it (the lanes past the block's channels,
        # never copied, are left out).
        count = (ROWS * GROUP_SIZE) * 1.0
        base = (n * gl.num_programs(0) + blk) * (2 * CLUSTER * GROUPS)
        lane_sum = gl.zeros([CLUSTER, BLOCK_C], gl.float32, lanes)
        for k in gl.static_range(STEPS):
            v = _chunk(stage, add, k, tile, HAS_ADD, WRITE_SUM)
            if WRITE_SUM:  # the sum the caller gets back (x's dtype, as out's)
                gl.store(sum_ptr + (sample + first + k * CHUNK) * C + c, v.to(sum_ptr.dtype.element_ty),
                         mask=tile_ok)
            lane_sum += gl.sum(gl.where(tile_ok, v, 0.0), axis=1)
        mean_lane = gl.zeros([CLUSTER, BLOCK_C], gl.float32, lanes)
        for h in gl.static_range(GROUPS):
            mean_h = gl.sum(gl.where(in_group == h, lane_sum, 0.0), axis=1) / count  # (CTA,)
            mean_lane = gl.where(in_group == h, mean_h[:, None], mean_lane)
            gl.store(part_ptr + base + h * (2 * CLUSTER) + rank, mean_h)
        lane_m2 = gl.zeros([CLUSTER, BLOCK_C], gl.float32, lanes)
        for k in gl.static_range(STEPS):
            v = _chunk(stage, add, k, tile, HAS_ADD, WRITE_SUM)
            d = gl.where(tile_ok, v - mean_lane[:, None, :], 0.0)
            lane_m2 += gl.sum(d * d, axis=1)
        for h in gl.static_range(GROUPS):
            m2_h = gl.sum(gl.where(in_group == h, lane_m2, 0.0), axis=1)
            gl.store(part_ptr + base + h * (2 * CLUSTER) + CLUSTER + rank, m2_h)

        # 3. The cluster meets; every CTA merges every group's partials.
        _cluster_barrier()
        kk = gl.arange(0, CLUSTER, layout=everywhere)
        rstd_lane = gl.zeros([CLUSTER, BLOCK_C], gl.float32, lanes)
        for h in gl.static_range(GROUPS):
            mean, rstd = _merged(part_ptr + base + h * (2 * CLUSTER), kk, count, eps, CLUSTER)
            mean_lane = gl.where(in_group == h, mean, mean_lane)
            rstd_lane = gl.where(in_group == h, rstd, rstd_lane)

        # 4. Normalize from shared memory and store.
        center = mean_lane[:, None, :]  # subtracted before scaling: no cancellation when |mean| >> std
        scale = rstd_lane[:, None, :]
        if HAS_WEIGHT:
            scale = scale * gl.load(weight_ptr + c, mask=c_ok, other=0.0).to(gl.float32)
        shift = gl.zeros([1, 1, BLOCK_C], gl.float32, tile)
        if HAS_BIAS:
            shift += gl.load(bias_ptr + c, mask=c_ok, other=0.0).to(gl.float32)
        if FP8_OUT:
            inv_e4m3 = 1.0 / gl.load(e4m3_scale_ptr)
            peak = gl.zeros([CLUSTER, BLOCK_C], gl.float32, lanes)
        for k in gl.static_range(STEPS):
            v = _chunk(stage, add, k, tile, HAS_ADD, WRITE_SUM)
            y = (v - center) * scale + shift
            if APPLY_SILU:
                y = y / (1.0 + gl.exp(-y))
            y = y * out_scale
            offs = (sample + first + k * CHUNK) * C + c
            if FP8_OUT:
                q = gl.minimum(gl.maximum(y * inv_e4m3, -448.0), 448.0)
                gl.store(out_ptr + offs, q.to(gl.float8e4nv), mask=tile_ok)
                peak = gl.maximum(peak, gl.max(gl.where(tile_ok, gl.abs(y), 0.0), axis=1))
            else:
                gl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=tile_ok)
        if FP8_OUT:
            # max |y| per CTA, one relaxed atomic each: only the value after the kernel is read.
            gl.atomic_max(amax_ptr + rank * 0, gl.max(peak, axis=1), sem="relaxed")


def launch_group_norm_staged(x, x2, add, s, weight, bias, out, num_groups: int, eps: float, silu: bool,
                             out_scale: float, add_strides: tuple, e4m3: tuple | None = None,
                             num_warps: int | None = None) -> None:
    """Run the kernel for group_norm.py's launcher, which has checked the call against ``refusal``: x (N, C1, H, W)
    and x2 (N, C2, H, W) or None, out and s (the sum, or None) dense channels_last; add (N, C) or None, add_strides
    its (n, c) strides; e4m3: (scale, amax) for y written in e4m3 (as group_norm_cluster's launcher takes them)."""
    N, C1, H, W = x.shape
    C2 = 0 if x2 is None else x2.shape[1]
    hw, group_size = H * W, (C1 + C2) // num_groups
    groups = groups_per_block(group_size, x.element_size())
    partials = torch.empty(N * num_groups * 2 * CTAS, dtype=torch.float32, device=x.device)
    dummy = x
    _group_norm_staged_kernel[(num_groups // groups, N)](
        x, dummy if x2 is None else x2, dummy if add is None else add, dummy if s is None else s,
        dummy if weight is None else weight, dummy if bias is None else bias, out, partials,
        *(e4m3 or (partials, partials)), hw, C1, C2, eps, out_scale, *add_strides,
        GROUP_SIZE=group_size, GROUPS=groups, ROWS=hw // CTAS, CHUNK=CHUNK,
        BLOCK_C=block_lanes(group_size, x.element_size()),
        HAS_X2=x2 is not None, HAS_ADD=add is not None, WRITE_SUM=s is not None, HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None, APPLY_SILU=silu, FP8_OUT=e4m3 is not None,
        num_warps=num_warps or warps_for(hw, group_size, x.element_size(), x2 is not None), num_ctas=CTAS,
    )
