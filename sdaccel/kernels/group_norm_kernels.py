"""The GroupNorm Triton kernels that kernels/group_norm.py launches (its docstring has the function they compute).

Each program handles whole groups of one sample n; a tile is (rows of H*W) x (channels), addressed through
strides, so channels_last and NCHW take the same kernels. Statistics accumulate in fp32.

  single   (group_norm_single_kernel, grid (G, N)): the group's whole tile in registers: load it once, the mean,
           then the variance of the loaded values about it, normalize, store. One launch, one read.
  looped   (group_norm_looped_kernel, grid (G, N)): the group too large for registers, so the program sweeps its
           rows twice, statistics then normalize; the second sweep re-reads what the first has just pulled into
           L2. One launch, no partials, but only N*G programs.
  split    two launches over grid (chunks of rows, blocks of whole groups, N), enough programs for a large group:
           group_norm_stats_kernel reduces each chunk x channel block to one partial (mean, M2) per group (M2: the
           sum of squared deviations) in a small fp32 buffer, and writes the sum s where asked;
           group_norm_apply_kernel merges every chunk's partials of its groups, then normalizes its own tile
           (which pass 1 has just pulled through L2).
(The fourth path, a group over a cluster of CTAs on sm_90, is kernels/group_norm_cluster.py.)

No step forms E[x^2] - mean^2 over a whole group (that cancels badly in fp32 when |mean| >> std): a tile's rows
are summed as d = v - K with K one of its own values (_channel_moments), and partials merge with Chan et al.'s
parallel-variance formula,
      mean = sum_k n_k m_k / n,   M2 = sum_k M2_k + sum_k n_k (m_k - mean)^2.

Kernel arguments, in every kernel: x_ptr, x2_ptr (the concatenated channels, HAS_X2), skip_ptr, add_ptr, sum_ptr
(s, written with WRITE_SUM or read back with READ_SUM); weight_ptr, bias_ptr; out_ptr; output_scale (a float,
multiplies y after the SiLU); e4m3_scale_ptr and e4m3_amax_ptr (FP8_OUT: y stored as y / e4m3_scale in e4m3, max
|y| recorded; kernels/fp8.py). Absent pointers are stood in for by x and never read. ``prepare_call`` checks a
launch's arguments and lays its tensors out so (``GroupNormCall``), for every path, the cluster one too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .fp8 import E4M3, check_fp8_output

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None
else:
    from .fp8 import record_amax, to_e4m3


# --------------------------------------------------------------- the operands

def _hw_stride(x: torch.Tensor) -> Optional[int]:
    """Stride of the merged H*W axis, or None when H and W don't merge."""
    _, _, H, W = x.shape
    if H == 1:
        return x.stride(3)
    if W == 1 or x.stride(2) == W * x.stride(3):
        return x.stride(3) if W > 1 else x.stride(2)
    return None


def _like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``t`` with exactly x's strides (copying only when they differ)."""
    if t.stride() == x.stride():
        return t
    return torch.empty_strided(x.shape, x.stride(), dtype=t.dtype, device=t.device).copy_(t)


