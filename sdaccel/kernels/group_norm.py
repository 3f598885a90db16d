"""GroupNorm on (N, C, H, W) activations, with the ResNet-block fusions.

    s = x + skip + add[n, c]                      (skip and add are optional)
    y = (s - mean[n, g]) * rstd[n, g] * weight[c] + bias[c]
    y = silu(y) = y * sigmoid(y)                  (optional)
    y = y * scale                                 (optional; a VAE decoder whose activations are kept scaled
                                                   down to stay inside fp16, engines/vae_scaling.py)
    y in e4m3 (optional): y / out_scale, saturated, for an FP8 convolution; max |y| recorded (kernels/fp8.py)

mean and var run over the C/G channels of group g and all H*W positions of
sample n; rstd = 1 / sqrt(var + eps). Statistics accumulate in fp32.

Layout: channels_last (NHWC in memory) is the fast path; contiguous NCHW works
too (same kernels, different strides). The output keeps x's memory format.

Split design. At SD1.5 shapes there are only N*G = 64 (sample, group) pairs,
far too few programs for an H100, so:
  pass 1 (_group_norm_stats_kernel), grid (HW chunks, channel blocks, N):
      each program reduces a chunk of rows x a block of whole groups to one
      partial (mean, M2) per group (M2 = sum of squared deviations) and writes
      it to a small fp32 buffer. With ``skip``/``add`` and a requested sum it
      also writes s.
  pass 2 (_group_norm_apply_kernel), same grid:
      each program merges the partials of its groups over all chunks and then
      normalizes its (rows x channels) tile; pass 1 has just pulled x through
      L2, so at UNet sizes this second read mostly hits L2.
Small groups (the UNet's 8x8 and 16x16 levels, every group's tile fitting in
one program's registers) take one kernel instead (_group_norm_single_kernel,
grid (G, N)): load the group once, mean, then the variance of the loaded values
about it, normalize and store; one launch and one read instead of two of each.
Groups of few rows that do not fit (the 32x32 level, 16x16 at 2560 channels)
take _group_norm_looped_kernel, also grid (G, N): each program sweeps its group
twice (statistics, then normalize; the second sweep hits L2). Fewer programs
than the split kernels, but one launch and no partials: faster up to
LOOPED_MAX_ROWS rows, slower beyond, where each program's sweeps get long.
No step forms E[x^2] - mean^2 over a whole group (that cancels badly in fp32
when |mean| >> std): a chunk sums d = x - K with K one of its own samples, and
partials merge with Chan et al.'s parallel-variance formula,
      mean = sum_k n_k m_k / n,   M2 = sum_k M2_k + sum_k n_k (m_k - mean)^2.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from . import compiling, launchable, next_pow2, parallel_target, register_triton_op, sm_count, use_triton
from . import group_norm_cluster as cluster
from .fp8 import E4M3, check_fp8_output, quantize_e4m3_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs use the reference
    triton = None
else:
    from .fp8 import record_amax, to_e4m3


# ---------------------------------------------------------------- reference

def group_norm_reference(
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
    scale: float = 1.0,
    concat: Optional[torch.Tensor] = None,
    out_scale: Optional[torch.Tensor] = None,
    out_amax: Optional[torch.Tensor] = None,
):
    """Plain-torch GroupNorm with the same fusions; what the tests trust.

    The sum is formed at x's dtype (like eager ``x + skip``); the norm runs in
    fp32 (fp64 for fp64 input) and is rounded once at the end. The variance is
    two-pass, mean((s - mean)^2), rather than F.group_norm: on CPU in fp32 that
    was off by ~0.15 (of |y| ~ 3) for data with mean 300 and std 0.5.
    out_scale (and out_amax): y rounded to e4m3 from fp32 instead (kernels/fp8.py).
    """
    if concat is not None:
        x = torch.cat([x, concat], 1).contiguous(memory_format=torch.channels_last)
    N, C = x.shape[:2]
    memory_format = _memory_format(x)
    s = x
    if skip is not None:
        s = s + skip
    if add is not None:
        s = s + add.reshape(-1, C, 1, 1).to(s.dtype)
    compute_dtype = torch.promote_types(s.dtype, torch.float32)
    grouped = s.to(compute_dtype).reshape(N, num_groups, -1)
    mean = grouped.mean(dim=-1, keepdim=True)
    var = (grouped - mean).square().mean(dim=-1, keepdim=True)
    y = ((grouped - mean) * torch.rsqrt(var + eps)).reshape(s.shape)
    if weight is not None:
        y = y * weight.to(compute_dtype).reshape(1, C, 1, 1)
    if bias is not None:
        y = y + bias.to(compute_dtype).reshape(1, C, 1, 1)
    if silu:
        y = F.silu(y)
    if scale != 1.0:
        y = y * scale
    y = y.to(x.dtype) if out_scale is None else quantize_e4m3_reference(y, out_scale, out_amax)
    y = y.contiguous(memory_format=memory_format)
    if return_sum:
        return y, s.contiguous(memory_format=memory_format)
    return y


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.is_contiguous():
        return torch.contiguous_format
    return torch.channels_last  # also what non-dense inputs are converted to


# ------------------------------------------------------------------ kernels

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
        mean_c, scale, shift, out_scale, e4m3_scale_ptr, amax_ptr, HW, C1, C2, stride_c, stride_hw,
        BLOCK_HW: tl.constexpr, HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr,
        READ_SUM: tl.constexpr, APPLY_SILU: tl.constexpr, LOOP_STAGES: tl.constexpr, FP8_OUT: tl.constexpr,
    ):
        """out = act((v - mean_c) * scale + shift) * out_scale over rows [row_start, row_end), v the stored sum
        (READ_SUM) or the input. (Subtracting the mean first keeps digits when |mean| >> std.) FP8_OUT: out in
        e4m3 as out / e4m3_scale, max |out| into amax."""
        if FP8_OUT:
            inv_e4m3_scale = 1.0 / tl.load(e4m3_scale_ptr)
        # max |out| of the program's rows, recorded once after the loop: an atomic a tile stalled the loop's loads
        # (the 32x32 level's looped GroupNorm took 1.8x as long writing e4m3 as fp16, twentieth session).
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
            y = (v - mean_c[None, :]) * scale[None, :] + shift[None, :]
            if APPLY_SILU:
                y = y * tl.sigmoid(y)
            y = y * out_scale
            if FP8_OUT:
                peak = tl.maximum(peak, tl.where(mask, tl.abs(y), 0.0))
                tl.store(out_ptr + offs, to_e4m3(y, inv_e4m3_scale), mask=mask)
            else:
                tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        if FP8_OUT:
            record_amax(amax_ptr, peak, c_ok[None, :])

    # Sizes are not specialized on: no recompile per resolution or batch (kernels/__init__.py).
    @triton.jit(do_not_specialize=["HW", "rows_per_chunk", "num_chunks"])
    def _group_norm_stats_kernel(
        x_ptr, x2_ptr, skip_ptr, add_ptr, sum_ptr, part_mean_ptr, part_m2_ptr,
        HW, C, C1, C2, G, rows_per_chunk, num_chunks,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr,
        BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, WRITE_SUM: tl.constexpr,
        LOOP_STAGES: tl.constexpr,
    ):
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
    def _group_norm_apply_kernel(
        x_ptr, x2_ptr, skip_ptr, add_ptr, sum_ptr, weight_ptr, bias_ptr, out_ptr, e4m3_scale_ptr, amax_ptr,
        part_mean_ptr, part_m2_ptr,
        HW, C, C1, C2, G, rows_per_chunk, num_chunks, eps, out_scale,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr,
        BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
        CHUNK_TILE: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, READ_SUM: tl.constexpr,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, APPLY_SILU: tl.constexpr, LOOP_STAGES: tl.constexpr,
        FP8_OUT: tl.constexpr,
    ):
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

        # Groups -> channels: y = (v - mean) * scale + shift, scale = rstd * weight.
        j = tl.arange(0, BLOCK_C)
        c = cblock * (GROUPS_PER_BLOCK * GROUP_SIZE) + j
        c_ok = (j < GROUPS_PER_BLOCK * GROUP_SIZE) & (c < C)
        in_group = ((j[None, :] // GROUP_SIZE) == gi[:, None]) & c_ok[None, :]
        mean_c = tl.sum(tl.where(in_group, g_mean[:, None], 0.0), axis=0)
        scale = tl.sum(tl.where(in_group, g_rstd[:, None], 0.0), axis=0)
        if HAS_WEIGHT:
            scale *= tl.load(weight_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        if HAS_BIAS:
            shift = tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        else:
            shift = tl.zeros([BLOCK_C], dtype=tl.float32)
        add = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_ADD:
            add = tl.load(add_ptr + n * stride_add_n + c * stride_add_c, mask=c_ok, other=0.0).to(tl.float32)

        row_start = chunk * rows_per_chunk
        _normalize_rows(x_ptr, x2_ptr, skip_ptr, sum_ptr, out_ptr, n.to(tl.int64) * stride_n, n, row_start,
                        tl.minimum(row_start + rows_per_chunk, HW), c, c_ok, add, mean_c, scale, shift, out_scale,
                        e4m3_scale_ptr, amax_ptr, HW, C1, C2, stride_c, stride_hw, BLOCK_HW, HAS_X2, HAS_SKIP,
                        HAS_ADD, READ_SUM, APPLY_SILU, LOOP_STAGES, FP8_OUT)

    @triton.jit(do_not_specialize=["HW"])
    def _group_norm_single_kernel(
        x_ptr, x2_ptr, skip_ptr, add_ptr, sum_ptr, weight_ptr, bias_ptr, out_ptr, e4m3_scale_ptr, amax_ptr,
        HW, C, C1, C2, eps, out_scale,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, WRITE_SUM: tl.constexpr,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, APPLY_SILU: tl.constexpr, FP8_OUT: tl.constexpr,
    ):
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
        scale = tl.zeros([BLOCK_C], dtype=tl.float32) + tl.rsqrt(var + eps)
        if HAS_WEIGHT:
            scale *= tl.load(weight_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        y = d * scale[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        if APPLY_SILU:
            y = y * tl.sigmoid(y)
        y = y * out_scale
        if FP8_OUT:
            record_amax(amax_ptr, y, mask)
            tl.store(out_ptr + offs, to_e4m3(y, 1.0 / tl.load(e4m3_scale_ptr)), mask=mask)
        else:
            tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["HW"])
    def _group_norm_looped_kernel(
        x_ptr, x2_ptr, skip_ptr, add_ptr, sum_ptr, weight_ptr, bias_ptr, out_ptr, e4m3_scale_ptr, amax_ptr,
        HW, C, C1, C2, eps, out_scale,
        stride_n, stride_c, stride_hw, stride_add_n, stride_add_c,
        GROUP_SIZE: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr,
        HAS_X2: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_ADD: tl.constexpr, WRITE_SUM: tl.constexpr,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, APPLY_SILU: tl.constexpr, LOOP_STAGES: tl.constexpr,
        FP8_OUT: tl.constexpr,
    ):
        # One program per (group, sample) streams its group twice: statistics, then normalize. The second sweep
        # re-reads what the first has just pulled into L2; no partials, no second launch.
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
        scale = tl.zeros([BLOCK_C], dtype=tl.float32) + rstd
        if HAS_WEIGHT:
            scale *= tl.load(weight_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        if HAS_BIAS:
            beta = tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
        else:
            beta = tl.zeros([BLOCK_C], dtype=tl.float32)
        if WRITE_SUM:
            tl.debug_barrier()  # the sum this program stored is read back by other threads of it
        _normalize_rows(x_ptr, x2_ptr, skip_ptr, sum_ptr, out_ptr, base, n, 0, HW, c, c_ok, add,
                        tl.zeros([BLOCK_C], dtype=tl.float32) + mean, scale, beta, out_scale, e4m3_scale_ptr, amax_ptr,
                        HW, C1, C2, stride_c, stride_hw, BLOCK_HW, HAS_X2, HAS_SKIP, HAS_ADD, WRITE_SUM, APPLY_SILU,
                        LOOP_STAGES, FP8_OUT)


# ----------------------------------------------------------------- launcher

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pick_channel_block(num_channels: int, num_groups: int, max_block_c: Optional[int] = None) -> tuple[int, int]:
    """(BLOCK_C, groups per block) for tiles that hold whole groups.

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


