"""A k x k convolution (stride 1, "same" padding) as an implicit GEMM on Hopper (sm_90), in Gluon.

    out[n, h, w, :] = sum over (i, j, c) of x[n, h + i - p, w + j - p, c] * W[:, i, j, c]   (NHWC, zero padding)
                      (+ bias[:]) (+ residual[n, h, w, :])

cuDNN's kernels for SD's 3x3 convolutions use 128 x 128 tiles. At SD1.5's 64x64 level at CFG batch 2 (8192 output
pixels x 320 channels) that is 64 x 3 tiles, the third column tile half empty, in 1.45 waves over an H100's 132 SMs:
33 us a convolution inside the UNet's graph, 450-520 TFLOP/s (a graphed profile). Here a tile is
128 pixels x (BN_A + BN_B) channels, with BN_A + BN_B = 160 or 80 (two accumulators, since a Gluon tensor's sides
are powers of two): 320 channels are two column tiles, and that convolution is 128 tiles, one wave.

- The input is read in place through a 4-D TMA descriptor over NHWC memory. A K step is one filter tap (i, j) and
  BLOCK_K input channels: the loader asks for the box of the tile's rows shifted by (i - p, j - p). Where the box
  leaves the image, TMA fills zeros: the padding costs nothing and no im2col matrix is written.
- The weight, channels_last, is already the (Cout, k*k*Cin) matrix the GEMM needs, tap-major.
- Warp-specialized and persistent, as kernels/linear_geglu_sm90.py: a producer warp keeps a ring of STAGES slots
  full; two math warpgroups share every tile, 64 rows each, so a weight tile in shared memory serves 128 rows
  (cooperative; with K = 9 x 320 and up the main loop dominates, not the epilogue).
- A tile's 128 pixels are whole image rows (or a run within one) of one image, so they are 128 consecutive rows of
  the (N*H*W, Cout) output, which TMA stores directly.
- The epilogue adds a bias and a residual (a ResNet block's conv2 with its skip connection), both optional at run
  time, so one binary serves all: the separate add kernel would read the output back and write it again.

conv2d_sm90_fp8 runs the same kernel on e4m3 x and W (wgmma m64nNk32), scales the products back by
x_scale * w_scale and writes fp16 (or bf16), bias and residual added as above: the FP8 mode's ResNet convolutions,
whose inputs GroupNorm + SiLU writes in e4m3 (engines/fast/fp8.py).

Only for sm_90; the fast engine times it against cuDNN per shape (engines/fast/convolution.py). The reference is
F.conv2d.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._triton import sm_count
from .fp8 import E4M3, scale_refusal
from .gluon_hopper import (  # noqa: F401 - gluon and available are part of this module's interface
    HALF_DTYPES, available, descriptor, device_refusal, fence_async_shared, gl, gluon, mbarrier, refusal, regs, tma,
    warpgroup_mma, warpgroup_mma_wait,
)
from .gluon_hopper import tma_load as _tma_load
from .gluon_hopper import tma_store as _tma_store

LOADER_REGS = regs(40)  # the producer warp only walks tiles and issues TMA
CONSUMER_REGS = regs(232)  # the second math warpgroup

__all__ = ["BLOCK_M", "CONFIGS", "FP8_CONFIGS", "available", "config_name", "conv2d_fp8_reference", "conv2d_reference",
           "conv2d_sm90", "conv2d_sm90_fp8", "epilogue_refusal", "fp8_refusal", "supports"]

BLOCK_M = 128  # output pixels a tile (two warpgroups of 64)

# (BN_A, BN_B, BLOCK_K, STAGES): a tile's channels are BN_A + BN_B, in two accumulators. 160 takes SD's 320, 640 and
# 1280 channels without a ragged tile; 80 makes 4x the tiles where 160 leaves SMs idle (640 channels at 32x32, CFG
# batch 2: 16 row tiles). Shared memory: STAGES x (128 + BN) x BLOCK_K x 2 bytes, plus 2 x 64 x BN x 2 for the stores.
CONFIGS = [(128, 32, 64, 4), (64, 16, 64, 6)]
# e4m3 operands: K steps of 64 one-byte values (64-byte rows; 320 input channels are five of them) in twice the
# stages of the fp16 configs, or of 128 (the fp16 configs' bytes) where the channels are multiples of 128.
FP8_CONFIGS = [(128, 32, 64, 8), (64, 16, 64, 12), (128, 32, 128, 4)]


def config_name(config: tuple) -> str:
    """(128, 32, 64, 4) -> "128+32x64s4": channels a tile (two parts), K step, stages."""
    bn_a, bn_b, block_k, stages = config
    return f"{bn_a}+{bn_b}x{block_k}s{stages}"


def conv2d_reference(x: torch.Tensor, weight: torch.Tensor, padding: int, bias: Optional[torch.Tensor] = None,
                     residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    out = F.conv2d(x, weight, None if bias is None else bias.to(x.dtype), 1, padding)
    return out if residual is None else out + residual


def conv2d_fp8_reference(x8: torch.Tensor, x_scale: torch.Tensor, w_rows8: torch.Tensor, w_scale: torch.Tensor,
                         ksize: int, bias: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
                         out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """conv2d_sm90_fp8 in fp32 from the dequantized operands (x8 channels_last e4m3, W as (Cout, k*k*Cin) rows),
    rounded once to out_dtype, channels_last."""
    cout, cin = w_rows8.shape[0], x8.shape[1]
    w = (w_rows8.float() * w_scale.float()).view(cout, ksize, ksize, cin).permute(0, 3, 1, 2)
    out = F.conv2d(x8.float() * x_scale.float(), w, None if bias is None else bias.float(), 1, ksize // 2)
    if residual is not None:
        out = out + residual.float()
    return out.to(out_dtype).contiguous(memory_format=torch.channels_last)


if gluon is not None:

    @gluon.jit
    def _tile_origin(tile, num_n, tiles_h, tiles_w, BH: gl.constexpr, BW: gl.constexpr, BN: gl.constexpr):
        """Column tiles fastest: the CTAs that run at once share input rows, read from memory once."""
        tm = tile // num_n
        image = tm // (tiles_h * tiles_w)
        rest = tm % (tiles_h * tiles_w)
        return image, (rest // tiles_w) * BH, (rest % tiles_w) * BW, tm * (BH * BW), (tile % num_n) * BN

    @gluon.jit
    def _loader(x_desc, wa_desc, wb_desc, a_s, wa_s, wb_s, ready_bars, free_bars,
                Cin, num_n, tiles_h, tiles_w, num_tiles, num_programs,
                KSIZE: gl.constexpr, PAD: gl.constexpr, BN_A: gl.constexpr, BN_B: gl.constexpr, STAGES: gl.constexpr):
        """The producer warp: every K step (tap, channel block) of every tile this CTA owns, as slots free up."""
        BH: gl.constexpr = x_desc.block_type.shape[1]
        BW: gl.constexpr = x_desc.block_type.shape[2]
        BLOCK_K: gl.constexpr = x_desc.block_type.shape[3]
        nbytes: gl.constexpr = x_desc.block_type.nbytes + wa_desc.block_type.nbytes + wb_desc.block_type.nbytes
        c_steps = Cin // BLOCK_K
        k_steps = KSIZE * KSIZE * c_steps
        it = 0
        for tile in range(gl.program_id(0), num_tiles, num_programs):
            image, h0, w0, off_m, off_n = _tile_origin(tile, num_n, tiles_h, tiles_w, BH, BW, BN_A + BN_B)
            for ki in range(k_steps):
                tap = ki // c_steps
                off_c = (ki % c_steps) * BLOCK_K
                slot = it % STAGES
                # Both math warpgroups free a slot once per use; the first STAGES uses find it free.
                mbarrier.wait(free_bars.index(slot), ((it // STAGES) - 1) & 1, pred=it >= STAGES)
                bar = ready_bars.index(slot)
                mbarrier.expect(bar, nbytes)  # a box partly outside the image still counts whole (zero-filled)
                box = a_s.index(slot).reshape([1, BH, BW, BLOCK_K])
                _tma_load(x_desc, [image, h0 + tap // KSIZE - PAD, w0 + tap % KSIZE - PAD, off_c], bar, box)
                off_k = tap * Cin + off_c
                _tma_load(wa_desc, [off_n, off_k], bar, wa_s.index(slot))
                _tma_load(wb_desc, [off_n + BN_A, off_k], bar, wb_s.index(slot))
                it += 1

    @gluon.jit
    def _consumer(a_s, wa_s, wb_s, ready_bars, free_bars, oa_s, ob_s, outa_desc, outb_desc,
                  bias_ptr, resa_desc, resb_desc, res_bar, has_bias, has_residual,
                  num_n, tiles_h, tiles_w, num_tiles, k_steps, num_programs, x_scale_ptr, w_scale_ptr,
                  C: gl.constexpr, BH: gl.constexpr, BW: gl.constexpr, BN_A: gl.constexpr, BN_B: gl.constexpr,
                  STAGES: gl.constexpr, FP8: gl.constexpr):
        """Math warpgroup C: rows 64 C .. 64 C + 63 of every tile the CTA owns. FP8: e4m3 operands, the products
        scaled back by x_scale * w_scale."""
        ROWS: gl.constexpr = (BH * BW) // 2
        ROW0: gl.constexpr = C * ROWS
        INSTR_K: gl.constexpr = 32 if FP8 else 16  # wgmma's K: 32 bytes of operand a row either way
        layout_a: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BN_A, INSTR_K])
        layout_b: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BN_B, INSTR_K])
        zero_a = gl.zeros([ROWS, BN_A], gl.float32, layout_a)
        zero_b = gl.zeros([ROWS, BN_B], gl.float32, layout_b)
        bias_on = has_bias != 0
        res_on = has_residual != 0
        out_a = oa_s.index(C)
        out_b = ob_s.index(C)
        pid = gl.program_id(0)
        if FP8:
            product_scale = gl.load(x_scale_ptr) * gl.load(w_scale_ptr)
        for tile in range(pid, num_tiles, num_programs):
            image, h0, w0, off_m, off_n = _tile_origin(tile, num_n, tiles_h, tiles_w, BH, BW, BN_A + BN_B)
            local = (tile - pid) // num_programs  # the CTA's how-manyth tile
            it = local * k_steps  # the tile's first use of the ring, in the loader's order
            if res_on:
                # The residual tile comes by TMA into the staging buffers while the products run, once the previous
                # tile's store has read them.
                tma.store_wait(0)
                mbarrier.expect(res_bar, resa_desc.block_type.nbytes + resb_desc.block_type.nbytes)
                _tma_load(resa_desc, [off_m + ROW0, off_n], res_bar, out_a)
                _tma_load(resb_desc, [off_m + ROW0, off_n + BN_A], res_bar, out_b)
            slot = it % STAGES
            mbarrier.wait(ready_bars.index(slot), (it // STAGES) & 1)
            a = a_s.index(slot).slice(ROW0, ROWS)
            acc_a = warpgroup_mma(a, wa_s.index(slot).permute((1, 0)), zero_a, use_acc=False, is_async=True)
            acc_b = warpgroup_mma(a, wb_s.index(slot).permute((1, 0)), zero_b, use_acc=False, is_async=True)
            acc_a, acc_b = warpgroup_mma_wait(num_outstanding=2, deps=(acc_a, acc_b))  # makes them loop values
            for ki in range(1, k_steps):
                prev = slot
                it += 1
                slot = it % STAGES
                mbarrier.wait(ready_bars.index(slot), (it // STAGES) & 1)
                a = a_s.index(slot).slice(ROW0, ROWS)
                acc_a = warpgroup_mma(a, wa_s.index(slot).permute((1, 0)), acc_a, is_async=True)
                acc_b = warpgroup_mma(a, wb_s.index(slot).permute((1, 0)), acc_b, is_async=True)
                # The previous step's products are done once at most these two are in flight: free its slot.
                acc_a, acc_b = warpgroup_mma_wait(num_outstanding=2, deps=(acc_a, acc_b))
                mbarrier.arrive(free_bars.index(prev))
            # The bias, loaded while the last step's products finish (predicated off when absent).
            cols_a = off_n + gl.arange(0, BN_A, layout=gl.SliceLayout(0, layout_a))
            cols_b = off_n + BN_A + gl.arange(0, BN_B, layout=gl.SliceLayout(0, layout_b))
            bias_a = gl.load(bias_ptr + cols_a, mask=(cols_a >= 0) & bias_on, other=0.0)
            bias_b = gl.load(bias_ptr + cols_b, mask=(cols_b >= 0) & bias_on, other=0.0)
            acc_a, acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, acc_b))
            mbarrier.arrive(free_bars.index(slot))
            if FP8:
                acc_a = acc_a * product_scale
                acc_b = acc_b * product_scale
            acc_a = acc_a + bias_a.to(gl.float32)[None, :]
            acc_b = acc_b + bias_b.to(gl.float32)[None, :]
            if res_on:
                # Each thread reads the residual's elements it then overwrites with the result: no hazard.
                mbarrier.wait(res_bar, local & 1)
                acc_a = acc_a + out_a.load(layout_a).to(gl.float32)
                acc_b = acc_b + out_b.load(layout_b).to(gl.float32)
            else:
                tma.store_wait(0)  # this warpgroup's previous tile has left its staging buffers
            out_a.store(acc_a.to(outa_desc.dtype))
            out_b.store(acc_b.to(outb_desc.dtype))
            fence_async_shared()
            _tma_store(outa_desc, [off_m + ROW0, off_n], out_a)
            _tma_store(outb_desc, [off_m + ROW0, off_n + BN_A], out_b)
        tma.store_wait(0)

    # Sizes are not specialized on: no recompile per batch (a new width is a new box, so a new compile anyway).
    # The epilogue's flags neither: one binary with and without a bias and a residual.
    @gluon.jit(do_not_specialize=["Cin", "num_n", "tiles_h", "tiles_w", "num_tiles", "has_bias", "has_residual"])
    def _conv_sm90_kernel(
        x_desc, wa_desc, wb_desc, outa_desc, outb_desc, bias_ptr, resa_desc, resb_desc, has_bias, has_residual,
        Cin, num_n, tiles_h, tiles_w, num_tiles, num_programs, x_scale_ptr, w_scale_ptr,
        KSIZE: gl.constexpr, PAD: gl.constexpr, STAGES: gl.constexpr, FP8: gl.constexpr,
    ):
        dtype: gl.constexpr = x_desc.dtype
        out_dtype: gl.constexpr = outa_desc.dtype
        BH: gl.constexpr = x_desc.block_type.shape[1]
        BW: gl.constexpr = x_desc.block_type.shape[2]
        BLOCK_K: gl.constexpr = x_desc.block_type.shape[3]
        BN_A: gl.constexpr = wa_desc.block_type.shape[0]
        BN_B: gl.constexpr = wb_desc.block_type.shape[0]
        k_steps = KSIZE * KSIZE * (Cin // BLOCK_K)

        # The input box (1, BH, BW, BLOCK_K) is kept as the (BH * BW, BLOCK_K) matrix the products read: the same
        # bytes, as the swizzle runs along BLOCK_K within each row of 128 bytes either way.
        a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH * BW, BLOCK_K], dtype)
        a_s = gl.allocate_shared_memory(dtype, [STAGES, BH * BW, BLOCK_K], a_layout)
        wa_s = gl.allocate_shared_memory(dtype, [STAGES, BN_A, BLOCK_K], wa_desc.layout)
        wb_s = gl.allocate_shared_memory(dtype, [STAGES, BN_B, BLOCK_K], wb_desc.layout)
        oa_s = gl.allocate_shared_memory(out_dtype, [2] + outa_desc.block_type.shape, outa_desc.layout)
        ob_s = gl.allocate_shared_memory(out_dtype, [2] + outb_desc.block_type.shape, outb_desc.layout)
        ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        free_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        res_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # one a math warpgroup
        for i in gl.static_range(STAGES):
            mbarrier.init(ready_bars.index(i), count=1)
            mbarrier.init(free_bars.index(i), count=2)  # both math warpgroups read every use of a slot
        for i in gl.static_range(2):
            mbarrier.init(res_bars.index(i), count=1)
        fence_async_shared()

        gl.warp_specialize([
            (_consumer, (a_s, wa_s, wb_s, ready_bars, free_bars, oa_s, ob_s, outa_desc, outb_desc,
                         bias_ptr, resa_desc, resb_desc, res_bars.index(0), has_bias, has_residual,
                         num_n, tiles_h, tiles_w, num_tiles, k_steps, num_programs, x_scale_ptr, w_scale_ptr,
                         0, BH, BW, BN_A, BN_B, STAGES, FP8)),
            (_consumer, (a_s, wa_s, wb_s, ready_bars, free_bars, oa_s, ob_s, outa_desc, outb_desc,
                         bias_ptr, resa_desc, resb_desc, res_bars.index(1), has_bias, has_residual,
                         num_n, tiles_h, tiles_w, num_tiles, k_steps, num_programs, x_scale_ptr, w_scale_ptr,
                         1, BH, BW, BN_A, BN_B, STAGES, FP8)),
            (_loader, (x_desc, wa_desc, wb_desc, a_s, wa_s, wb_s, ready_bars, free_bars,
                       Cin, num_n, tiles_h, tiles_w, num_tiles, num_programs, KSIZE, PAD, BN_A, BN_B, STAGES)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])

        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready_bars.index(i))
            mbarrier.invalidate(free_bars.index(i))
        for i in gl.static_range(2):
            mbarrier.invalidate(res_bars.index(i))


# ----------------------------------------------------------------- launcher

def _box(height: int, width: int) -> tuple[int, int] | None:
    """(rows, columns) of the image a 128-pixel tile covers, or None when tiles cannot be whole boxes of it."""
    if width >= BLOCK_M:
        return (1, BLOCK_M) if width % BLOCK_M == 0 else None
    if BLOCK_M % width or height % (BLOCK_M // width):
        return None
    return BLOCK_M // width, width


def _shape_refusal(cin: int, height: int, width: int, cout: int, config: tuple) -> str | None:
    bn_a, bn_b, block_k, _ = config
    if cin % block_k or cout % (bn_a + bn_b):
        return f"{cin} -> {cout} channels (multiples of {block_k} in, {bn_a + bn_b} out)"
    if _box(height, width) is None:
        return f"a {height}x{width} image is not whole {BLOCK_M}-pixel boxes"
    return None


def supports(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 1,
             config: Optional[tuple] = None) -> str | None:
    """Why the kernel cannot take this convolution (None: it can)."""
    problem = refusal(x, weight)
    if problem:
        return problem
    if x.dim() != 4 or weight.dim() != 4 or weight.shape[1] != x.shape[1] or weight.shape[2] != weight.shape[3]:
        return f"x {tuple(x.shape)} and W {tuple(weight.shape)} (an ungrouped square filter)"
    k = weight.shape[-1]
    if stride != 1 or k % 2 == 0 or padding != k // 2:
        return f"stride {stride}, padding {padding} for a {k}x{k} filter (stride 1, 'same' padding only)"
    if not x.is_contiguous(memory_format=torch.channels_last) or not weight.is_contiguous(
            memory_format=torch.channels_last):
        return "x and W must be channels_last (read in place)"
    problem = _shape_refusal(x.shape[1], x.shape[2], x.shape[3], weight.shape[0], config or CONFIGS[0])
    if problem:
        return problem
    if x.data_ptr() % 16 or weight.data_ptr() % 16:
        return "x or W is not 16-byte aligned for TMA"
    return None


def fp8_refusal(shape: tuple, device: torch.device, cout: int, ksize: int,
                config: Optional[tuple] = None) -> str | None:
    """Why conv2d_sm90_fp8 cannot take an input of `shape` (N, Cin, H, W) on `device` into cout channels through a
    ksize x ksize filter (None: it can): what a caller checks before writing that input in e4m3."""
    problem = device_refusal(device)
    if problem:
        return problem
    if len(shape) != 4 or ksize % 2 == 0:
        return f"input {tuple(shape)} with a {ksize}x{ksize} filter (4-D input, odd filter)"
    return _shape_refusal(shape[1], shape[2], shape[3], cout, config or FP8_CONFIGS[0])


def epilogue_refusal(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     residual: Optional[torch.Tensor], out_dtype: Optional[torch.dtype] = None) -> str | None:
    """Why the epilogue cannot add this bias and residual to the convolution of x by weight (None: it can).
    out_dtype: the output's (x's when None); bias and residual must have it."""
    n, _, h, w = x.shape
    cout = weight.shape[0]
    dtype = out_dtype or x.dtype
    if bias is not None and (bias.shape != (cout,) or bias.dtype != dtype or not bias.is_contiguous()
                             or bias.device != x.device):
        return (f"bias {tuple(bias.shape)} {bias.dtype} for {cout} channels {dtype} (a contiguous vector of the "
                "output's dtype, on the input's device)")
    if residual is not None and (residual.shape != (n, cout, h, w) or residual.dtype != dtype
                                 or residual.device != x.device or residual.data_ptr() % 16
                                 or not residual.is_contiguous(memory_format=torch.channels_last)):
        return (f"residual {tuple(residual.shape)} {residual.dtype} for an output {(n, cout, h, w)} {dtype} "
                "(channels_last, same shape and dtype, 16-byte aligned for TMA)")
    return None


def conv2d_sm90(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 1, *,
                config: Optional[tuple] = None, bias: Optional[torch.Tensor] = None,
                residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride, padding) (+ residual) for channels_last x and W; the result is
    channels_last. residual: the output's shape and dtype, channels_last, added in the epilogue with the bias.
    config: one of CONFIGS (or any (BN_A, BN_B, BLOCK_K, STAGES) of powers of two that fits shared memory); None:
    CONFIGS[0]. Raises ValueError for convolutions it does not take."""
    config = config or CONFIGS[0]
    reason = supports(x, weight, stride, padding, config) or epilogue_refusal(x, weight, bias, residual)
    if reason:
        raise ValueError(f"conv2d_sm90: {reason}")
    cout, k = weight.shape[0], weight.shape[-1]
    w_rows = weight.permute(0, 2, 3, 1).reshape(cout, -1)  # a view: channels_last is tap-major rows
    return _launch(x, w_rows, k, padding, config, bias, residual, x.dtype)


