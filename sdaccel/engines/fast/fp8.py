"""The fast engine's opt-in FP8 mode (`FastEngine(fp8=True)`): the transformer blocks' GEMMs and the ResNet
blocks' convolutions in e4m3.

Which GEMMs: in every fused transformer block at least MIN_WIDTH channels wide, the four whose input an sdaccel
kernel writes, so that the cast to e4m3 costs nothing (that kernel writes one byte a value instead of two):
    LayerNorm 1          -> packed Q/K/V projection
    SkipLayerNorm 2      -> cross-attention's Q projection
    SkipLayerNorm 3      -> feed-forward's first GEMM, its bias and GEGLU, which write e4m3
    GEGLU                -> feed-forward's second GEMM (then added onto the residual stream)
The attention output projections, proj_in / proj_out, the text K/V and time projections stay fp16.
The GEMMs run in cuBLASLt through torch._scaled_mm (fp32 accumulation, fp16 output), except the feed-forward's
first where the pick takes the Gluon e4m3 GEMM + GEGLU kernel for its shape (feed_forward.linear_geglu_fp8).
Whether a block runs so is decided per input shape (block_in_fp8), so that the mode is never slower where a block's
GEMMs are too small to gain: when the e4m3-writing norms still cost more than fp16 ones, SD1.5's 640-wide blocks at
CFG batch 2 (2048 rows) and its 64-token ones timed slower in e4m3 and stayed fp16; since then every SD1.5 and SDXL
block shape measured picks e4m3 (H200, twentieth session), but for near-ties that flip between runs (those two at
CFG batch 2 picked fp16 in one of four runs, twenty-second session).

And, unless the engine's fp8_convs is False, in every fused ResNet block, on sm_90, both 3x3 convolutions, whose
inputs GroupNorm + SiLU writes:
    GroupNorm 1 + SiLU   -> conv1
    GroupNorm 2 + SiLU   -> conv2 (its bias and the shortcut added in the kernel's epilogue)
through the Gluon implicit-GEMM convolution with e4m3 operands (kernels/conv_sm90.py). Whether a convolution
takes it is decided per input shape (conv_config): where the kernel cannot tile it (the 8x8 level) or where the
fp16 path timed faster (convolution.fp8_path: small ones, at CFG batch 2), it stays fp16. The shortcut's 1x1
convolution reads the block's input, which no kernel of ours writes, and stays fp16.

Scales (per tensor):
- weights: amax(W) / 448, quantized once when the modules are fused (a convolution's when a shape first may run
  it in e4m3), again on refresh (a LoRA fuse);
- activations: delayed scaling, as Transformer Engine does it: each producing kernel records max |y| of this
  call into a device float, and after the UNet call (a hook on its last layer, so inside its CUDA graph) every
  scale becomes amax / 448 and the amaxes restart from zero. A call runs with the scales of the call before it;
  values beyond them saturate at +-448 * scale. The first scales are 1: e4m3 is a floating-point format, so a
  scale only moves its range (2^-9 .. 448), which LayerNorm and GEGLU outputs of order 1 sit inside already.

What it costs in accuracy, and why it is opt-in: e4m3 keeps 3 mantissa bits, so one UNet call lands much further
from fp32 than fp16 does (benchmarks/README.md, seventeenth session), outside the numerics rule the default engine
meets. Whether images of a trained model hold up is for `sdaccel compare` on that model to say.

Memory: a site's fp16 weights, which only its fp16 path reads, move to pinned host memory once its e4m3 copy is
made (HostFp16; the engine's fp8_host_weights). A shape whose pick keeps the site in fp16 (SD1.5's 8x8-level
convolutions, which the kernel cannot tile) brings them back to the GPU for good; a pick's timing borrows them.
And a convolution's e4m3 copy is made only when a shape may run it in e4m3 (Fp8Weight's lazy). So where e4m3 runs
the GPU holds one byte a weight, not three: before, the mode's first image took more memory than eager's (SD1.5 at
batch 1 on an H200: 3117 MB against eager's 2549; with both, 2484. SDXL: 10137 MB, now 6345, against 10527;
twenty-second session).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from ..kernels import conv_sm90
from ..kernels.fp8 import E4M3, E4M3_MAX, quantize_e4m3_reference
from ..kernels.fp8_scales import update_scales_
from ..kernels.precompile import is_recording
from .convolution import add_bias_residual, fp8_decided, fp8_path
from .kernel_pick import ShapePicks, cuda_time_ms, fastest

SITES_PER_BLOCK = 4  # qkv, cross_q, ff_in, ff_out (FusedTransformerBlock's order)
SITES_PER_RESNET = 2  # conv1, conv2 (FusedResnetBlock's)
# Blocks narrower than this stay fp16. At 320 channels the GEMMs are short in K, and the fp16 path's fused GEMM +
# GEGLU kernel (no wide intermediate) and its residual add inside cuBLAS beat e4m3: with every block in e4m3, an
# SD1.5 UNet call (all of whose 4096-token blocks are 320 wide) was 4% slower at CFG batch 2 and 3% at 16, while
# SDXL's (640 and 1280 wide) was 10% faster (H200, seventeenth session). Offered to the block pick since (MIN_WIDTH
# 320), SD1.5's 320-wide blocks picked fp16 at CFG batch 2 and 16 (H200, twenty-first session): leaving them out
# spares the warm-up their timing.
MIN_WIDTH = 640


BLOCK_FP8, BLOCK_FP16 = "fp8", "fp16"  # a transformer block's pick (block_in_fp8), as the engine cache stores it
_BLOCK_PICKS = ShapePicks(BLOCK_FP8, enabled=True)  # the choices only: block_in_fp8 times them itself


def block_in_fp8(key: str, run: Callable[[bool], torch.Tensor], block: nn.Module,
                 inputs: Sequence[torch.Tensor], fp16: HostFp16 | None = None) -> bool:
    """Whether a transformer block in FP8 mode runs its e4m3 GEMMs at the shapes `key` names; run(e4m3) is the
    block's forward either way, `block` the module whose tensors are its weights, inputs its activations, fp16 its
    fp16 weights where they may sit on the host (lent to the GPU while the fp16 forward is timed or run dry).

    A whole block is the unit: which of its norms write e4m3, which GEMMs read it and whether the GEGLU kernel
    runs inside the GEMM all change together. The first time a key is met in cuDNN's benchmark mode (the engine's
    graph warm-up), both forwards are timed from graph replays with the weights out of L2 (kernel_pick.cuda_time_ms)
    and the faster is kept, e4m3 unless fp16 is faster by more than kernel_pick.PREFER_MARGIN. Before that, under
    capture and off the GPU the answer is e4m3 and nothing is kept; in a dry run recording Triton kernels both run
    once. A timed forward also records this block's amaxes, of the same inputs the call's own forward then sees:
    the scales come out as without the pick."""
    choices = _BLOCK_PICKS.choices
    if key in choices:
        return choices[key] == BLOCK_FP8
    if not inputs[0].is_cuda or torch.cuda.is_current_stream_capturing():
        return True
    lent = fp16.lent() if fp16 is not None else contextlib.nullcontext([])
    if is_recording():
        with lent:
            run(False)
        return True
    if not torch.backends.cudnn.benchmark:
        return True
    timings = {}
    with lent as fp16_weights:
        # What L2 is emptied around: the block's tensors on the GPU (not its fp16 weights on the host).
        weights = [t for t in (*block.parameters(), *block.buffers(), *fp16_weights) if t.device == inputs[0].device]
        for name, e4m3 in ((BLOCK_FP16, False), (BLOCK_FP8, True)):
            try:
                if not torch.isfinite(run(e4m3).sum(dtype=torch.float32)):
                    continue
                timings[name] = cuda_time_ms(lambda e4m3=e4m3: run(e4m3), weights=weights, inputs=inputs)
            except RuntimeError:  # e.g. out of memory under the warm-up's allocator cap: that forward is out
                continue
    if not timings:
        return True
    choices[key] = fastest(timings, prefer=BLOCK_FP8)  # near-ties in e4m3: its fp16 weights can stay on the host
    return choices[key] == BLOCK_FP8


def chosen_blocks() -> dict[str, str]:
    """Each transformer-block shape's pick ("fp8" or "fp16"), for reports and the engine cache."""
    return _BLOCK_PICKS.chosen()