# Tiles of the split kernels' row loops in flight (Triton's software pipelining of the loads). Unpipelined (1, also
# what Triton does unasked), one program waits out each tile's load: on an H100, 3 took a GroupNorm + SiLU of
# 16 x 320 x 64 x 64 from 89.8 to 77.9 us, 1 x 256 x 256 x 256 (the VAE) from 85.7 to 56.5, and left SD1.5's
# CFG-batch-2 shapes within 1% (benchmarks/README.md, H100 second run).
LOOP_STAGES = 3

# Chunks' partial statistics merged per step of the normalize pass's gather (one step for up to 32 chunks, the
# usual count at SD sizes).
CHUNK_TILE = 32

# Largest padded group tile (rows x lanes, powers of two) the single-pass kernel holds in registers: 16K fp32
# values are 64 per thread at 8 warps. SD1.5's UNet at 512x512 sends every norm at 8x8 and most at 16x16 here;
# the 32x32 and 64x64 levels and the VAE go through the split kernels.
SINGLE_PASS_MAX_TILE = 16384


def single_pass_fits(hw: int, group_size: int) -> bool:
    return next_pow2(hw) * next_pow2(group_size) <= SINGLE_PASS_MAX_TILE


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
# an H200, graphed (benchmarks/README.md, twenty-seventh session; kernels/bench_norm_sweep.py --rules), 64 lanes
# and 4096 values against the 256 and 8192 before, us: SD1.5's 2 x 320 x 64 x 64 + time embedding + SiLU 17.3 ->
# 13.2, without SiLU 13.4 -> 9.8, the VAE decoder's 1 x 256 x 512 x 512 200.6 -> 140.0, SDXL's 2 x 640 x 64 x 64
# 15.3 -> 13.4. An up block's concatenations [x, skip] lost (SD1.5's 2 x [640, 320] x 64 x 64 28.6 -> 35.1, at CFG
# batch 16 168.6 -> 274.4, SDXL's 2 x [640, 320] x 128 x 128 89.4 -> 138.2) and keep CONCAT_MAX_BLOCK_C and
# CONCAT_TILE_ELEMS. So ruled, one UNet call at CFG batch 2, alternated in one process: SD1.5 5.19 -> 5.15 ms, SDXL
# 28.55 -> 28.36 ms; CFG batch 16 unchanged.
SPLIT_MAX_BLOCK_C = 64
SPLIT_TILE_ELEMS = 4096
CONCAT_MAX_BLOCK_C = 256
CONCAT_TILE_ELEMS = 8192
LOOPED_TILE_ELEMS = 2048