@dataclass(slots=True)
class GroupNormCall:
    """One launch's operands, checked and laid out as these kernels address them (``prepare_call``), and its
    scalars."""

    x: torch.Tensor
    concat: Optional[torch.Tensor]
    skip: Optional[torch.Tensor]  # with exactly x's strides
    add: Optional[torch.Tensor]  # (N, C), possibly a broadcast view
    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    out: torch.Tensor
    s: Optional[torch.Tensor]  # the sum x + skip + add, written when asked for (write_sum)
    e4m3_scale: Optional[torch.Tensor]  # with e4m3_amax: None unless out is e4m3 (fp8)
    e4m3_amax: Optional[torch.Tensor]
    num_groups: int
    eps: float
    silu: bool
    output_scale: float
    fp8: bool
    N: int
    C: int  # C1 of x, then C2 of concat
    C1: int
    C2: int
    HW: int
    group_size: int
    strides: tuple  # out's (sample, channel, merged H*W): s, skip and x itself without a concat share them
    add_strides: tuple

    # The Triton kernels' pointer arguments; x stands in for absent ones (never dereferenced).
    def triton_inputs(self) -> tuple:
        """What every Triton kernel takes first."""
        return tuple(t if t is not None else self.x for t in (self.x, self.concat, self.skip, self.add, self.s))

    def triton_affine(self) -> tuple:
        return tuple(t if t is not None else self.x for t in (self.weight, self.bias))

    def triton_e4m3(self) -> tuple:
        return (self.e4m3_scale, self.e4m3_amax) if self.fp8 else (self.x, self.x)

    def triton_flags(self) -> dict:
        return dict(HAS_X2=self.concat is not None, HAS_SKIP=self.skip is not None, HAS_ADD=self.add is not None)


