"""GroupNorm with each group spread over a thread-block cluster (Hopper), written in Gluon.

    s = x + add[n, c]                             (add optional; x may be the channel concatenation [x, x2])
    y = act((s - mean[n, g]) * rstd[n, g] * weight[c] + bias[c]) * output_scale
                                                  (optionally written in e4m3 as y / e4m3_scale, max |y| recorded
                                                   into e4m3_amax)

the same function as kernels/group_norm.py (tested against group_norm_reference.py), for the shapes where its
looped kernel is slow: groups of up to LOOPED_MAX_ROWS rows at a small batch. At CFG batch 2 a UNet GroupNorm has
only 64 (sample, group) pairs, and the looped kernel gives each pair one SM that sweeps its rows twice.

Here each pair gets a cluster of CTAS CTAs, which the GPU schedules together. CTA r holds rows
[r * ROWS, (r + 1) * ROWS) of the group in registers (a layout whose first axis is split over the cluster), so x is
read once, y written once, in one launch:
  1. each CTA reduces its rows to a (mean, M2) partial (M2: the sum of squared deviations) and stores it;
  2. barrier.cluster: all CTAs of the cluster are resident together, so unlike a grid-wide spin barrier (whose
     programs need not all be resident at once) this wait cannot hang;
  3. every CTA loads its cluster's partials past L1 and merges them (Chan et al.: mean = sum n_k m_k / n,
     M2 = sum M2_k + n_k (m_k - mean)^2), then normalizes the rows it holds.
The reductions are per CTA, by hand: with Triton 3.6 a gl.sum across the cluster aborts the compiler and Triton's
own num_ctas path cannot plan any reduction.

Only for sm_90. group_norm.py's launcher takes it where its CLUSTER_CTAS_PER_SM allows: small batches, where its
one cluster a group does not outnumber the SMs by much.
"""

from __future__ import annotations

import torch

from ._triton import next_pow2
from .gluon_hopper import device_refusal, gl, gluon

CTAS = 8  # a cluster: the portable maximum. With 4 warps the best of 2, 4, 8 CTAs x 4, 8 warps wherever it won.
# Warps a CTA: enough that each thread holds at most VALUES_PER_THREAD of the CTA's ROWS x BLOCK_C values (fp32),
# at least MIN_WARPS. On an H200 (benchmarks/kernels/bench_group_norm_cluster.py), against the looped kernel, us:
# with 4 warps every UNet call of 32 values a thread won (2 x 640 x 32 x 32: 11.0 -> 7.6), those of 64 split (SDXL's
# 2 x 1280 x 32 x 32 + time embedding: 17.4 -> 18.5); at 8 warps the 64-value concatenations won (2 x [1280, 640] x
# 32 x 32: 22.7 -> 16.6), at 16 the 128-value ones (2 x [1280, 1280]: 35.3 -> 26.6). Left: SDXL's 64-value groups
# without a concatenation were fastest at 16 warps (17.4 -> 14.9), not the rule's 8 (18.4).
# Writing e4m3 (the FP8 mode's ResNet norms), groups without a concatenation ran fastest at half as many values a
# thread (E4M3_VALUES_PER_THREAD; us: 2 x 640 x 32 x 32 + time embedding 12.3 at 4 warps -> 9.8 at 8; SDXL's 2 x 1280
# x 32 x 32 21.3 at 8 -> 18.1 at 16), the concatenations did not ([1280, 640]: 21.8 at 8, 24.7 at 16). Not for lack
# of registers: compiled for sm_90a, 2 x 640 takes 146 registers a thread in fp16 and 150 in e4m3 at 4 warps, and
# neither spills.
MIN_WARPS = 4
MAX_WARPS = 16
VALUES_PER_THREAD = 32
E4M3_VALUES_PER_THREAD = 16
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Layouts split over a cluster's CTAs (cga_layout) came with Triton 3.6; 3.5's Gluon describes CTA splits otherwise.
HAS_CLUSTER_LAYOUTS = gl is not None and "cga_layout" in getattr(gl.BlockedLayout, "__dataclass_fields__", {})