def looped_fits(hw: int) -> bool:
    return hw <= LOOPED_MAX_ROWS


# Where the looped kernel would run, a Hopper GPU takes the cluster kernel (kernels/group_norm_cluster.py: each
# group over a cluster of 8 CTAs, read once, one launch) while the launch has at most this many CTAs per SM (0: off).
# On an H200, graphed, us (benchmarks/README.md, twenty-fourth and twenty-fifth sessions): CFG batch 2 (64 clusters,
# 512 CTAs, 3.9 an SM) at the UNet's own calls 2 x 640 x 32 x 32 + time embedding + SiLU 11.0 -> 7.6, the up block's
# [1280, 1280] x 16 x 16 concatenation 11.8 -> 6.4, 59 us less over SD1.5's 16 such calls, one UNet call 5.28 -> 5.18
# ms; but in its probe CFG batch 16 (31 an SM) 16 x 640 x 32 x 32 27.9 -> 40.3. Not offered the split kernels'
# groups: at the 64x64 level it lost at CFG batch 2 (2 x 320 x 64 x 64 13.2 -> 15.3 without SiLU, SDXL's 2 x 640 x
# 64 x 64 + time embedding 21.1 -> 31.9 at its best warps).
CLUSTER_CTAS_PER_SM = 4
# Whether the default also sends it the calls that write e4m3 (the FP8 mode's ResNet norms at the 32x32 level). On an
# H200 (twenty-sixth session) one FP8 SD1.5 UNet call at CFG batch 2, alternated in one process: 5.06 ms on the looped
# kernel, 4.95 with these calls on the cluster kernel at its e4m3 warps (group_norm_cluster.E4M3_VALUES_PER_THREAD),
# the same error against fp32.
CLUSTER_TAKES_E4M3 = True


