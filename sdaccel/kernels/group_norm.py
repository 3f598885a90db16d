"""GroupNorm on (N, C, H, W) activations, with the ResNet-block fusions: path choice, launcher and public op.

    s = x + skip + add[n, c]                      (skip and add optional)
    y = (s - mean[n, g]) * rstd[n, g] * weight[c] + bias[c]
    y = silu(y) = y * sigmoid(y)                  (optional)
    y = y * output_scale                          (default 1.0; a VAE decoder whose activations are kept scaled down
                                                   to stay inside fp16, engines/fast/vae_scaling.py)
    y in e4m3 (optional): y / e4m3_scale, saturated, for an FP8 convolution; max |y| recorded into e4m3_amax
                                                  (kernels/fp8.py)

mean and var run over the C/G channels of group g and all H*W positions of sample n; rstd = 1 / sqrt(var + eps).
x may also be the channel concatenation [x, concat] (a UNet up block's skip connection), read from both in place.

Layout: channels_last (NHWC in memory) is the fast path; contiguous NCHW works too (same kernels, different strides).
The output keeps x's memory format.

Four paths (the kernels are in group_norm_kernels.py and group_norm_cluster.py). At SD1.5 shapes there are only
N*G = 64 (sample, group) pairs, far too few programs for a large GPU when each pair's group is large, so the launcher
picks by the group's size (``default_path``):
  single   the group's tile fits one program's registers (SINGLE_PASS_MAX_TILE: the UNet's 8x8 and most 16x16
           levels): one launch, one read.
  looped   up to LOOPED_MAX_ROWS rows (the 32x32 level, 16x16 at 2560 channels): one program per pair sweeps its
           group twice; one launch and no partials beat the split kernels' second launch there.
  cluster  where looped would run, on a Hopper GPU at small batches (``cluster_takes``): each group over a cluster of
           8 CTAs, read once, one launch.
  split    more rows (the 64x64 level, the VAE): a statistics pass writes per-chunk partials, which a normalize pass
           merges (Chan et al.'s parallel variance), over enough programs to fill the GPU.
``launch_group_norm(..., path=...)`` forces one.

Names, in every layer (reference, launcher, registered op, public op): ``output_scale`` the float multiplier,
``e4m3_scale`` / ``e4m3_amax`` the FP8 output's 1-element fp32 tensors.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import group_norm_cluster as cluster
from . import group_norm_kernels as kernels
from ._triton import compiling, launchable, next_pow2, parallel_target, register_triton_op, sm_count, use_triton
from .fp8 import check_fp8_output
from .group_norm_kernels import GroupNormCall, prepare_call
from .group_norm_reference import group_norm_reference

__all__ = ["group_norm", "group_norm_reference", "launch_group_norm", "default_path", "cluster_takes",
           "pick_channel_block", "single_pass_fits", "looped_fits", "PATHS"]

PATHS = ("single", "looped", "split", "cluster")

# ------------------------------------------------------------ tuning constants

# Tiles of the looped and split kernels' row loops in flight (Triton's software pipelining of the loads). Unpipelined
# (1, also what Triton does unasked), one program waits out each tile's load: on an H100, 3 took a GroupNorm + SiLU
# of 16 x 320 x 64 x 64 from 89.8 to 77.9 us, 1 x 256 x 256 x 256 (the VAE) from 85.7 to 56.5, and left SD1.5's
# CFG-batch-2 shapes within 1%.
LOOP_STAGES = 3

# Chunks' partial statistics merged per step of the normalize pass's gather (one step for up to 32 chunks, the
# usual count at SD sizes).
CHUNK_TILE = 32

# Largest padded group tile (rows x lanes, powers of two) the single-pass kernel holds in registers: 16K fp32
# values are 64 per thread at 8 warps. SD1.5's UNet at 512x512 sends every norm at 8x8 and most at 16x16 here;
# the 32x32 and 64x64 levels and the VAE go to the looped, cluster or split kernels.
SINGLE_PASS_MAX_TILE = 16384

# Most rows (H*W) a group may have to take the looped kernel (one program per sample and group, two sweeps over its
# rows, one launch) instead of the split ones. With few rows the split kernels' second launch and partials cost
# more than the looped kernel loses by running only N*G programs; with many, each program's serial sweeps do.
# On an H100, graphed, GroupNorm + SiLU (benchmarks/kernels/bench_group_norm_paths.py): 2 x 640 x 32 x 32 18.9 ->
# 11.3 us, 2 x 2560 x 16 x 16 18.3 -> 11.3, 16 x 640 x 32 x 32 48.7 -> 29.7; but 2 x 320 x 64 x 64 19.3 -> 26.1 and
# the VAE's 1 x 128 x 512 x 512 117 -> 706.
LOOPED_MAX_ROWS = 1024

# The split kernels' channel blocks (at most SPLIT_MAX_BLOCK_C lanes, pick_channel_block) and elements per row-loop
# tile (the tile_elems default), and the looped kernel's tile. Narrow blocks spread a small call over the SMs along
# its channels rather than over many short chunks of rows, whose partials the normalize pass must then gather. On
# an H200, graphed (benchmarks/kernels/bench_norm_sweep.py --rules), 64 lanes and 4096 values against 256 and 8192,
# us: SD1.5's 2 x 320 x 64 x 64 + time embedding + SiLU 17.3 -> 13.2, without SiLU 13.4 -> 9.8, the VAE decoder's
# 1 x 256 x 512 x 512 200.6 -> 140.0, SDXL's 2 x 640 x 64 x 64 15.3 -> 13.4. An up block's concatenations [x, skip]
# lost (SD1.5's 2 x [640, 320] x 64 x 64 28.6 -> 35.1, at CFG batch 16 168.6 -> 274.4, SDXL's 2 x [640, 320] x 128
# x 128 89.4 -> 138.2) and keep CONCAT_MAX_BLOCK_C and CONCAT_TILE_ELEMS. So ruled, one UNet call at CFG batch 2,
# alternated in one process: SD1.5 5.19 -> 5.15 ms, SDXL 28.55 -> 28.36 ms; CFG batch 16 unchanged.
SPLIT_MAX_BLOCK_C = 64
SPLIT_TILE_ELEMS = 4096
CONCAT_MAX_BLOCK_C = 256
CONCAT_TILE_ELEMS = 8192
LOOPED_TILE_ELEMS = 2048

# Where the looped kernel would run, a Hopper GPU takes the cluster kernel (group_norm_cluster.py: each group over a
# cluster of 8 CTAs, read once, one launch) while the launch has at most this many CTAs per SM. On an H200, graphed,
# us: CFG batch 2 (64 clusters, 512 CTAs, 3.9 an SM) at the UNet's own calls 2 x 640 x 32 x 32 + time embedding +
# SiLU 11.0 -> 7.6, the up block's [1280, 1280] x 16 x 16 concatenation 11.8 -> 6.4, 59 us less over SD1.5's 16 such
# calls, one UNet call 5.28 -> 5.18 ms; but CFG batch 16 (31 an SM) 16 x 640 x 32 x 32 27.9 -> 40.3. Not offered the
# split kernels' groups: at the 64x64 level it lost at CFG batch 2 (2 x 320 x 64 x 64 13.2 -> 15.3 without SiLU,
# SDXL's 2 x 640 x 64 x 64 + time embedding 21.1 -> 31.9 at its best warps). Calls that write e4m3 (the FP8 mode's
# ResNet norms at the 32x32 level) take it too: on an H200 one FP8 SD1.5 UNet call at CFG batch 2, alternated in one
# process, took 5.06 ms with them on the looped kernel and 4.95 on the cluster kernel at its e4m3 warps
# (group_norm_cluster.E4M3_VALUES_PER_THREAD), with the same error against fp32.
CLUSTER_CTAS_PER_SM = 4


# ---------------------------------------------------------------- path choice

def single_pass_fits(hw: int, group_size: int) -> bool:
    """Whether a group of hw rows x group_size channels fits the single-pass kernel's registers."""
    return next_pow2(hw) * next_pow2(group_size) <= SINGLE_PASS_MAX_TILE