def conv2d_sm90_fp8(x8: torch.Tensor, x_scale: torch.Tensor, w_rows8: torch.Tensor, w_scale: torch.Tensor,
                    ksize: int, *, bias: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
                    out_dtype: torch.dtype = torch.float16, config: Optional[tuple] = None) -> torch.Tensor:
    """conv2d((x8 * x_scale), (W * w_scale)) ("same" padding, stride 1) + bias + residual, in out_dtype: x8 (N, Cin,
    H, W) e4m3 channels_last; W as the (Cout, ksize * ksize * Cin) e4m3 matrix of channels_last rows (tap-major,
    conv.weight.permute(0, 2, 3, 1)); x_scale and w_scale 1-element float32 tensors; bias and residual in out_dtype.
    config: one of FP8_CONFIGS (None: the first). Raises ValueError for inputs it does not take."""
    config = config or FP8_CONFIGS[0]
    if x8.dtype != E4M3 or w_rows8.dtype != E4M3:
        raise ValueError(f"conv2d_sm90_fp8: x and W must be e4m3, got {x8.dtype} / {w_rows8.dtype}")
    if out_dtype not in HALF_DTYPES:
        raise ValueError(f"conv2d_sm90_fp8: out_dtype {out_dtype} (fp16 or bf16)")
    reason = fp8_refusal(x8.shape, x8.device, w_rows8.shape[0], ksize, config)
    if reason is None and (w_rows8.dim() != 2 or w_rows8.shape[1] != ksize * ksize * x8.shape[1]
                           or not w_rows8.is_contiguous()):
        reason = f"W {tuple(w_rows8.shape)} for {x8.shape[1]} channels and a {ksize}x{ksize} filter (dense rows)"
    if reason is None and not x8.is_contiguous(memory_format=torch.channels_last):
        reason = "x must be channels_last (read in place)"
    if reason is None and (x8.data_ptr() % 16 or w_rows8.data_ptr() % 16):
        reason = "x or W is not 16-byte aligned for TMA"
    reason = (reason or scale_refusal(x8, x_scale=x_scale, w_scale=w_scale)
              or epilogue_refusal(x8, w_rows8, bias, residual, out_dtype))
    if reason:
        raise ValueError(f"conv2d_sm90_fp8: {reason}")
    return _launch(x8, w_rows8, ksize, ksize // 2, config, bias, residual, out_dtype, (x_scale, w_scale))


def _launch(x: torch.Tensor, w_rows: torch.Tensor, k: int, padding: int, config: tuple,
            bias: Optional[torch.Tensor], residual: Optional[torch.Tensor], out_dtype: torch.dtype,
            scales: Optional[tuple] = None) -> torch.Tensor:
    """The kernel over channels_last x and W's (Cout, k*k*Cin) rows, both checked; scales: (x_scale, w_scale)
    for e4m3 operands."""
    bn_a, bn_b, block_k, stages = config
    n, cin, h, w = x.shape
    cout = w_rows.shape[0]
    bh, bw = _box(h, w)
    out = torch.empty((n, cout, h, w), dtype=out_dtype, device=x.device, memory_format=torch.channels_last)
    out_rows = out.permute(0, 2, 3, 1).view(n * h * w, cout)  # NHWC memory: pixel rows of channels

    def half_tiles(rows):  # each math warpgroup's 64 rows x (BN_A | BN_B) channels of an NHWC output-shaped matrix
        return descriptor(rows, [BLOCK_M // 2, bn_a]), descriptor(rows, [BLOCK_M // 2, bn_b])

    tiles_h, tiles_w, num_n = h // bh, w // bw, cout // (bn_a + bn_b)
    num_tiles = n * tiles_h * tiles_w * num_n
    programs = min(num_tiles, sm_count(x))
    out_tiles = half_tiles(out_rows)
    # Absent operands: the output itself, never read (the loads are predicated off or not issued).
    res_tiles = out_tiles if residual is None else half_tiles(residual.permute(0, 2, 3, 1).view(n * h * w, cout))
    _conv_sm90_kernel[(programs,)](
        descriptor(x.permute(0, 2, 3, 1), [1, bh, bw, block_k]),
        descriptor(w_rows, [bn_a, block_k]), descriptor(w_rows, [bn_b, block_k]),
        *out_tiles, out if bias is None else bias, *res_tiles,
        int(bias is not None), int(residual is not None),
        cin, num_n, tiles_h, tiles_w, num_tiles, programs, *(scales or (out, out)),
        KSIZE=k, PAD=padding, STAGES=stages, FP8=scales is not None, num_warps=4,
    )
    return out