def restore_blocks(choices: dict[str, str]) -> None:
    """Take earlier block picks (from the engine cache); other names are ignored (that shape is timed again)."""
    _BLOCK_PICKS.restore(choices, {BLOCK_FP8, BLOCK_FP16})


def fp8_available(device: torch.device) -> str | None:
    """Why e4m3 GEMMs cannot run on this device (None: they can)."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return "this torch has no float8 GEMM (torch._scaled_mm)"
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if capability is not None and capability < (8, 9):
        return f"FP8 tensor cores need compute capability 8.9 or newer (this GPU: {capability[0]}.{capability[1]})"
    return None


SLOT_FLOATS = 4  # a site's scale 16 bytes from the next: cuBLASLt refuses scale pointers that are not 16-byte aligned


class Fp8Scales(nn.Module):
    """The activation scales and amaxes of a model's FP8 GEMM inputs, one slot a site, in two device buffers (one
    update for all of them per call)."""

    def __init__(self, sites: int, device: torch.device):
        super().__init__()
        shape = (sites, SLOT_FLOATS)  # column 0 is the value; the rest pads each slot to 16 bytes
        self.register_buffer("scales", torch.ones(shape, dtype=torch.float32, device=device), persistent=False)
        self.register_buffer("amaxes", torch.zeros(shape, dtype=torch.float32, device=device), persistent=False)

    @property
    def scale(self) -> torch.Tensor:
        """Every site's scale, (sites,): a view."""
        return self.scales[:, 0]

    @property
    def amax(self) -> torch.Tensor:
        """Every site's amax of this call so far, (sites,): a view."""
        return self.amaxes[:, 0]

    def slot(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, amax) of one site: 1-element views, 16-byte aligned, read and written by the kernels at call
        time."""
        return self.scales[index, :1], self.amaxes[index, :1]

    @torch.no_grad()
    def update_(self) -> None:
        """Each site's next scale from this call's amax (sites that saw no finite, non-zero value keep theirs)."""
        update_scales_(self.scales, self.amaxes)  # one kernel on the GPU (kernels/fp8_scales.py)


class Fp8Weight(nn.Module):
    """A (N, K) weight in e4m3 with its per-tensor scale, requantized in place by refresh (its address, which
    captured CUDA graphs read, stays). lazy: made by the first `make` (a ResNet convolution's, when a shape may run
    it in e4m3), so that one no shape runs in e4m3 holds none: SD1.5's 8x8-level convolutions, which the kernel
    cannot tile, are 240 MB of e4m3."""

    def __init__(self, weight: torch.Tensor, lazy: bool = False):
        super().__init__()
        self.register_buffer("data", torch.empty(0, dtype=E4M3, device=weight.device), persistent=False)
        self.register_buffer("scale", torch.ones(1, dtype=torch.float32, device=weight.device), persistent=False)
        self.made = False
        if not lazy:
            self.make(weight)

    def make(self, weight: torch.Tensor) -> None:
        """Quantize `weight` if this copy was not made yet (its fp16 weight may sit on the host: HostFp16)."""
        if self.made:
            return
        if self.data.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("an e4m3 weight first asked for under CUDA graph capture: the shape's warm-up makes it")
        self.data = torch.empty(weight.shape, dtype=E4M3, device=self.data.device)
        self.made = True
        self.refresh(weight)

    @torch.no_grad()
    def refresh(self, weight: torch.Tensor) -> None:
        """Requantize from `weight` in place; a lazy copy not made yet stays unmade (make takes the weight then)."""
        if not self.made:
            return
        w = weight.detach().to(self.data.device).float()  # the fp16 weight may sit on the host (HostFp16)
        amax = w.abs().amax() if w.numel() else torch.zeros((), device=w.device)
        self.scale.copy_(torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).reshape(1))
        self.data.copy_(quantize_e4m3_reference(w, self.scale))


def offloads(device: torch.device) -> bool:
    """Whether FP8 sites on `device` keep their fp16 weights on the host (a GPU: its memory is what is short)."""
    return device.type == "cuda"


class HostArena:
    """One host buffer, pinned where CUDA is (bringing a weight back is then one DMA), that FP8 sites' fp16 weights
    are copied into (HostFp16.offload): torch's pinned allocator rounds each allocation up to a power of two, which
    took SD1.5's 1294 MB of such weights to 1583."""

    ALIGN = 4096

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.buffer = torch.empty(sum(map(self._span, tensors)), dtype=torch.uint8, device="cpu",
                                  pin_memory=torch.cuda.is_available())
        self.used = 0

    @classmethod
    def _span(cls, t: torch.Tensor) -> int:
        return -(-t.numel() * t.element_size() // cls.ALIGN) * cls.ALIGN

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of `t` in the buffer, same shape and strides (a channels_last weight stays so)."""
        span = self._span(t)
        if self.used + span > self.buffer.numel():
            raise RuntimeError("HostArena is full: it was sized for other tensors")
        nbytes = t.numel() * t.element_size()
        view = self.buffer[self.used:self.used + nbytes].view(t.dtype).as_strided(t.shape, t.stride())
        self.used += span
        return view.copy_(t)


class HostFp16:
    """The fp16 weights of one FP8 site (a transformer block's four GEMMs, one ResNet convolution), which only its
    fp16 path reads (module doc: Memory). `sources`: (module, attribute) of each, a parameter or a buffer.

    `offload` moves them to the host; from then on `get` hands the fp16 forward copies on the device: kept for
    good where the shape's pick is fp16 (keep=True, before that shape's graph is captured, which then reads them),
    or made for one call where nothing is picked yet (the warm-up's first, heuristic run). `lent` puts them on the
    device for a pick's timing or dry run and drops them after, unless a pick kept them meanwhile. Before offload
    (off the GPU, or with the engine's fp8_host_weights off) `get` returns the site's own tensors."""

    def __init__(self, sources: list[tuple[nn.Module, str]], device: torch.device):
        self.sources = sources
        self.device = device
        self.offloaded = False
        self.copies: list[torch.Tensor] | None = None  # on the device: kept, or lent
        self.kept = False

    def _tensors(self) -> list[torch.Tensor]:
        return [getattr(module, name).detach() for module, name in self.sources]

    def offload(self, arena: HostArena) -> None:
        """Rebind each weight to a copy in `arena` (its device memory goes with the last reference). A buffer's
        module that has views of it (FusedAttention's packed Q/K/V) re-makes them (view_packed)."""
        for module, name in self.sources:
            t = getattr(module, name)
            host = arena.take(t.detach())
            if isinstance(t, nn.Parameter):
                t.data = host
            else:
                setattr(module, name, host)
                if hasattr(module, "view_packed"):
                    module.view_packed()
        self.offloaded = True

    @property
    def waiting(self) -> bool:
        """On the host with nothing kept on the device: only then does get's `keep` change anything."""
        return self.offloaded and not self.kept

    def host_bytes(self) -> int:
        return sum(t.nbytes for t in self._tensors()) if self.offloaded else 0

    def _to_device(self) -> list[torch.Tensor]:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("an FP8 site's fp16 weights are on the host under CUDA graph capture: the shape's "
                               "warm-up should have brought them (fp8.HostFp16.get)")
        return [t.to(self.device, non_blocking=True) for t in self._tensors()]

    def get(self, keep: bool) -> list[torch.Tensor]:
        """The weights on the device, for an fp16 forward; keep: this shape's pick is fp16, so they stay there."""
        if self.copies is not None:
            self.kept = self.kept or keep
            return self.copies
        if not self.offloaded:
            return self._tensors()
        copies = self._to_device()
        if keep:
            self.copies, self.kept = copies, True
        return copies

    @contextlib.contextmanager
    def lent(self) -> Iterator[list[torch.Tensor]]:
        """The weights on the device while inside (what a pick times the fp16 forward with)."""
        lend = self.offloaded and self.copies is None
        if lend:
            self.copies = self._to_device()
        try:
            yield self.copies if self.copies is not None else self._tensors()
        finally:
            if lend and not self.kept:
                self.copies = None

    @torch.no_grad()
    def refresh(self) -> None:
        """New weights (refresh_weights): kept copies take them in place (captured graphs read their addresses)."""
        if self.copies is not None:
            for copy, t in zip(self.copies, self._tensors()):
                copy.copy_(t)


def conv_rows(conv: nn.Conv2d) -> torch.Tensor:
    """A convolution's weight as the (Cout, k*k*Cin) matrix of channels_last rows the e4m3 kernel reads."""
    return conv.weight.permute(0, 2, 3, 1).reshape(conv.out_channels, -1)


def conv_refusal(shape: tuple, device: torch.device, conv: nn.Conv2d) -> str | None:
    """Why `conv` cannot run in e4m3 on an input of `shape` on `device` (None: it can): asked before the norm
    that writes the input decides between e4m3 and fp16."""
    k = conv.kernel_size[0]
    if (type(conv) is not nn.Conv2d or conv.kernel_size != (k, k) or conv.stride != (1, 1) or conv.groups != 1
            or conv.dilation != (1, 1) or conv.padding != (k // 2, k // 2) or conv.padding_mode != "zeros"):
        return f"{conv} (square, stride 1, 'same' zero padding, ungrouped)"
    return conv_sm90.fp8_refusal(shape, device, conv.out_channels, k)


def conv_config(shape: tuple, device: torch.device, conv: nn.Conv2d, weight: Fp8Weight,
                dtype: torch.dtype, fp16: HostFp16 | None = None) -> tuple | None:
    """The Gluon kernel's config to run `conv` in e4m3 on an input of `shape`, or None for fp16: asked before the
    norm that writes the input decides between e4m3 and fp16. fp16: the convolution's fp16 weight where it may sit
    on the host (lent to the GPU for the pick's timing)."""
    if conv_refusal(shape, device, conv) is not None:
        return None
    if not weight.made:
        weight.make(conv_rows(conv))  # what the pick times, and the e4m3 path reads
    # The fp16 weight is lent only if the pick times this shape.
    return fp8_path(shape, conv.weight, weight.data, weight.scale, dtype, lend=None if fp16 is None else fp16.lent)


def conv_decided(shape: tuple, device: torch.device, conv: nn.Conv2d, dtype: torch.dtype) -> bool:
    """Whether conv_config's answer for this shape is final (a refusal or a kept pick), so that an fp16 answer
    may bring the fp16 weight back to the GPU for good."""
    return conv_refusal(shape, device, conv) is not None or fp8_decided(shape, conv.weight, dtype)


def fp8_conv2d(x8: torch.Tensor, x_scale: torch.Tensor, weight: Fp8Weight, ksize: int, bias: torch.Tensor | None,
               residual: torch.Tensor | None, out_dtype: torch.dtype, config: tuple) -> torch.Tensor:
    """conv(x8 * x_scale, W * w_scale) + bias + residual in out_dtype, through the Gluon kernel in `config`
    (conv_config's); the bias and residual in its epilogue where it takes them, else in one pass after."""
    if conv_sm90.epilogue_refusal(x8, weight.data, bias, residual, out_dtype) is None:
        return _conv2d_sm90_fp8(x8, x_scale, weight.data, weight.scale, ksize, bias=bias, residual=residual,
                                out_dtype=out_dtype, config=config)
    out = _conv2d_sm90_fp8(x8, x_scale, weight.data, weight.scale, ksize, out_dtype=out_dtype, config=config)
    return add_bias_residual(out, bias, residual)


_conv2d_sm90_fp8 = conv_sm90.conv2d_sm90_fp8  # looked up when called: the CPU tests stand its reference in


def fp8_linear(x8: torch.Tensor, x_scale: torch.Tensor, weight: Fp8Weight,
               out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """(x8 * x_scale) @ (W * w_scale)^T in fp32, rounded to out_dtype: x8 (..., K) e4m3, W (N, K) e4m3 (cuBLASLt
    takes K and N multiples of 16: FusedTransformerBlock.fp8_refusal checks its weights)."""
    return scaled_linear(x8, x_scale, weight.data, weight.scale, out_dtype)


def scaled_linear(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """fp8_linear on the weight's e4m3 data and scale themselves (what a kernel pick times and evicts from L2)."""
    k = x8.shape[-1]
    out = torch._scaled_mm(x8.reshape(-1, k), w8.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=out_dtype)
    return out.view(*x8.shape[:-1], w8.shape[0])