def looped_fits(hw: int) -> bool:
    """Whether a group of hw rows is short enough for the looped kernel to beat the split ones."""
    return hw <= LOOPED_MAX_ROWS


def default_path(hw: int, group_size: int) -> str:
    """The path the launcher takes by the group's size alone: "single", "looped" or "split". (On a Hopper GPU a
    "looped" call may then go to "cluster": ``cluster_takes``.)"""
    if single_pass_fits(hw, group_size):
        return "single"
    return "looped" if looped_fits(hw) else "split"


def cluster_takes(x: torch.Tensor, num_groups: int, hw: int, group_size: int) -> bool:
    """Whether the launcher's default sends a group the looped kernel would take to the cluster kernel: the GPU and
    the group suit it (cluster.refusal) and the launch has at most CLUSTER_CTAS_PER_SM CTAs an SM."""
    n_ctas = x.shape[0] * num_groups * cluster.CTAS
    return n_ctas <= CLUSTER_CTAS_PER_SM * sm_count(x) and cluster.refusal(x, hw, group_size) is None


def pick_channel_block(num_channels: int, num_groups: int, max_block_c: Optional[int] = None) -> tuple[int, int]:
    """(BLOCK_C, groups per block) for the split kernels' tiles, which hold whole groups.

    Fewest lanes in total (num_blocks * BLOCK_C), preferring blocks whose
    channel count is a multiple of 8 so every block starts 16-byte aligned
    (vector loads); larger blocks on ties; at most max_block_c lanes
    (None: SPLIT_MAX_BLOCK_C) unless one group needs more.
    """
    group_size = num_channels // num_groups
    smallest = max(16, next_pow2(group_size))
    best_key, best = None, None
    block_c = smallest
    while block_c <= max(max_block_c or SPLIT_MAX_BLOCK_C, smallest):
        groups_per_block = min(num_groups, block_c // group_size)
        if groups_per_block < num_groups:
            while groups_per_block > 1 and (groups_per_block * group_size) % 8:
                groups_per_block -= 1  # shrink for alignment
        aligned = groups_per_block == num_groups or (groups_per_block * group_size) % 8 == 0
        lanes = _cdiv(num_groups, groups_per_block) * block_c
        key = (not aligned, lanes, -block_c)
        if best_key is None or key < best_key:
            best_key, best = key, (block_c, groups_per_block)
        block_c *= 2
    return best


# ------------------------------------------------------------------- launcher

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _choose_path(call: GroupNormCall, path: Optional[str], traceable: bool) -> str:
    """``path`` checked, or the default's choice: ``default_path``, with "looped" sent to "cluster" where
    ``cluster_takes`` (and there is no skip)."""
    if path is None:
        path = default_path(call.HW, call.group_size)
        # The cluster kernel is Gluon, which torch.compile's tracing (traceable) cannot wrap.
        if (path == "looped" and call.skip is None and not traceable
                and cluster_takes(call.x, call.num_groups, call.HW, call.group_size)):
            path = "cluster"
    elif path == "cluster":  # asked for by name: checked here, as cluster_takes checks the default's choice
        problem = cluster.refusal(call.x, call.HW, call.group_size)
        if problem:
            raise ValueError(f"group_norm (cluster): {problem}")
        if call.skip is not None:
            raise ValueError("the cluster GroupNorm takes no skip")
    if path not in PATHS:
        raise ValueError(f"unknown group_norm path {path!r}")
    return path


def _launch_cluster(call: GroupNormCall, num_warps: Optional[int]) -> None:
    """The "cluster" path: each (sample, group) over a cluster of CTAs (group_norm_cluster.py)."""
    cluster.launch_group_norm_cluster(call.x, call.concat, call.add, call.s, call.weight, call.bias, call.out,
                                      call.num_groups, call.eps, call.silu, call.output_scale, call.strides,
                                      call.add_strides, num_warps, e4m3_scale=call.e4m3_scale,
                                      e4m3_amax=call.e4m3_amax)


def _per_group_arguments(call: GroupNormCall) -> tuple[tuple, dict]:
    """The arguments and flags of the single-pass and looped kernels (grid: groups x samples), which take the same."""
    args = (*call.triton_inputs(), *call.triton_affine(), call.out, *call.triton_e4m3(), call.HW, call.C, call.C1,
            call.C2, call.eps, call.output_scale, *call.strides, *call.add_strides)
    flags = dict(GROUP_SIZE=call.group_size, WRITE_SUM=call.s is not None, HAS_WEIGHT=call.weight is not None,
                 HAS_BIAS=call.bias is not None, APPLY_SILU=call.silu, FP8_OUT=call.fp8, **call.triton_flags())
    return args, flags


def _launch_single(call: GroupNormCall, traceable: bool) -> None:
    """The "single" path: one program per (group, sample) holds its whole group in registers."""
    if not single_pass_fits(call.HW, call.group_size):
        raise ValueError(f"a group of {call.HW} x {call.group_size} values is too large for the single-pass kernel")
    args, flags = _per_group_arguments(call)
    block_hw, block_c = next_pow2(call.HW), next_pow2(call.group_size)
    launchable(kernels.group_norm_single_kernel, traceable)[(call.num_groups, call.N)](
        *args, BLOCK_HW=block_hw, BLOCK_C=block_c, num_warps=8 if block_hw * block_c > 4096 else 4, **flags,
    )


def _launch_looped(call: GroupNormCall, traceable: bool, tile_elems: Optional[int], num_warps: Optional[int],
                   stages: int) -> None:
    """The "looped" path: one program per (group, sample) sweeps its group's rows twice, tile by tile."""
    args, flags = _per_group_arguments(call)
    block_c = next_pow2(call.group_size)
    block_hw = max(1, min((tile_elems or LOOPED_TILE_ELEMS) // block_c, next_pow2(call.HW)))
    if num_warps is None:  # few programs: more warps each to keep loads in flight
        num_warps = 8 if call.N * call.num_groups < parallel_target(call.x) else 4
    launchable(kernels.group_norm_looped_kernel, traceable)[(call.num_groups, call.N)](
        *args, BLOCK_HW=block_hw, BLOCK_C=block_c, num_warps=num_warps, LOOP_STAGES=stages, **flags,
    )


def _launch_split(call: GroupNormCall, traceable: bool, tile_elems: Optional[int], rows_per_chunk: Optional[int],
                  num_warps: Optional[int], stages: int, channel_block: Optional[tuple[int, int]]) -> None:
    """The "split" path: a statistics kernel writes each chunk of rows' partial mean and M2 per group, a normalize
    kernel merges them and writes y; both over (chunks, channel blocks, samples)."""
    x, N, HW, num_groups = call.x, call.N, call.HW, call.num_groups
    max_block_c, split_tile = ((SPLIT_MAX_BLOCK_C, SPLIT_TILE_ELEMS) if call.concat is None
                               else (CONCAT_MAX_BLOCK_C, CONCAT_TILE_ELEMS))
    block_c, groups_per_block = channel_block or pick_channel_block(call.C, num_groups, max_block_c)
    num_cblocks = _cdiv(num_groups, groups_per_block)
    block_g = next_pow2(groups_per_block)
    # Rows per chunk (one program's share), the larger of:
    #  - enough programs to fill the GPU (~2 per SM: each loops over its rows,
    #    which amortizes the fixed per-program cost of merging statistics);
    #  - few enough chunks that pass 2's gather of chunks x groups partials
    #    stays under 1/8 of its data: (HW/rows) * block_g * 8 <= rows * block_c,
    #    and under 4K partials in all.
    rows_wanted = _cdiv(N * HW * num_cblocks, parallel_target(x))
    block_hw = max(1, min((tile_elems or split_tile) // block_c, next_pow2(rows_wanted), next_pow2(HW)))
    max_chunks = max(1, min(256, 4096 // block_g))
    if rows_per_chunk is None:
        rows_for_gather = math.isqrt(_cdiv(HW * block_g * 8, block_c)) + 1
        rows_per_chunk = max(rows_wanted, rows_for_gather, _cdiv(HW, max_chunks))
    rows_per_chunk = min(_cdiv(rows_per_chunk, block_hw) * block_hw, _cdiv(HW, block_hw) * block_hw)
    num_chunks = _cdiv(HW, rows_per_chunk)
    if num_chunks > max(1, 4096 // block_g):
        raise ValueError(f"rows_per_chunk={rows_per_chunk} gives too many chunks ({num_chunks})")

    part_mean = torch.empty((N, num_chunks, num_groups), dtype=torch.float32, device=x.device)
    part_m2 = torch.empty_like(part_mean)
    grid = (num_chunks, num_cblocks, N)
    inputs = call.triton_inputs()
    sizes = (HW, call.C, call.C1, call.C2, num_groups, rows_per_chunk, num_chunks)
    common = dict(
        GROUP_SIZE=call.group_size, GROUPS_PER_BLOCK=groups_per_block,
        BLOCK_HW=block_hw, BLOCK_C=block_c, BLOCK_G=block_g, num_warps=num_warps or 4, LOOP_STAGES=stages,
        **call.triton_flags(),
    )
    write_sum = call.s is not None
    launchable(kernels.group_norm_stats_kernel, traceable)[grid](
        *inputs, part_mean, part_m2, *sizes, *call.strides, *call.add_strides, WRITE_SUM=write_sum, **common,
    )
    launchable(kernels.group_norm_apply_kernel, traceable)[grid](
        *inputs, *call.triton_affine(), call.out, *call.triton_e4m3(), part_mean, part_m2,
        *sizes, call.eps, call.output_scale, *call.strides, *call.add_strides,
        CHUNK_TILE=CHUNK_TILE, READ_SUM=write_sum,
        HAS_WEIGHT=call.weight is not None, HAS_BIAS=call.bias is not None, APPLY_SILU=call.silu, FP8_OUT=call.fp8,
        **common,
    )


def launch_group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    silu: bool,
    add: Optional[torch.Tensor],
    skip: Optional[torch.Tensor],
    write_sum: bool,
    *,
    output_scale: float = 1.0,
    tile_elems: Optional[int] = None,
    rows_per_chunk: Optional[int] = None,
    num_warps: Optional[int] = None,
    loop_stages: Optional[int] = None,
    path: Optional[str] = None,
    channel_block: Optional[tuple[int, int]] = None,
    concat: Optional[torch.Tensor] = None,
    traceable: bool = False,
    e4m3_scale: Optional[torch.Tensor] = None,
    e4m3_amax: Optional[torch.Tensor] = None,
):
    """Run the kernels; returns (y, s) with s None unless ``write_sum``.

    ``output_scale``: multiplies y after the SiLU (the sum is not scaled).
    ``e4m3_scale`` (with ``e4m3_amax``): y in e4m3, as y / e4m3_scale
    saturated, max |y| recorded into e4m3_amax (kernels/fp8.py).

    ``concat``: channels appended to x's (same N, H, W), read in place: the
    norm of torch.cat([x, concat], 1) without forming it (s is that
    concatenation, output channels_last).

    ``path``: one of PATHS: "single" (one program per sample and group holding
    the group in registers), "looped" (one program per sample and group, two
    sweeps over its rows), "split" (statistics and normalize kernels over
    chunks of rows), "cluster" (sm_90: each group held by a cluster of CTAs;
    no skip); None: ``default_path``, with "looped" sent to "cluster" where
    ``cluster_takes`` (and there is no skip).
    ``tile_elems`` (elements per loop iteration), ``num_warps`` and
    ``loop_stages`` (tiles of the row loop in flight; None: LOOP_STAGES) tune
    the looped and split kernels, ``rows_per_chunk`` and ``channel_block``
    ((BLOCK_C, groups per program); None: pick_channel_block) the split ones;
    the defaults pick them from the shape (``num_warps`` also sets the cluster
    kernel's warps a CTA). ``traceable``: called from the
    registered op (see ``launchable``).
    """
    call = prepare_call(x, num_groups, weight, bias, eps, silu, add, skip, write_sum, output_scale, concat, e4m3_scale,
                        e4m3_amax)
    path = _choose_path(call, path, traceable)
    stages = LOOP_STAGES if loop_stages is None else loop_stages
    if path == "cluster":
        _launch_cluster(call, num_warps)
    elif path == "single":
        _launch_single(call, traceable)
    elif path == "looped":
        _launch_looped(call, traceable, tile_elems, num_warps, stages)
    else:
        _launch_split(call, traceable, tile_elems, rows_per_chunk, num_warps, stages, channel_block)
    return call.out, call.s


# ------------------------------------------------------------------ public op

def _group_norm_run(x, num_groups, weight, bias, eps, silu, add, skip, write_sum, traceable, output_scale=1.0,
                    concat=None, e4m3_scale=None, e4m3_amax=None):
    """The reference where Triton cannot run, else the kernels: y, or (y, s)."""
    if not use_triton(x):
        return group_norm_reference(x, num_groups, weight, bias, eps, silu=silu, add=add, skip=skip,
                                    return_sum=write_sum, output_scale=output_scale, concat=concat,
                                    e4m3_scale=e4m3_scale, e4m3_amax=e4m3_amax)
    y, s = launch_group_norm(x, num_groups, weight, bias, eps, silu, add, skip, write_sum, output_scale=output_scale,
                             concat=concat, traceable=traceable, e4m3_scale=e4m3_scale, e4m3_amax=e4m3_amax)
    return (y, s) if write_sum else y


# Bodies of the registered ops (schemas are inferred from the annotations).
def _group_norm_op_body(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    silu: bool,
    add: Optional[torch.Tensor],
    skip: Optional[torch.Tensor],
    output_scale: float = 1.0,
    concat: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    return _group_norm_run(x, num_groups, weight, bias, eps, silu, add, skip, False, True, output_scale, concat)


def _group_norm_with_sum_op_body(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    silu: bool,
    add: Optional[torch.Tensor],
    skip: Optional[torch.Tensor],
    output_scale: float = 1.0,
    concat: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _group_norm_run(x, num_groups, weight, bias, eps, silu, add, skip, True, True, output_scale, concat)


_group_norm_op = register_triton_op("group_norm", _group_norm_op_body)
_group_norm_with_sum_op = register_triton_op("group_norm_with_sum", _group_norm_with_sum_op_body)


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    silu: bool = False,
    add: Optional[torch.Tensor] = None,
    skip: Optional[torch.Tensor] = None,
    return_sum: bool = False,
    output_scale: float = 1.0,
    concat: Optional[torch.Tensor] = None,
    e4m3_scale: Optional[torch.Tensor] = None,
    e4m3_amax: Optional[torch.Tensor] = None,
):
    """GroupNorm of ``x + skip + add`` (then SiLU if ``silu``, then times ``output_scale``), fused.

    x: (N, C, H, W), channels_last preferred; the output keeps x's memory format.
    concat: (N, C2, H, W) channels appended to x's: the norm of torch.cat([x, concat], 1), read from both in
         place (a UNet up block's skip connection); the output is channels_last, s the concatenation.
    add: N*C values, e.g. (N, C) or (N, C, 1, 1), broadcast over H, W
         (the ResNet time-embedding projection). skip: same shape as x.
    return_sum: also return s = x + skip + add (x itself when there is
         nothing to add), for SkipGroupNorm.
    output_scale: a float multiplying the output (last, after the SiLU); the sum is not scaled.
    e4m3_scale, e4m3_amax: 1-element float32 tensors: y is returned in e4m3 as
         y / e4m3_scale (saturated), for an FP8 convolution, and max |y| is
         recorded into e4m3_amax (atomic max) for the next call's scale
         (engines/fast/fp8.py).
    """
    fp8 = check_fp8_output(e4m3_scale, e4m3_amax, x)
    if return_sum and skip is None and add is None and concat is None:
        # An op may not return its own input, so the trivial sum stays out here.
        return group_norm(x, num_groups, weight, bias, eps, silu=silu, output_scale=output_scale,
                          e4m3_scale=e4m3_scale, e4m3_amax=e4m3_amax), x
    if compiling():  # torch.compile must see one registered op
        if fp8:
            raise ValueError("group_norm: e4m3 output is not traceable by torch.compile")
        op = _group_norm_with_sum_op if return_sum else _group_norm_op
        return op(x, num_groups, weight, bias, eps, silu, add, skip, output_scale, concat)
    # Eager: launch directly, skipping the dispatcher.
    return _group_norm_run(x, num_groups, weight, bias, eps, silu, add, skip, return_sum, False, output_scale,
                           concat, e4m3_scale, e4m3_amax)