def cluster_takes(x: torch.Tensor, num_groups: int, hw: int, group_size: int) -> bool:
    """Whether the launcher's default sends a group the looped kernel would take to the cluster kernel."""
    n_ctas = x.shape[0] * num_groups * cluster.CTAS
    return n_ctas <= CLUSTER_CTAS_PER_SM * sm_count(x) and cluster.refusal(x, hw, group_size) is None


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
    out_scale: float = 1.0,
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

    ``e4m3_scale`` (with ``e4m3_amax``): y in e4m3, as y / e4m3_scale
    saturated, max |y| recorded into e4m3_amax (kernels/fp8.py).

    ``concat``: channels appended to x's (same N, H, W), read in place: the
    norm of torch.cat([x, concat], 1) without forming it (s is that
    concatenation, output channels_last).

    ``path``: "single" (one program per sample and group holding the group in
    registers), "looped" (one program per sample and group, two sweeps over
    its rows), "split" (statistics and normalize kernels over chunks of rows),
    "cluster" (sm_90: each group held by a cluster of CTAs; no skip);
    None picks by size: single where the group fits (``single_pass_fits``),
    else looped for few rows (``looped_fits``; the cluster kernel instead
    where ``cluster_takes``), else split.
    ``tile_elems`` (elements per loop iteration), ``num_warps`` and
    ``loop_stages`` (tiles of the row loop in flight; None: LOOP_STAGES) tune
    the looped and split kernels, ``rows_per_chunk`` and ``channel_block``
    ((BLOCK_C, groups per program); None: pick_channel_block) the split ones;
    the defaults pick them from the shape (``num_warps`` also sets the cluster
    kernel's warps a CTA). ``traceable``: called from the
    registered op (see ``launchable``).
    """
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
    HW = H * W
    group_size = C // num_groups
    dummy = x  # stands in for absent optional pointers (never dereferenced)
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
    # Every kernel takes the same input pointers first; absent ones are stood in for by x.
    inputs = tuple(t if t is not None else dummy for t in (x, concat, skip, add, s))
    affine = tuple(t if t is not None else dummy for t in (weight, bias))
    has = dict(HAS_X2=concat is not None, HAS_SKIP=skip is not None, HAS_ADD=add is not None)
    e4m3 = (e4m3_scale, e4m3_amax) if fp8 else (dummy, dummy)
    stages = LOOP_STAGES if loop_stages is None else loop_stages

    if path is None:
        path = "single" if single_pass_fits(HW, group_size) else "looped" if looped_fits(HW) else "split"
        if (path == "looped" and skip is None and (CLUSTER_TAKES_E4M3 or not fp8) and not traceable
                and cluster_takes(x, num_groups, HW, group_size)):  # which asks cluster.refusal
            path = "cluster"
    elif path == "cluster":  # asked for by name: checked here, once, as cluster_takes checks the default's choice
        problem = cluster.refusal(x, HW, group_size)
        if problem:
            raise ValueError(f"group_norm (cluster): {problem}")
    if path not in ("single", "looped", "split", "cluster"):
        raise ValueError(f"unknown group_norm path {path!r}")
    if path == "cluster":
        if skip is not None:
            raise ValueError("the cluster GroupNorm takes no skip")
        cluster.launch_group_norm_cluster(x, concat, add, s, weight, bias, out, num_groups, eps, silu, out_scale,
                                          strides, add_strides, num_warps, e4m3=e4m3 if fp8 else None)
        return out, s
    if path != "split":  # the single-pass and looped kernels (grid: groups x samples) take the same arguments
        group_args = (*inputs, *affine, out, *e4m3, HW, C, C1, C2, eps, out_scale, *strides, *add_strides)
        group_flags = dict(GROUP_SIZE=group_size, WRITE_SUM=write_sum, HAS_WEIGHT=weight is not None,
                           HAS_BIAS=bias is not None, APPLY_SILU=silu, FP8_OUT=fp8, **has)
    if path == "single":
        if not single_pass_fits(HW, group_size):
            raise ValueError(f"a group of {HW} x {group_size} values is too large for the single-pass kernel")
        block_hw, block_c = next_pow2(HW), next_pow2(group_size)
        launchable(_group_norm_single_kernel, traceable)[(num_groups, N)](
            *group_args, BLOCK_HW=block_hw, BLOCK_C=block_c, num_warps=8 if block_hw * block_c > 4096 else 4,
            **group_flags,
        )
        return out, s

    if path == "looped":
        block_c = next_pow2(group_size)
        block_hw = max(1, min((tile_elems or LOOPED_TILE_ELEMS) // block_c, next_pow2(HW)))
        if num_warps is None:  # few programs: more warps each to keep loads in flight (measured, see above)
            num_warps = 8 if N * num_groups < parallel_target(x) else 4
        launchable(_group_norm_looped_kernel, traceable)[(num_groups, N)](
            *group_args, BLOCK_HW=block_hw, BLOCK_C=block_c, num_warps=num_warps, LOOP_STAGES=stages,
            **group_flags,
        )
        return out, s

    max_block_c, split_tile = ((SPLIT_MAX_BLOCK_C, SPLIT_TILE_ELEMS) if concat is None
                               else (CONCAT_MAX_BLOCK_C, CONCAT_TILE_ELEMS))
    block_c, groups_per_block = channel_block or pick_channel_block(C, num_groups, max_block_c)
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
    common = dict(
        GROUP_SIZE=group_size, GROUPS_PER_BLOCK=groups_per_block,
        BLOCK_HW=block_hw, BLOCK_C=block_c, BLOCK_G=block_g, num_warps=num_warps or 4, LOOP_STAGES=stages, **has,
    )
    launchable(_group_norm_stats_kernel, traceable)[grid](
        *inputs, part_mean, part_m2,
        HW, C, C1, C2, num_groups, rows_per_chunk, num_chunks, *strides, *add_strides,
        WRITE_SUM=write_sum, **common,
    )
    launchable(_group_norm_apply_kernel, traceable)[grid](
        *inputs, *affine, out, *e4m3, part_mean, part_m2,
        HW, C, C1, C2, num_groups, rows_per_chunk, num_chunks, eps, out_scale, *strides, *add_strides,
        CHUNK_TILE=CHUNK_TILE, READ_SUM=write_sum,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, APPLY_SILU=silu, FP8_OUT=fp8,
        **common,
    )
    return out, s


# ---------------------------------------------------------------- public op

def _group_norm_run(x, num_groups, weight, bias, eps, silu, add, skip, write_sum, traceable, scale=1.0,
                    concat=None, out_scale=None, out_amax=None):
    """The reference where Triton cannot run, else the kernels: y, or (y, s)."""
    if not use_triton(x):
        return group_norm_reference(x, num_groups, weight, bias, eps, silu=silu, add=add, skip=skip,
                                    return_sum=write_sum, scale=scale, concat=concat, out_scale=out_scale,
                                    out_amax=out_amax)
    y, s = launch_group_norm(x, num_groups, weight, bias, eps, silu, add, skip, write_sum, out_scale=scale,
                             concat=concat, traceable=traceable, e4m3_scale=out_scale, e4m3_amax=out_amax)
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
    scale: float = 1.0,
    concat: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    return _group_norm_run(x, num_groups, weight, bias, eps, silu, add, skip, False, True, scale, concat)


def _group_norm_with_sum_op_body(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    silu: bool,
    add: Optional[torch.Tensor],
    skip: Optional[torch.Tensor],
    scale: float = 1.0,
    concat: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _group_norm_run(x, num_groups, weight, bias, eps, silu, add, skip, True, True, scale, concat)


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
    scale: float = 1.0,
    concat: Optional[torch.Tensor] = None,
    out_scale: Optional[torch.Tensor] = None,
    out_amax: Optional[torch.Tensor] = None,
):
    """GroupNorm of ``x + skip + add`` (then SiLU if ``silu``, then times ``scale``), fused.

    x: (N, C, H, W), channels_last preferred; the output keeps x's memory format.
    concat: (N, C2, H, W) channels appended to x's: the norm of torch.cat([x, concat], 1), read from both in
         place (a UNet up block's skip connection); the output is channels_last, s the concatenation.
    add: N*C values, e.g. (N, C) or (N, C, 1, 1), broadcast over H, W
         (the ResNet time-embedding projection). skip: same shape as x.
    return_sum: also return s = x + skip + add (x itself when there is
         nothing to add), for SkipGroupNorm.
    scale: multiplies the output (last, after the SiLU); the sum is not scaled.
    out_scale, out_amax: 1-element float32 tensors: y is returned in e4m3 as
         y / out_scale (saturated), for an FP8 convolution, and max |y| is
         recorded into out_amax (atomic max) for the next call's scale
         (engines/fp8.py).
    """
    fp8 = check_fp8_output(out_scale, out_amax, x)
    if return_sum and skip is None and add is None and concat is None:
        # An op may not return its own input, so the trivial sum stays out here.
        return group_norm(x, num_groups, weight, bias, eps, silu=silu, scale=scale, out_scale=out_scale,
                          out_amax=out_amax), x
    if compiling():  # torch.compile must see one registered op
        if fp8:
            raise ValueError("group_norm: e4m3 output is not traceable by torch.compile")
        op = _group_norm_with_sum_op if return_sum else _group_norm_op
        return op(x, num_groups, weight, bias, eps, silu, add, skip, scale, concat)
    # Eager: launch directly, skipping the dispatcher.
    return _group_norm_run(x, num_groups, weight, bias, eps, silu, add, skip, return_sum, False, scale, concat,
                           out_scale, out_amax)