def rows_per_cta(hw: int) -> int:
    return hw // CTAS


def fits(hw: int, group_size: int) -> bool:
    """Whether a group of hw rows x group_size channels suits the kernel: the rows split evenly over the cluster
    into a power of two each (SD's 32x32 and 16x16 levels: 128 and 32), and fit its registers."""
    rows = rows_per_cta(hw)
    return (hw % CTAS == 0 and rows >= 1 and rows & (rows - 1) == 0
            and rows * next_pow2(group_size) <= VALUES_PER_THREAD * 32 * MAX_WARPS)


def warps_for(hw: int, group_size: int, e4m3: bool = False, concat: bool = False) -> int:
    """The kernel's warps a CTA for a group that ``fits``; e4m3: y written in e4m3; concat: x is a concatenation."""
    values = E4M3_VALUES_PER_THREAD if e4m3 and not concat else VALUES_PER_THREAD
    threads = rows_per_cta(hw) * next_pow2(group_size) // values
    return min(MAX_WARPS, max(MIN_WARPS, next_pow2(threads) // 32))


def machine_refusal(device: torch.device) -> str | None:
    """Why the kernel cannot run on this device with this Triton at all (None: it can)."""
    problem = device_refusal(device)
    if problem:
        return problem
    if not HAS_CLUSTER_LAYOUTS:
        return "this Triton's Gluon has no cluster layouts (cga_layout: Triton 3.6 or later)"
    return None


def refusal(x: torch.Tensor, hw: int, group_size: int) -> str | None:
    """Why the kernel cannot take x (None: it can)."""
    problem = machine_refusal(x.device)
    if problem:
        return problem
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype}"
    if not fits(hw, group_size):
        return f"a group of {hw} rows x {group_size} channels does not split into 8 x (a power of two) rows " \
               "that fit a cluster's registers"
    return None


if gluon is not None:

    # The kernel's layouts, made at compile time from its constexprs (Triton 3.6 takes no cluster layout written
    # inside a kernel: its nested lists stay Triton values). Self-contained: Triton rejects calls to plain functions.
    @gluon.constexpr_function
    def _tile_layout(block_c, num_warps):
        """(CTA, row, channel), the first axis split over a cluster of 8 (CTA bit i: index 2^i). Along a row, pairs
        of channels a thread (more where a row has over 64), whole rows a warp."""
        per_thread = max(min(2, block_c), block_c // 32)
        threads_c = block_c // per_thread
        return gl.BlockedLayout([1, 1, per_thread], [1, 32 // threads_c, threads_c], [1, num_warps, 1], [2, 1, 0],
                                cga_layout=[[1, 0, 0], [2, 0, 0], [4, 0, 0]])

    @gluon.constexpr_function
    def _everywhere_layout(num_warps):
        """A vector held whole by every CTA of the cluster."""
        return gl.BlockedLayout([1], [32], [num_warps], [0], cga_layout=[[0], [0], [0]])

    @gluon.jit
    def _cluster_barrier():
        """Every thread of every CTA in the cluster waits here; stores before it are seen by loads after it."""
        gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
                                  "mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _merged(part_ptr, k, count, eps, CLUSTER: gl.constexpr):
        """A group's mean and rstd from its CLUSTER (mean, M2) partials at part_ptr, the means then the M2s, each
        over count values, loaded past L1 (other SMs wrote them): Chan et al., mean = sum n_k m_k / n,
        M2 = sum M2_k + n_k (m_k - mean)^2, with equal counts. k: arange(CLUSTER), held whole by every CTA."""
        mean_k = gl.load(part_ptr + k, cache_modifier=".cg")
        m2_k = gl.load(part_ptr + CLUSTER + k, cache_modifier=".cg")
        mean = gl.sum(mean_k, axis=0) / CLUSTER
        m2 = gl.sum(m2_k + count * (mean_k - mean) * (mean_k - mean), axis=0)
        return mean, gl.rsqrt(m2 / (count * CLUSTER) + eps)

    # HW is not specialized on (kernels/__init__.py), its rows per CTA are: the group's tile is held in registers.
    @gluon.jit(do_not_specialize=["HW"])
    def _group_norm_cluster_kernel(
        x_ptr, x2_ptr, add_ptr, sum_ptr, weight_ptr, bias_ptr, out_ptr, part_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
        HW, C1, C2, eps, output_scale,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: gl.constexpr, ROWS: gl.constexpr, BLOCK_C: gl.constexpr,
        HAS_X2: gl.constexpr, HAS_ADD: gl.constexpr, WRITE_SUM: gl.constexpr, HAS_WEIGHT: gl.constexpr,
        HAS_BIAS: gl.constexpr, APPLY_SILU: gl.constexpr, FP8_OUT: gl.constexpr, num_warps: gl.constexpr,
    ):
        # tile: (CTA, row, channel), the first axis split over the cluster's CTAs; everywhere: the same values on
        # every CTA. Built in Python (Triton 3.6 takes no nested list of the kernel's for a cluster layout).
        tile: gl.constexpr = _tile_layout(BLOCK_C, num_warps)
        everywhere: gl.constexpr = _everywhere_layout(num_warps)
        CLUSTER: gl.constexpr = 8  # CTAS
        g = gl.program_id(0)
        n = gl.program_id(1)
        r = gl.arange(0, CLUSTER, layout=gl.SliceLayout(1, gl.SliceLayout(2, tile)))
        i = gl.arange(0, ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, tile)))
        j = gl.arange(0, BLOCK_C, layout=gl.SliceLayout(0, gl.SliceLayout(1, tile)))
        rows = r[:, None, None] * ROWS + i[None, :, None]
        lane = j[None, None, :]
        c = g * GROUP_SIZE + lane
        c_ok = lane < GROUP_SIZE
        mask = (rows < HW) & c_ok
        # out, the sum and x itself (when not concatenated) share out's strides.
        offs = n.to(gl.int64) * stride_n + rows * stride_hw + c * stride_c
        if HAS_X2:  # [x, x2] along channels, both dense channels_last, read in place
            o1 = n.to(gl.int64) * HW * C1 + rows * C1 + c
            o2 = n.to(gl.int64) * HW * C2 + rows * C2 + (c - C1)
            raw = gl.load(x_ptr + o1, mask=mask & (c < C1), other=0.0)
            v = raw.to(gl.float32) + gl.load(x2_ptr + o2, mask=mask & (c >= C1), other=0.0).to(gl.float32)
        else:
            raw = gl.load(x_ptr + offs, mask=mask, other=0.0)
            v = raw.to(gl.float32)
        if HAS_ADD:
            v += gl.load(add_ptr + n * stride_add_n + c * stride_add_c, mask=c_ok, other=0.0).to(gl.float32)
        if WRITE_SUM:  # normalize the rounded sum the caller gets back (x's dtype, as out's)
            s = v.to(raw.dtype)
            gl.store(sum_ptr + offs, s, mask=mask)
            v = s.to(gl.float32)

        # 1. This CTA's rows (every CTA holds ROWS of them: the launcher asks HW = 8 x ROWS): mean and M2. The
        # lanes past the group's channels loaded zeros.
        count = (ROWS * GROUP_SIZE) * 1.0
        mean_r = gl.sum(gl.sum(v, axis=2), axis=1) / count
        d = gl.where(mask, v - mean_r[:, None, None], 0.0)
        m2_r = gl.sum(gl.sum(d * d, axis=2), axis=1)
        base = (n * gl.num_programs(0) + g) * (2 * CLUSTER)
        gl.store(part_ptr + base + r, mean_r)
        gl.store(part_ptr + base + CLUSTER + r, m2_r)
        # 2. The cluster meets.
        _cluster_barrier()
        # 3. Every CTA merges all partials (loaded past L1: other SMs wrote them); equal counts.
        mean, rstd = _merged(part_ptr + base, gl.arange(0, CLUSTER, layout=everywhere), count, eps, CLUSTER)

        y = (v - mean) * rstd
        if HAS_WEIGHT:
            y = y * gl.load(weight_ptr + c, mask=c_ok, other=0.0).to(gl.float32)
        if HAS_BIAS:
            y = y + gl.load(bias_ptr + c, mask=c_ok, other=0.0).to(gl.float32)
        if APPLY_SILU:
            y = y / (1.0 + gl.exp(-y))
        y = y * output_scale
        if FP8_OUT:  # as kernels/fp8.py's to_e4m3 and record_amax, which are plain Triton
            q = gl.minimum(gl.maximum(y * (1.0 / gl.load(e4m3_scale_ptr)), -448.0), 448.0)
            gl.store(out_ptr + offs, q.to(gl.float8e4nv), mask=mask)
            # max |y| per CTA (a max across the cluster is the cross-CTA reduction Triton 3.6 cannot compile),
            # one relaxed atomic each: only the value after the kernel is read.
            peak = gl.max(gl.max(gl.where(mask, gl.abs(y), 0.0), axis=2), axis=1)
            gl.atomic_max(e4m3_amax_ptr + r * 0, peak, sem="relaxed")
        else:
            gl.store(out_ptr + offs, y.to(raw.dtype), mask=mask)


def launch_group_norm_cluster(x, x2, add, s, weight, bias, out, num_groups: int, eps: float, silu: bool,
                              output_scale: float, strides: tuple, add_strides: tuple, num_warps: int | None = None,
                              e4m3_scale: torch.Tensor | None = None, e4m3_amax: torch.Tensor | None = None) -> None:
    """Run the kernel for group_norm.py's launcher, which has checked the call against ``refusal`` and laid out
    the tensors: x (N, C1, H, W) and x2 (N, C2, H, W) or None, both dense channels_last when x2 is given; add
    (N, C) or None; s (the sum, or None), out: y's buffer (e4m3 with ``e4m3_scale``); output_scale: multiplies y
    after the SiLU; strides: out's (n, c, merged h*w); add_strides: add's (n, c); num_warps: a CTA's (None:
    ``warps_for``); e4m3_scale, e4m3_amax: checked 1-element float32 tensors (both or neither): y written as
    y / e4m3_scale in e4m3, max |y| into e4m3_amax."""
    N, C1, H, W = x.shape
    C2 = 0 if x2 is None else x2.shape[1]
    hw, group_size = H * W, (C1 + C2) // num_groups
    block_c = next_pow2(group_size)
    partials = torch.empty(N * num_groups * 2 * CTAS, dtype=torch.float32, device=x.device)
    fp8 = e4m3_scale is not None
    dummy = x
    _group_norm_cluster_kernel[(num_groups, N)](
        x, dummy if x2 is None else x2, dummy if add is None else add, dummy if s is None else s,
        dummy if weight is None else weight, dummy if bias is None else bias, out, partials,
        e4m3_scale if fp8 else partials, e4m3_amax if fp8 else partials, hw, C1, C2, eps, output_scale,
        *strides, *add_strides,
        GROUP_SIZE=group_size, ROWS=rows_per_cta(hw), BLOCK_C=block_c,
        HAS_X2=x2 is not None, HAS_ADD=add is not None, WRITE_SUM=s is not None, HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None, APPLY_SILU=silu, FP8_OUT=fp8,
        num_warps=num_warps or warps_for(hw, group_size, fp8, x2 is not None), num_ctas=CTAS,
    )
