"""The fast engine's opt-in FP8 mode (`FastEngine(fp8=True)`): the transformer blocks' GEMMs and the ResNet
blocks' convolutions in e4m3. This file holds its pieces (scales, e4m3 weights, fp16 weights waiting on the host, the
e4m3 GEMM and convolution calls); fp8_blocks.py the blocks that use them and the per-shape choice.

Which GEMMs: in every fused transformer block at least MIN_WIDTH channels wide, the four whose input an sdaccel
kernel writes, so that the cast to e4m3 costs nothing (that kernel writes one byte a value instead of two):
    LayerNorm 1          -> packed Q/K/V projection
    SkipLayerNorm 2      -> cross-attention's Q projection
    SkipLayerNorm 3      -> feed-forward's first GEMM, its bias and GEGLU, which write e4m3
    GEGLU                -> feed-forward's second GEMM (then added onto the residual stream)
The attention output projections, proj_in / proj_out, the text K/V and time projections stay fp16.
The GEMMs run in cuBLASLt through torch._scaled_mm (fp32 accumulation, fp16 output), except the feed-forward's
first where the pick takes the Gluon e4m3 GEMM + GEGLU kernel for its shape (feed_forward.linear_geglu_fp8).
Whether a block runs so is decided per input shape (fp8_blocks.Fp8TransformerBlock), so that the mode is never slower
where a block's GEMMs are too small to gain: on an H200 every SD1.5 and SDXL block shape at least 640 wide picks
e4m3, but for near-ties that flip between runs (SD1.5's 640-wide and 64-token blocks at CFG batch 2 picked fp16 in one
of four runs).

And, unless the engine's fp8_convs is False, in every fused ResNet block, on sm_90, both 3x3 convolutions, whose
inputs GroupNorm + SiLU writes:
    GroupNorm 1 + SiLU   -> conv1
    GroupNorm 2 + SiLU   -> conv2 (its bias and the shortcut added in the kernel's epilogue)
through the Gluon implicit-GEMM convolution with e4m3 operands (kernels/conv_sm90.py). Whether a convolution
takes it is decided per input shape (fp8_blocks.conv_config): where the kernel cannot tile it (the 8x8 level) or
where the fp16 path timed faster (convolution.fp8_path: small ones, at CFG batch 2), it stays fp16. The shortcut's 1x1
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
from fp32 than fp16 does (about 40x fp16's error on random weights), outside the numerics rule the default engine
meets. Whether images of a trained model hold up is for `sdaccel compare` on that model to say.

Memory: a site's fp16 weights, which only its fp16 path reads, move to pinned host memory once its e4m3 copy is
made (HostFp16; the engine's fp8_host_weights). A shape whose pick keeps the site in fp16 (SD1.5's 8x8-level
convolutions, which the kernel cannot tile) brings them back to the GPU for good; a pick's timing borrows them.
And a convolution's e4m3 copy is made only when a shape may run it in e4m3 (Fp8Weight's lazy). So where e4m3 runs
the GPU holds one byte a weight, not three: with both copies on the GPU the mode's first image took more memory than
eager's (SD1.5 at batch 1 on an H200: 3117 MB against eager's 2549; with these, 2484. SDXL: 10137 MB, with these
6345, against 10527).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn

from ...kernels import conv_sm90
from ...kernels.fp8 import E4M3, E4M3_MAX, quantize_e4m3_reference
from ...kernels.fp8_scales import update_scales_
from .convolution import add_bias_residual

SITES_PER_BLOCK = 4  # qkv, cross_q, ff_in, ff_out (Fp8TransformerBlock's order)
SITES_PER_RESNET = 2  # conv1, conv2 (Fp8ResnetBlock's)


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


def fp8_conv2d(x8: torch.Tensor, x_scale: torch.Tensor, weight: Fp8Weight, ksize: int, bias: torch.Tensor | None,
               residual: torch.Tensor | None, out_dtype: torch.dtype, config: tuple) -> torch.Tensor:
    """conv(x8 * x_scale, W * w_scale) + bias + residual in out_dtype, through the Gluon kernel in `config`
    (fp8_blocks.conv_config's); the bias and residual in its epilogue where it takes them, else in one pass after."""
    if conv_sm90.epilogue_refusal(x8, weight.data, bias, residual, out_dtype) is None:
        return _conv2d_sm90_fp8(x8, x_scale, weight.data, weight.scale, ksize, bias=bias, residual=residual,
                                out_dtype=out_dtype, config=config)
    out = _conv2d_sm90_fp8(x8, x_scale, weight.data, weight.scale, ksize, out_dtype=out_dtype, config=config)
    return add_bias_residual(out, bias, residual)


_conv2d_sm90_fp8 = conv_sm90.conv2d_sm90_fp8  # looked up when called: the CPU tests stand its reference in


def fp8_linear(x8: torch.Tensor, x_scale: torch.Tensor, weight: Fp8Weight,
               out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """(x8 * x_scale) @ (W * w_scale)^T in fp32, rounded to out_dtype: x8 (..., K) e4m3, W (N, K) e4m3 (cuBLASLt
    takes K and N multiples of 16: fp8_blocks.transformer_refusal checks the weights)."""
    return scaled_linear(x8, x_scale, weight.data, weight.scale, out_dtype)


def scaled_linear(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """fp8_linear on the weight's e4m3 data and scale themselves (what a kernel pick times and evicts from L2)."""
    k = x8.shape[-1]
    out = torch._scaled_mm(x8.reshape(-1, k), w8.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=out_dtype)
    return out.view(*x8.shape[:-1], w8.shape[0])