def prepare_call(x, num_groups, weight, bias, eps, silu, add, skip, write_sum, output_scale, concat, e4m3_scale,
                 e4m3_amax) -> GroupNormCall:
    """Check group_norm.launch_group_norm's arguments, lay the tensors out as the kernels read them, allocate out
    (and s)."""
    if x.dim() != 4:
        raise ValueError(f"group_norm expects (N, C, H, W), got {tuple(x.shape)}")
    N, C1, H, W = x.shape
    C2 = 0
    if concat is not None:
        if concat.dim() != 4 or concat.shape[0] != N or concat.shape[2:] != x.shape[2:] or concat.dtype != x.dtype:
            raise ValueError(f"concat {tuple(concat.shape)} {concat.dtype} does not extend x {tuple(x.shape)} "
                             f"{x.dtype} along channels")
        if skip is not None:
            raise ValueError("group_norm takes skip or concat, not both")
        # Both sources dense channels_last: the kernels address them by channel counts alone.
        x = x.contiguous(memory_format=torch.channels_last)
        concat = concat.contiguous(memory_format=torch.channels_last)
        C2 = concat.shape[1]
    C = C1 + C2
    if C % num_groups:
        raise ValueError(f"{C} channels do not split into {num_groups} groups")
    if not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)) or _hw_stride(x) is None:
        x = x.contiguous(memory_format=torch.channels_last)
    if skip is not None:
        if skip.shape != x.shape:
            raise ValueError(f"skip shape {tuple(skip.shape)} != x shape {tuple(x.shape)}")
        skip = _like(skip, x)
    if add is not None:
        add = add.reshape(-1, C)
        if add.shape[0] not in (1, N):
            raise ValueError(f"add must hold N*C or C values, got {tuple(add.shape)}")
        add = add.expand(N, C)
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    add_strides = (add.stride(0), add.stride(1)) if add is not None else (0, 0)
    fp8 = check_fp8_output(e4m3_scale, e4m3_amax, x)
    out_dtype = E4M3 if fp8 else x.dtype
    if concat is None:
        out = torch.empty_strided(x.shape, x.stride(), dtype=out_dtype, device=x.device)
    else:
        out = torch.empty((N, C, H, W), dtype=out_dtype, device=x.device, memory_format=torch.channels_last)
    s = torch.empty_strided(out.shape, out.stride(), dtype=x.dtype, device=x.device) if write_sum else None
    # The kernels address out, s and skip (and x itself when there is no concat) by out's strides.
    strides = (out.stride(0), out.stride(1), _hw_stride(out))
    return GroupNormCall(x, concat, skip, add, weight, bias, out, s, e4m3_scale, e4m3_amax, num_groups, eps, silu,
                         output_scale, fp8, N, C, C1, C2, H * W, C // num_groups, strides, add_strides)


# ---------------------------------------------------------------- the kernels

if triton is not None:

    @triton.jit
    def _load_input(x_ptr, x2_ptr, offs, n, rows, c, mask, HW, C1, C2, HAS_X2: tl.constexpr):
        """The input at (sample n, rows, channels c) in fp32: x at ``offs``, or, with HAS_X2, the channel
        concatenation [x, x2] read in place (both channels_last and dense, C1 and C2 channels)."""
        if HAS_X2:
            o1 = n.to(tl.int64) * HW * C1 + rows[:, None] * C1 + c[None, :]
            o2 = n.to(tl.int64) * HW * C2 + rows[:, None] * C2 + (c - C1)[None, :]
            v = tl.load(x_ptr + o1, mask=mask & (c < C1)[None, :], other=0.0).to(tl.float32)
            v += tl.load(x2_ptr + o2, mask=mask & (c >= C1)[None, :], other=0.0).to(tl.float32)
            return v
        return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)

    @triton.jit
    def _input_tile(x_ptr, x2_ptr, skip_ptr, offs, n, rows, c, mask, add, HW, C1, C2,
                    HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr):
        """x (+ skip) (+ add[c]) over one tile, in fp32."""
        v = _load_input(x_ptr, x2_ptr, offs, n, rows, c, mask, HW, C1, C2, HAS_X2)
        if HAS_SKIP:
            v += tl.load(skip_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_ADD:
            v += add[None, :]
        return v

    @triton.jit
    def _channel_moments(
        x_ptr, x2_ptr, skip_ptr, sum_ptr, base, n, row_start, row_end, c, c_ok, add, HW, C1, C2,
        stride_c, stride_hw,
        BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, WRITE_SUM: tl.constexpr,
        LOOP_STAGES: tl.constexpr,
    ):
        """Per channel, the mean and M2 (sum of squared deviations) of the input over rows [row_start, row_end);
        with WRITE_SUM the input sum is also stored, rounded, and the rounded values are what is measured.

        Shifted sums: accumulate d = v - K and d^2 elementwise in registers (no cross-thread traffic inside the
        loop), K = the first row. Then with r rows: mean = K + S1/r, M2 = S2 - S1^2/r; K is a sample of the data,
        so |mean - K| ~ std and S2 - S1^2/r does not cancel the way E[x^2] - mean^2 does."""
        one_row = row_start + tl.arange(0, 1)
        first = base + one_row[:, None] * stride_hw + c[None, :] * stride_c
        shift = tl.sum(_input_tile(x_ptr, x2_ptr, skip_ptr, first, n, one_row, c, c_ok[None, :], add, HW, C1, C2,
                                   HAS_X2, HAS_SKIP, HAS_ADD), axis=0)
        acc1 = tl.zeros([BLOCK_HW, BLOCK_C], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_HW, BLOCK_C], dtype=tl.float32)
        for r0 in tl.range(row_start, row_end, BLOCK_HW, num_stages=LOOP_STAGES):
            rows = r0 + tl.arange(0, BLOCK_HW)
            mask = (rows < row_end)[:, None] & c_ok[None, :]
            offs = base + rows[:, None] * stride_hw + c[None, :] * stride_c
            v = _input_tile(x_ptr, x2_ptr, skip_ptr, offs, n, rows, c, mask, add, HW, C1, C2,
                            HAS_X2, HAS_SKIP, HAS_ADD)
            if WRITE_SUM:
                # Normalize the rounded sum the caller gets back: y == GN(s).
                s = v.to(sum_ptr.dtype.element_ty)
                tl.store(sum_ptr + offs, s, mask=mask)
                v = s.to(tl.float32)
            d = tl.where(mask, v - shift[None, :], 0.0)
            acc1 += d
            acc2 += d * d
        rows_here = (row_end - row_start).to(tl.float32)
        s1 = tl.sum(acc1, axis=0)
        mean = shift + s1 / rows_here
        m2 = tl.maximum(tl.sum(acc2, axis=0) - s1 * s1 / rows_here, 0.0)
        return mean, m2

    @triton.jit
    def _normalize_rows(
        x_ptr, x2_ptr, skip_ptr, sum_ptr, out_ptr, base, n, row_start, row_end, c, c_ok, add,
        mean_c, gain, shift, output_scale, e4m3_scale_ptr, e4m3_amax_ptr, HW, C1, C2, stride_c, stride_hw,
        BLOCK_HW: tl.constexpr, HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr,
        READ_SUM: tl.constexpr, APPLY_SILU: tl.constexpr, LOOP_STAGES: tl.constexpr, FP8_OUT: tl.constexpr,
    ):
        """y = act((v - mean_c) * gain + shift) * output_scale over rows [row_start, row_end), v the stored sum
        (READ_SUM) or the input; gain = rstd * weight, shift = bias, per channel. (Subtracting the mean first
        keeps digits when |mean| >> std.) FP8_OUT: y stored in e4m3 as y / e4m3_scale, max |y| into e4m3_amax."""
        if FP8_OUT:
            inv_e4m3_scale = 1.0 / tl.load(e4m3_scale_ptr)
        # max |y| of the program's rows, recorded once after the loop: an atomic a tile stalled the loop's loads (on
        # an H200 the 32x32 level's looped GroupNorm took 1.8x as long writing e4m3 as writing fp16).
        peak = tl.zeros([BLOCK_HW, c.shape[0]], dtype=tl.float32)
        for r0 in tl.range(row_start, row_end, BLOCK_HW, num_stages=LOOP_STAGES):
            rows = r0 + tl.arange(0, BLOCK_HW)
            mask = (rows < row_end)[:, None] & c_ok[None, :]
            offs = base + rows[:, None] * stride_hw + c[None, :] * stride_c
            if READ_SUM:
                v = tl.load(sum_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            else:
                v = _input_tile(x_ptr, x2_ptr, skip_ptr, offs, n, rows, c, mask, add, HW, C1, C2,
                                HAS_X2, HAS_SKIP, HAS_ADD)
            y = (v - mean_c[None, :]) * gain[None, :] + shift[None, :]
            if APPLY_SILU:
                y = y * tl.sigmoid(y)
            y = y * output_scale
            if FP8_OUT:
                peak = tl.maximum(peak, tl.where(mask, tl.abs(y), 0.0))
                tl.store(out_ptr + offs, to_e4m3(y, inv_e4m3_scale), mask=mask)
            else:
                tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        if FP8_OUT:
            record_amax(e4m3_amax_ptr, peak, c_ok[None, :])

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["HW", "rows_per_chunk", "num_chunks"])
    def group_norm_stats_kernel(
        x_ptr, x2_ptr, skip_ptr, add_ptr, sum_ptr, part_mean_ptr, part_m2_ptr,
        HW, C, C1, C2, G, rows_per_chunk, num_chunks,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr,
        BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, WRITE_SUM: tl.constexpr,
        LOOP_STAGES: tl.constexpr,
    ):
        """The split path's pass 1: one (mean, M2) partial per group of this channel block over this chunk."""
        chunk = tl.program_id(0)
        cblock = tl.program_id(1)
        n = tl.program_id(2)

        j = tl.arange(0, BLOCK_C)  # channel lane inside this block of whole groups
        c = cblock * (GROUPS_PER_BLOCK * GROUP_SIZE) + j
        c_ok = (j < GROUPS_PER_BLOCK * GROUP_SIZE) & (c < C)
        base = n.to(tl.int64) * stride_n
        add = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_ADD:
            add = tl.load(add_ptr + n * stride_add_n + c * stride_add_c, mask=c_ok, other=0.0).to(tl.float32)

        row_start = chunk * rows_per_chunk
        row_end = tl.minimum(row_start + rows_per_chunk, HW)
        mean, m2 = _channel_moments(x_ptr, x2_ptr, skip_ptr, sum_ptr, base, n, row_start, row_end, c, c_ok, add,
                                    HW, C1, C2, stride_c, stride_hw, BLOCK_HW, BLOCK_C,
                                    HAS_X2, HAS_SKIP, HAS_ADD, WRITE_SUM, LOOP_STAGES)
        rows_here = (row_end - row_start).to(tl.float32)

        # Channels -> groups. Every channel saw the same row count r, so
        #   mean_g = avg_c mean_c,  M2_g = sum_c [M2_c + r (mean_c - mean_g)^2].
        gi = tl.arange(0, BLOCK_G)
        in_group = ((j[None, :] // GROUP_SIZE) == gi[:, None]) & c_ok[None, :]  # (BLOCK_G, BLOCK_C)
        g_mean = tl.sum(tl.where(in_group, mean[None, :], 0.0), axis=1) / GROUP_SIZE
        g_mean_per_c = tl.sum(tl.where(in_group, g_mean[:, None], 0.0), axis=0)
        dev = mean - g_mean_per_c
        g_m2 = tl.sum(tl.where(in_group, (m2 + rows_here * dev * dev)[None, :], 0.0), axis=1)

        g = cblock * GROUPS_PER_BLOCK + gi
        g_ok = (gi < GROUPS_PER_BLOCK) & (g < G)
        part = (n * num_chunks + chunk) * G + g
        tl.store(part_mean_ptr + part, g_mean, mask=g_ok)
        tl.store(part_m2_ptr + part, g_m2, mask=g_ok)

    @triton.jit(do_not_specialize=["HW", "rows_per_chunk", "num_chunks"])
    def group_norm_apply_kernel(
        x_ptr, x2_ptr, skip_ptr, add_ptr, sum_ptr, weight_ptr, bias_ptr, out_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
        part_mean_ptr, part_m2_ptr,
        HW, C, C1, C2, G, rows_per_chunk, num_chunks, eps, output_scale,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr,
        BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
        CHUNK_TILE: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, READ_SUM: tl.constexpr,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, APPLY_SILU: tl.constexpr, LOOP_STAGES: tl.constexpr,
        FP8_OUT: tl.constexpr,
    ):
        """The split path's pass 2: merge the partials of this block's groups, normalize this chunk's rows."""
        chunk = tl.program_id(0)
        cblock = tl.program_id(1)
        n = tl.program_id(2)

        # Merge the partials of this block's groups over all chunks, CHUNK_TILE
        # chunks at a time (a fixed tile: the chunk count varies with the shape
        # and must not pick the compiled kernel). Chunk k holds rows_k rows,
        # i.e. n_k = rows_k * GROUP_SIZE values. Two sweeps: the group means,
        # then M2 about them.
        gi = tl.arange(0, BLOCK_G)
        g = cblock * GROUPS_PER_BLOCK + gi
        g_ok = (gi < GROUPS_PER_BLOCK) & (g < G)
        weighted = tl.zeros([BLOCK_G], dtype=tl.float32)
        for k0 in range(0, num_chunks, CHUNK_TILE):
            k = k0 + tl.arange(0, CHUNK_TILE)
            k_ok = k < num_chunks
            part = (n * num_chunks + k[:, None]) * G + g[None, :]
            m_k = tl.load(part_mean_ptr + part, mask=k_ok[:, None] & g_ok[None, :], other=0.0)
            rows_k = tl.where(k_ok, tl.minimum(rows_per_chunk, HW - k * rows_per_chunk), 0).to(tl.float32)
            weighted += tl.sum(m_k * rows_k[:, None], axis=0)
        g_mean = weighted / HW
        g_m2 = tl.zeros([BLOCK_G], dtype=tl.float32)
        for k0 in range(0, num_chunks, CHUNK_TILE):
            k = k0 + tl.arange(0, CHUNK_TILE)
            k_ok = k < num_chunks
            part = (n * num_chunks + k[:, None]) * G + g[None, :]
            part_ok = k_ok[:, None] & g_ok[None, :]
            m_k = tl.load(part_mean_ptr + part, mask=part_ok, other=0.0)
            m2_k = tl.load(part_m2_ptr + part, mask=part_ok, other=0.0)
            rows_k = tl.where(k_ok, tl.minimum(rows_per_chunk, HW - k * rows_per_chunk), 0).to(tl.float32)
            dk = tl.where(part_ok, m_k - g_mean[None, :], 0.0)
            g_m2 += tl.sum(m2_k + (rows_k[:, None] * GROUP_SIZE) * dk * dk, axis=0)
        g_var = tl.maximum(g_m2 / (HW * GROUP_SIZE), 0.0)
        g_rstd = tl.rsqrt(g_var + eps)

        # Groups -> channels: y = (v - mean) * gain + shift, gain = rstd * weight.
        j = tl.arange(0, BLOCK_C)
        c = cblock * (GROUPS_PER_BLOCK * GROUP_SIZE) + j
        c_ok = (j < GROUPS_PER_BLOCK * GROUP_SIZE) & (c < C)
        in_group = ((j[None, :] // GROUP_SIZE) == gi[:, None]) & c_ok[None, :]
        mean_c = tl.sum(tl.where(in_group, g_mean[:, None], 0.0), axis=0)
        gain = tl.sum(tl.where(in_group, g_rstd[:, None], 0.0), axis=0)
        if HAS_WEIGHT:
            gain *= tl.load(weight_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        if HAS_BIAS:
            shift = tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        else:
            shift = tl.zeros([BLOCK_C], dtype=tl.float32)
        add = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_ADD:
            add = tl.load(add_ptr + n * stride_add_n + c * stride_add_c, mask=c_ok, other=0.0).to(tl.float32)

        row_start = chunk * rows_per_chunk
        _normalize_rows(x_ptr, x2_ptr, skip_ptr, sum_ptr, out_ptr, n.to(tl.int64) * stride_n, n, row_start,
                        tl.minimum(row_start + rows_per_chunk, HW), c, c_ok, add, mean_c, gain, shift, output_scale,
                        e4m3_scale_ptr, e4m3_amax_ptr, HW, C1, C2, stride_c, stride_hw, BLOCK_HW, HAS_X2, HAS_SKIP,
                        HAS_ADD, READ_SUM, APPLY_SILU, LOOP_STAGES, FP8_OUT)

    @triton.jit(do_not_specialize=["HW"])
    def group_norm_single_kernel(
        x_ptr, x2_ptr, skip_ptr, add_ptr, sum_ptr, weight_ptr, bias_ptr, out_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
        HW, C, C1, C2, eps, output_scale,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, WRITE_SUM: tl.constexpr,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, APPLY_SILU: tl.constexpr, FP8_OUT: tl.constexpr,
    ):
        """One program per (group, sample), the group's whole tile in registers."""
        g = tl.program_id(0)
        n = tl.program_id(1)
        j = tl.arange(0, BLOCK_C)
        c = g * GROUP_SIZE + j
        c_ok = j < GROUP_SIZE
        rows = tl.arange(0, BLOCK_HW)
        mask = (rows < HW)[:, None] & c_ok[None, :]
        offs = n.to(tl.int64) * stride_n + rows[:, None] * stride_hw + c[None, :] * stride_c
        add = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_ADD:
            add = tl.load(add_ptr + n * stride_add_n + c * stride_add_c, mask=c_ok, other=0.0).to(tl.float32)
        v = _input_tile(x_ptr, x2_ptr, skip_ptr, offs, n, rows, c, mask, add, HW, C1, C2, HAS_X2, HAS_SKIP, HAS_ADD)
        if WRITE_SUM:
            s = v.to(sum_ptr.dtype.element_ty)  # normalize the rounded sum the caller gets back
            tl.store(sum_ptr + offs, s, mask=mask)
            v = s.to(tl.float32)
        count = (HW * GROUP_SIZE).to(tl.float32)
        mean = tl.sum(tl.sum(tl.where(mask, v, 0.0), axis=1), axis=0) / count
        d = tl.where(mask, v - mean, 0.0)
        var = tl.sum(tl.sum(d * d, axis=1), axis=0) / count
        gain = tl.zeros([BLOCK_C], dtype=tl.float32) + tl.rsqrt(var + eps)
        if HAS_WEIGHT:
            gain *= tl.load(weight_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        y = d * gain[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        if APPLY_SILU:
            y = y * tl.sigmoid(y)
        y = y * output_scale
        if FP8_OUT:
            record_amax(e4m3_amax_ptr, y, mask)
            tl.store(out_ptr + offs, to_e4m3(y, 1.0 / tl.load(e4m3_scale_ptr)), mask=mask)
        else:
            tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["HW"])
    def group_norm_looped_kernel(
        x_ptr, x2_ptr, skip_ptr, add_ptr, sum_ptr, weight_ptr, bias_ptr, out_ptr, e4m3_scale_ptr, e4m3_amax_ptr,
        HW, C, C1, C2, eps, output_scale,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, WRITE_SUM: tl.constexpr,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, APPLY_SILU: tl.constexpr, LOOP_STAGES: tl.constexpr,
        FP8_OUT: tl.constexpr,
    ):
        """One program per (group, sample) streams its group twice: statistics, then normalize. The second sweep
        re-reads what the first has just pulled into L2; no partials, no second launch."""
        g = tl.program_id(0)
        n = tl.program_id(1)
        j = tl.arange(0, BLOCK_C)
        c = g * GROUP_SIZE + j
        c_ok = j < GROUP_SIZE
        base = n.to(tl.int64) * stride_n
        add = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_ADD:
            add = tl.load(add_ptr + n * stride_add_n + c * stride_add_c, mask=c_ok, other=0.0).to(tl.float32)

        mean_c, m2_c = _channel_moments(x_ptr, x2_ptr, skip_ptr, sum_ptr, base, n, 0, HW, c, c_ok, add,
                                        HW, C1, C2, stride_c, stride_hw, BLOCK_HW, BLOCK_C,
                                        HAS_X2, HAS_SKIP, HAS_ADD, WRITE_SUM, LOOP_STAGES)
        # Channels -> the group (every channel saw all HW rows): Chan's merge, as in the split kernels.
        rows_f = HW.to(tl.float32)
        mean = tl.sum(tl.where(c_ok, mean_c, 0.0), axis=0) / GROUP_SIZE
        dev = mean_c - mean
        m2 = tl.sum(tl.where(c_ok, m2_c + rows_f * dev * dev, 0.0), axis=0)
        rstd = tl.rsqrt(m2 / (rows_f * GROUP_SIZE) + eps)
        gain = tl.zeros([BLOCK_C], dtype=tl.float32) + rstd
        if HAS_WEIGHT:
            gain *= tl.load(weight_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        if HAS_BIAS:
            shift = tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        else:
            shift = tl.zeros([BLOCK_C], dtype=tl.float32)
        if WRITE_SUM:
            tl.debug_barrier()  # the sum this program stored is read back by other threads of it
        _normalize_rows(x_ptr, x2_ptr, skip_ptr, sum_ptr, out_ptr, base, n, 0, HW, c, c_ok, add,
                        tl.zeros([BLOCK_C], dtype=tl.float32) + mean, gain, shift, output_scale, e4m3_scale_ptr,
                        e4m3_amax_ptr, HW, C1, C2, stride_c, stride_hw, BLOCK_HW, HAS_X2, HAS_SKIP, HAS_ADD,
                        WRITE_SUM, APPLY_SILU, LOOP_STAGES, FP8_OUT)
