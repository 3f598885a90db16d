"""Drop-in replacements for diffusers' UNet/VAE building blocks that run sdaccel's fused kernels.

Each replacement keeps the original module's parameters (same tensors, no copies): packed QKV / KV weights are
built once and the original q/k/v weights become views into them, so memory does not grow. Blocks whose config
uses a feature not handled here (scale-shift time norm, up/down-sampling resnets, ada-norm transformer blocks,
custom attention processors) are left as they are.

Activations stay channels_last (NHWC) end to end: a transformer's input (B, C, H, W) in NHWC memory *is* the
(B, H*W, C) token matrix, so entering and leaving the transformer costs no transpose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from ..kernels import bias_add_, group_norm, layer_norm
from ..kernels.fp8 import E4M3, is_float8
from ..kernels.upsample import upsample_nearest2x
from .attention import attention
from .convolution import add_bias_residual, conv2d
from . import fp8 as fp8_mode
from .feed_forward import linear_geglu, linear_geglu_fp8
from .fp8 import SITES_PER_BLOCK, SITES_PER_RESNET, Fp8Scales, Fp8Weight, HostArena, HostFp16, conv_rows, fp8_linear


def _silu(module: nn.Module) -> bool:
    return isinstance(module, nn.SiLU) or getattr(module, "__name__", "") == "silu"


def _merged_base(layer: nn.Module) -> nn.Module:
    """The layer whose weight the packed buffers mirror: under a PEFT LoRA wrapper, its base layer, which holds
    the weights once the adapters are merged (unmerged active adapters are refused: packed weights ignore them)."""
    base = getattr(layer, "base_layer", None)
    if base is None:
        return layer
    if not getattr(layer, "merged", False) and getattr(layer, "active_adapters", None):
        raise UsageError("LoRA adapters must be fused into the weights (pipe.fuse_lora()) before "
                         "refresh_weights(): the fast engine's packed projections do not run unfused adapters")
    return base


def _pack_weights(layers: list[nn.Module], packed: torch.Tensor | None = None) -> torch.Tensor:
    """The layers' weights stacked along rows into `packed` (a new tensor when None; otherwise rewritten in place,
    so the address captured CUDA graphs read stays), and each layer's weight made a view of its rows: one copy."""
    with torch.no_grad():
        stacked = torch.cat([layer.weight for layer in layers], 0)
        packed = stacked if packed is None else packed.copy_(stacked)
    _view_rows(layers, packed)
    return packed


def _view_rows(layers: list[nn.Module], packed: torch.Tensor) -> None:
    """Each layer's weight made a view of its rows of `packed`, in order."""
    start = 0
    for layer in layers:
        rows = layer.weight.shape[0]
        layer.weight.data = packed[start:start + rows]
        start += rows


def scaled_bias(bias: torch.Tensor | None, scale: float) -> torch.Tensor | None:
    """A bias times a rescaled VAE decoder's stream scale (vae_scaling.py); the bias itself when there is none."""
    return bias if bias is None or scale == 1.0 else bias * scale


def _plain_conv(conv: nn.Module) -> bool:
    """A conv whose weight and bias can be applied separately (no adapter wrapped around it)."""
    return type(conv) is nn.Conv2d and conv.padding_mode == "zeros"


def _conv_without_bias(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    # cuDNN adds a conv's bias in a separate broadcast kernel: the fused blocks add it inside a kernel they
    # launch anyway (the next GroupNorm, or the residual add).
    return _conv_bias_add(conv, x, None)


def _conv_bias_add(conv: nn.Conv2d, x: torch.Tensor, bias: torch.Tensor | None,
                   residual: torch.Tensor | None = None, weight: torch.Tensor | None = None) -> torch.Tensor:
    """conv(x) without its own bias, + bias (per channel) + residual: inside the Gluon convolution's epilogue where
    the pick took that kernel for the shape, else one bias_add pass after the convolution (convolution.py).
    weight: instead of conv's own (an FP8 site's copy on the GPU: fp8.HostFp16)."""
    weight = conv.weight if weight is None else weight
    square = (conv.groups == 1 and conv.dilation == (1, 1) and isinstance(conv.padding, tuple)
              and len(set(conv.padding)) == 1 and len(set(conv.stride)) == 1)
    if square:  # cuDNN, or one GEMM or the Gluon kernel where that is faster for the shape (convolution.py)
        return conv2d(x, weight, conv.stride[0], conv.padding[0], bias=bias, residual=residual)
    out = F.conv2d(x, weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
    return add_bias_residual(out, bias, residual)


def repeat_batch(t: torch.Tensor, batch: int) -> torch.Tensor:
    """`t` with its samples repeated up to `batch`, [t; t] for classifier-free guidance's two halves (the order
    of torch.cat([latents, latents])), in t's memory format; `t` itself when it has `batch` samples already.

    A UNet called with the latents once and the context twice (FastEngine's shared CFG prefix) computes at batch
    B until the first cross-attention, where the halves start to differ. The fused blocks widen their activations
    there, and later widen what still arrives at batch B from before that point (conv_in's skip connection, the
    time embedding)."""
    if t.shape[0] == batch:
        return t
    if t.shape[0] == 0 or batch % t.shape[0]:
        raise UsageError(f"cannot repeat a batch of {t.shape[0]} to {batch}: the context's batch must be a multiple "
                         "of the latents'")
    if is_float8(t):  # e4m3 (FP8 mode): copied as bytes, whatever cat supports
        return torch.cat([t.view(torch.uint8)] * (batch // t.shape[0])).view(t.dtype)
    return torch.cat([t] * (batch // t.shape[0]))


class FusedResnetBlock(nn.Module):
    """GN+SiLU -> conv1 -> (+temb) GN+SiLU -> conv2 -> + shortcut, with the norms, SiLUs, biases and adds fused.

    conv1's bias joins the time-embedding add inside the second norm (GroupNorm of h + bias + temb[n] is what
    the block computes); conv2's and the shortcut conv's biases join the residual add, one kernel. When the
    UNet's blocks share a TimeEmbeddingProjections, every block's time projection comes from one GEMM.
    FP8 mode (enable_fp8, engines/fp8.py): each norm writes e4m3 for its convolution, where that convolution can
    run in e4m3 at the call's shape; the convolutions' fp16 weights may wait on the host until a shape needs them.
    """

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block  # keeps the parameters registered under the same names
        self.time_projections: TimeEmbeddingProjections | None = None  # set by fuse_modules
        self.time_slice: tuple[int, int] | None = None  # this block's columns of the shared projections
        convs = [block.conv1, block.conv2] + ([block.conv_shortcut] if block.conv_shortcut is not None else [])
        self.split_biases = all(_plain_conv(c) for c in convs)
        self.stream_scale = 1.0  # activations kept times this (vae_scaling.py): 1 but in a rescaled VAE decoder
        self.conv1_fp8: Fp8Weight | None = None  # enable_fp8: both convolutions' weights in e4m3
        self.conv2_fp8: Fp8Weight | None = None
        self.conv1_fp16: HostFp16 | None = None  # enable_fp8: where their fp16 weights are
        self.conv2_fp16: HostFp16 | None = None
        self.fp8_scales: Fp8Scales | None = None  # a reference to the model's scales (not a submodule)
        self.fp8_site = 0  # this block's first slot in them
        # fold_proj_out_biases: the next transformer's proj_out, whose bias this block's output carries (a reference,
        # not a submodule).
        self.folded_layer: nn.Module | None = None
        if self.split_biases:
            # conv2's bias plus the shortcut conv's: one buffer, rebuilt in place by refresh().
            self.register_buffer("out_bias", self._out_bias(), persistent=False)

    @staticmethod
    def supports(block: nn.Module) -> bool:
        if type(block).__name__ != "ResnetBlock2D":
            return False
        # Without a time embedding, "group" norm (the VAE's) is the same computation as "default".
        time_norm_ok = block.time_embedding_norm == "default" or (
            block.time_emb_proj is None and block.time_embedding_norm == "group")
        return (time_norm_ok
                and block.upsample is None and block.downsample is None and block.output_scale_factor == 1.0
                and isinstance(block.norm1, nn.GroupNorm) and isinstance(block.norm2, nn.GroupNorm)
                and _silu(block.nonlinearity) and not block.skip_time_act)

    def _out_bias(self) -> torch.Tensor:
        b = self.block
        terms = [t for t in (b.conv2.bias, b.conv_shortcut.bias if b.conv_shortcut is not None else None,
                             self.folded_layer.bias if self.folded_layer is not None else None) if t is not None]
        if not terms:
            return torch.zeros_like(b.conv2.weight[:, 0, 0, 0]).detach()
        bias = terms[0].float()
        for term in terms[1:]:
            bias = bias + term.float()  # summed in fp32, rounded once (the biases, not the weights: in FP8 mode
            # those may wait on the host)
        return (bias * self.stream_scale).to(terms[0].dtype).detach()

    def fold_bias_of(self, layer: nn.Module) -> None:
        """Add `layer`'s bias (the next transformer's proj_out) to this block's output: see fold_proj_out_biases."""
        object.__setattr__(self, "folded_layer", layer)
        self._rebuild_out_bias()

    def _rebuild_out_bias(self) -> None:
        """The combined output bias, rebuilt in place (captured CUDA graphs read its address)."""
        if self.split_biases:
            with torch.no_grad():
                self.out_bias.copy_(self._out_bias())

    def can_scale_stream(self) -> bool:
        return self.split_biases and self.block.time_emb_proj is None

    def fp8_refusal(self) -> str | None:
        """Why this block's convolutions cannot run in e4m3 at any shape (None: they may, shape allowing)."""
        if not self.split_biases or self.stream_scale != 1.0:
            return "a block with wrapped convolutions or a rescaled stream"
        for conv in (self.block.conv1, self.block.conv2):
            if conv.kernel_size[0] % 2 == 0 or conv.kernel_size[0] != conv.kernel_size[1]:
                return f"{conv} (an odd square filter)"
        return None

    def fp16_sources(self) -> list[tuple[nn.Module, str]]:
        """The fp16 weights enable_fp8 gives an e4m3 copy: conv1's and conv2's."""
        return [(self.block.conv1, "weight"), (self.block.conv2, "weight")]

    def enable_fp8(self, scales: Fp8Scales, first_site: int, host: HostArena | None = None) -> None:
        """Run conv1 and conv2 in e4m3 where their shapes allow, with activation scales in slots first_site and
        first_site + 1 of `scales` (engines/fp8.py); host: their fp16 weights wait there until a shape runs them
        (fp8.HostFp16). Check fp8_refusal first."""
        b = self.block
        self.conv1_fp8 = Fp8Weight(conv_rows(b.conv1), lazy=True)  # made when a shape may take e4m3
        self.conv2_fp8 = Fp8Weight(conv_rows(b.conv2), lazy=True)
        conv1, conv2 = self.fp16_sources()
        self.conv1_fp16 = HostFp16([conv1], b.conv1.weight.device)
        self.conv2_fp16 = HostFp16([conv2], b.conv2.weight.device)
        if host is not None:
            self.conv1_fp16.offload(host)
            self.conv2_fp16.offload(host)
        object.__setattr__(self, "fp8_scales", scales)
        self.fp8_site = first_site

    def refresh(self) -> None:
        """Rebuild the combined bias and the e4m3 weights (and fp16 copies kept on the GPU) in place: captured CUDA
        graphs read their addresses."""
        self._rebuild_out_bias()
        if self.conv1_fp8 is not None:
            self.conv1_fp8.refresh(conv_rows(self.block.conv1))
            self.conv2_fp8.refresh(conv_rows(self.block.conv2))
            self.conv1_fp16.refresh()
            self.conv2_fp16.refresh()

    def _fp8_slot(self, index: int, shape: tuple, device: torch.device, conv: nn.Conv2d, weight: Fp8Weight | None,
                  fp16: HostFp16 | None, dtype: torch.dtype) -> tuple:
        """(scale, amax, kernel config) of a convolution's e4m3 input when it runs in e4m3 at this shape, else
        (None, None, whether that fp16 answer is final for a weight still waiting on the host, which then comes to
        the GPU for good)."""
        if self.fp8_scales is None:
            return None, None, False
        config = fp8_mode.conv_config(shape, device, conv, weight, dtype, fp16)
        if config is None:  # asked only where the answer can move the weight (not again on every eager call)
            return None, None, fp16 is not None and fp16.waiting and fp8_mode.conv_decided(shape, device, conv, dtype)
        return (*self.fp8_scales.slot(self.fp8_site + index), config)

    def _conv(self, conv: nn.Conv2d, h: torch.Tensor, slot: tuple, weight: Fp8Weight | None, fp16: HostFp16 | None,
              bias: torch.Tensor | None, residual: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """conv(h) + bias + residual: in e4m3 when the norm wrote h so (slot given), else as _conv_bias_add."""
        if slot[0] is None:  # fp16; slot[2]: whether that is this shape's final answer
            w16 = fp16.get(keep=slot[2])[0] if fp16 is not None else None
            return _conv_bias_add(conv, h, bias, residual, weight=w16)
        scale, _, config = slot  # conv_config made the e4m3 weight before answering with a config
        return fp8_mode.fp8_conv2d(h, scale, weight, conv.kernel_size[0], bias, residual, dtype, config)

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None, *args,
                concat: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """``concat``: channels appended to x's (an up block's skip connection), read in place by the first norm,
        which also writes the concatenation the shortcut convolution takes: no separate torch.cat."""
        b, s = self.block, self.stream_scale
        dtype = x.dtype
        shape = (x.shape[0], x.shape[1] + (0 if concat is None else concat.shape[1]), *x.shape[2:])
        fp8_in1 = self._fp8_slot(0, shape, x.device, b.conv1, self.conv1_fp8, self.conv1_fp16, dtype)
        # Scaled activations (s != 1): the norms see x and conv1's output times s (eps times s^2 keeps them
        # exact) and hand the convolutions inputs times s, so that their outputs come out times s.
        if concat is None:
            h = group_norm(x, b.norm1.num_groups, b.norm1.weight, b.norm1.bias, b.norm1.eps * s * s, silu=True,
                           scale=s, out_scale=fp8_in1[0], out_amax=fp8_in1[1])
        else:
            if s != 1.0:
                raise UsageError("a rescaled VAE decoder's ResNet blocks take no concatenated input")
            h, x = group_norm(x, b.norm1.num_groups, b.norm1.weight, b.norm1.bias, b.norm1.eps, silu=True,
                              concat=concat, return_sum=True, out_scale=fp8_in1[0], out_amax=fp8_in1[1])
        has_temb = temb is not None and b.time_emb_proj is not None
        batch = x.shape[0]
        if not self.split_biases:
            h = b.conv1(h)
            add = b.time_emb_proj(F.silu(temb)) if has_temb else None
        else:
            h = self._conv(b.conv1, h, fp8_in1, self.conv1_fp8, self.conv1_fp16, None, None, dtype)
            if has_temb and self.time_projections is not None:
                add = self.time_projections(temb, self, batch)  # conv1's bias already added
            elif has_temb:
                add = b.time_emb_proj(F.silu(temb))
                add = add + b.conv1.bias if b.conv1.bias is not None else add
            else:  # (C,): broadcast over samples and positions by the kernel
                add = scaled_bias(b.conv1.bias, s)
        if add is not None and add.dim() == 2 and add.shape[0] not in (1, batch):
            add = repeat_batch(add, batch)  # a time embedding of the latents once, h of both CFG halves
        fp8_in2 = self._fp8_slot(1, h.shape, h.device, b.conv2, self.conv2_fp8, self.conv2_fp16, dtype)
        h = group_norm(h, b.norm2.num_groups, b.norm2.weight, b.norm2.bias, b.norm2.eps * s * s, silu=True, add=add,
                       scale=s, out_scale=fp8_in2[0], out_amax=fp8_in2[1])
        if not self.split_biases:
            h = b.conv2(h)
            shortcut = b.conv_shortcut(x) if b.conv_shortcut is not None else x
            return shortcut + h
        shortcut = _conv_without_bias(b.conv_shortcut, x) if b.conv_shortcut is not None else x
        # conv2's epilogue adds the biases and the shortcut where it can; else bias_add, which matches the shortcut
        # to h's layout.
        return self._conv(b.conv2, h, fp8_in2, self.conv2_fp8, self.conv2_fp16, self.out_bias, shortcut, dtype)


class TimeEmbeddingProjections(nn.Module):
    """Every fused ResNet block's SiLU(temb) @ W_t + b_t (+ its conv1 bias), as one SiLU and one GEMM per call.

    A UNet hands the same time embedding to each block; the first block to ask computes all blocks'
    projections, the others slice theirs out (_OncePerCall). The blocks' time_emb_proj weights become views of one
    packed weight (no copy kept); the bias column holds b_t + conv1's bias. refresh() rebuilds both in place.
    """

    def __init__(self, blocks: list[FusedResnetBlock]):
        super().__init__()
        self.blocks = blocks  # a plain list: the blocks are registered where they live in the model
        start = 0
        for block in blocks:
            rows = block.block.time_emb_proj.out_features
            block.time_slice = (start, start + rows)  # on the block, so a deepcopy keeps it right
            start += rows
        packed = _pack_weights([self._linear(blk) for blk in blocks])
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("packed_bias", self._bias(), persistent=False)
        self._once = _OncePerCall()
        self._repeated = _OncePerCall()
        # A loop plan's buffer of this step's projections, computed with every step's before the loop (loop_plan.py):
        # while set, forward slices it instead of computing.
        self.pinned: torch.Tensor | None = None

    @staticmethod
    def eligible(block: FusedResnetBlock) -> bool:
        proj = block.block.time_emb_proj
        return block.split_biases and type(proj) is nn.Linear

    @staticmethod
    def _linear(block: FusedResnetBlock) -> nn.Linear:
        return _merged_base(block.block.time_emb_proj)

    def _bias(self) -> torch.Tensor:
        parts = []
        for block in self.blocks:
            proj, conv1 = self._linear(block), block.block.conv1
            bias = proj.bias if proj.bias is not None else torch.zeros_like(proj.weight[:, 0])
            parts.append(bias + conv1.bias if conv1.bias is not None else bias)
        return torch.cat(parts).detach()

    def refresh(self) -> None:
        _pack_weights([self._linear(b) for b in self.blocks], self.packed_weight)
        with torch.no_grad():
            self.packed_bias.copy_(self._bias())

    def forward(self, temb: torch.Tensor, block: FusedResnetBlock, batch: int | None = None) -> torch.Tensor:
        """This block's columns, for `batch` samples: a temb of the latents once (shared CFG prefix) is repeated
        for both halves once per call, not per block (a batch of 1 needs nothing: the GroupNorm broadcasts it)."""
        out = self.pinned if self.pinned is not None else self._once.get(temb, lambda: self.project(temb))
        if batch is not None and out.shape[0] not in (1, batch):
            out = self._repeated.get(temb, lambda: repeat_batch(out, batch))
        lo, hi = block.time_slice
        return out[:, lo:hi]

    def project(self, temb: torch.Tensor) -> torch.Tensor:
        """(..., time embedding width) -> every block's projection (its bias and conv1's included), (..., sum)."""
        return F.linear(F.silu(temb), self.packed_weight, self.packed_bias)

    def clear(self) -> None:
        self._once.clear()
        self._repeated.clear()


class ContextProjections(nn.Module):
    """Every fused cross-attention's K and V projections of the text context, as one GEMM per UNet call.

    All cross-attentions of a UNet read the same context (77 text tokens): SD1.5's sixteen small GEMMs (76 us per
    call at CFG batch 2 on an H100, mostly latency) become one (22 us), computed by the first cross-attention of
    the call (_OncePerCall) and sliced by each. Each attention's packed K/V weight, and its to_k /
    to_v weights within it, become views of one packed weight: no copy kept; their refresh() writes through.
    """

    def __init__(self, attentions: list[FusedAttention]):
        super().__init__()
        packed = _pack_weights([layer for a in attentions for layer in a._projections()])
        start = 0
        for a in attentions:
            rows = a.packed_weight.shape[0]
            a.packed_weight = packed[start:start + rows]  # its K/V rows, still a buffer of the attention
            a.kv_slice = (start, start + rows)
            start += rows
        self.register_buffer("packed_weight", packed, persistent=False)
        self._once = _OncePerCall()
        self.pinned: torch.Tensor | None = None  # a loop plan's K/V of this image's context (as TimeEmbeddingProjections)

    @staticmethod
    def eligible(attentions: list[FusedAttention]) -> bool:
        weights = [a.packed_weight for a in attentions]
        return all(w.shape[1] == weights[0].shape[1] and w.dtype == weights[0].dtype
                   and w.device == weights[0].device for w in weights)

    def forward(self, context: torch.Tensor, attention: FusedAttention) -> torch.Tensor:
        out = self.pinned if self.pinned is not None else self._once.get(context, lambda: self.project(context))
        lo, hi = attention.kv_slice
        return out[..., lo:hi]

    def project(self, context: torch.Tensor) -> torch.Tensor:
        """(B, tokens, context width) -> every cross-attention's K and V, (B, tokens, sum of their widths)."""
        return F.linear(context, self.packed_weight)

    def clear(self) -> None:
        self._once.clear()


class _OncePerCall:
    """One output per UNet call, computed by the first block that asks and sliced by the others. Hooks on the UNet's
    first and last layers clear it when a call begins and ends (fuse_modules): a context changed in place between
    calls (a CUDA graph's static input is) is computed again, and the output's memory goes back with the call."""

    def __init__(self):
        self.key: object = None  # the input it was computed from: the same tensor object within one call
        self.output: torch.Tensor | None = None

    def get(self, key: torch.Tensor, compute) -> torch.Tensor:
        if self.key is not key:
            self.output, self.key = compute(), key
        return self.output

    def clear(self) -> None:
        self.key = self.output = None


class FusedAttention(nn.Module):
    """Self-attention with one packed QKV GEMM, or cross-attention with a packed KV GEMM; SDPA-class kernels."""

    def __init__(self, attn: nn.Module, fp32: bool = False):
        super().__init__()
        self.attn = attn
        self.fp32 = fp32  # the per-op fp32 exception: q, k, v and softmax in fp32, result cast back
        self.heads = attn.heads
        self.is_cross = attn.is_cross_attention
        self.context_projections: ContextProjections | None = None  # set by fuse_modules (cross-attention)
        self.kv_slice: tuple[int, int] | None = None  # this attention's columns of the shared K/V projections
        self.fp8_weight: Fp8Weight | None = None  # enable_fp8: the Q/K/V (self) or Q (cross) projection in e4m3
        q, k, v = attn.to_q, attn.to_k, attn.to_v
        if not all(type(layer) is nn.Linear for layer in (q, k, v)):
            raise UsageError("attention projections are wrapped (LoRA adapters loaded?): fuse them first")
        # A buffer, not a parameter: state_dict() keeps showing the original to_q/to_k/to_v views.
        self.register_buffer("packed_weight", _pack_weights(self._projections()), persistent=False)

    def _projections(self) -> list[nn.Linear]:
        names = ("to_k", "to_v") if self.is_cross else ("to_q", "to_k", "to_v")
        return [_merged_base(getattr(self.attn, name)) for name in names]

    def _fp8_source(self) -> torch.Tensor:
        return self.attn.to_q.weight if self.is_cross else self.packed_weight

    def enable_fp8(self) -> None:
        """Project x in e4m3 from now on when it arrives in e4m3 (forward's x_scale): FP8 mode (engines/fp8.py)."""
        self.fp8_weight = Fp8Weight(self._fp8_source())

    def view_packed(self) -> None:
        """Make the projections' weights views of packed_weight again, after it moved (fp8.HostFp16.offload)."""
        _view_rows(self._projections(), self.packed_weight)

    def refresh(self) -> None:
        """Copy the current q/k/v weights into the packed weight, in place (its address, which captured CUDA
        graphs read, stays), and make them views of it again. For weights changed after fusion (LoRA fuse)."""
        _pack_weights(self._projections(), self.packed_weight)
        if self.fp8_weight is not None:
            self.fp8_weight.refresh(self._fp8_source())

    @staticmethod
    def supports(attn: nn.Module) -> bool:
        proc = type(attn.processor).__name__
        return (type(attn).__name__ == "Attention" and proc in ("AttnProcessor2_0", "AttnProcessor")
                and attn.to_q.bias is None and attn.to_k.bias is None and attn.to_v.bias is None
                and attn.group_norm is None and attn.spatial_norm is None and attn.norm_cross is None
                and not attn.residual_connection and attn.rescale_output_factor == 1.0
                and getattr(attn, "norm_q", None) is None)

    def _project_x(self, x: torch.Tensor, weight: torch.Tensor, x_scale: torch.Tensor | None) -> torch.Tensor:
        """x @ weight^T; x in e4m3 (FP8 mode) takes the e4m3 copy of weight (fp8_weight) and x's scale."""
        if x.dtype == E4M3:
            return fp8_linear(x, x_scale, self.fp8_weight, weight.dtype)
        return F.linear(x, weight)

    def project(self, x: torch.Tensor, context: torch.Tensor | None, x_scale: torch.Tensor | None = None,
                weight: torch.Tensor | None = None):
        """(B, L, C) tokens -> q, k, v as (B, heads, L, head_dim) views of the packed projections. x in e4m3
        (FP8 mode): x_scale is its scale, and the Q (cross) or Q/K/V (self) GEMM runs in e4m3. weight: the Q
        (cross) or packed Q/K/V (self) weight instead of the module's (an FP8 site's copy on the GPU)."""
        batch, length, _ = x.shape
        heads = self.heads
        if self.is_cross:
            weight = self.attn.to_q.weight if weight is None else weight
            q = self._project_x(x, weight, x_scale).view(batch, length, heads, -1).transpose(1, 2)
            if self.context_projections is not None:
                kv = self.context_projections(context, self)  # a column slice of the one K/V GEMM
            else:
                kv = F.linear(context, self.packed_weight)
            kv = kv.view(batch, context.shape[1], 2, heads, -1)
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        else:
            weight = self.packed_weight if weight is None else weight
            qkv = self._project_x(x, weight, x_scale).view(batch, length, 3, heads, -1)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        return q, k, v

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                x_scale: torch.Tensor | None = None, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Attention output before the output projection, as (B, L, heads * head_dim); weight as project's."""
        q, k, v = self.project(x, context, x_scale, weight)
        if self.fp32:
            out = attention(q.float(), k.float(), v.float()).to(q.dtype)
        else:
            out = attention(q, k, v, upcast=self.attn.upcast_attention)
        return out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)


class FusedTransformerBlock(nn.Module):
    """LN -> self-attn -> (+res) LN -> cross-attn -> (+res) LN -> GEGLU FF -> +res.

    The residual adds, output-projection biases and the following LayerNorm run as one SkipLayerNorm kernel; the
    feed-forward's bias and GELU gate as one BiasSplitGelu kernel after its GEMM, or inside it (feed_forward.py,
    per shape); its output GEMM adds onto the residual in place.
    FP8 mode (enable_fp8, engines/fp8.py): the norms and the GEGLU kernel write e4m3 for four e4m3 GEMMs, at the
    shapes where that timed faster than fp16; those GEMMs' fp16 weights may wait on the host until a shape needs them.
    """

    def __init__(self, block: nn.Module, fp32_attention: bool = False):
        super().__init__()
        self.block = block
        self.attn1 = FusedAttention(block.attn1, fp32_attention)
        self.attn2 = FusedAttention(block.attn2, fp32_attention)
        self.ff_in: Fp8Weight | None = None  # enable_fp8: the feed-forward's two weights in e4m3
        self.ff_out: Fp8Weight | None = None
        self.fp16: HostFp16 | None = None  # enable_fp8: where the four GEMMs' fp16 weights are
        self.fp8_scales: Fp8Scales | None = None  # a reference to the model's scales (not a submodule)
        self.fp8_site = 0  # this block's first slot in them

    def fp8_refusal(self) -> str | None:
        """Why this block's GEMMs cannot run in e4m3 (None: they can)."""
        b = self.block
        for name, w in (("Q/K/V", self.attn1.packed_weight), ("cross Q", b.attn2.to_q.weight),
                        ("feed-forward in", b.ff.net[0].proj.weight), ("feed-forward out", b.ff.net[2].weight)):
            if w.shape[0] % 16 or w.shape[1] % 16:
                return f"{name} weight {tuple(w.shape)} (both sides multiples of 16)"
        return None

    def fp16_sources(self) -> list[tuple[nn.Module, str]]:
        """The fp16 weights enable_fp8 gives an e4m3 copy, in _forward's order: packed Q/K/V, cross Q,
        feed-forward in, out."""
        b = self.block
        return [(self.attn1, "packed_weight"), (b.attn2.to_q, "weight"), (b.ff.net[0].proj, "weight"),
                (b.ff.net[2], "weight")]

    def enable_fp8(self, scales: Fp8Scales, first_site: int, host: HostArena | None = None) -> None:
        """Run the Q/K/V, cross Q and feed-forward GEMMs in e4m3, with activation scales in slots first_site ..
        first_site + 3 of `scales` (engines/fp8.py); host: their fp16 weights wait there until a shape runs the
        block in fp16 (fp8.HostFp16). Check fp8_refusal first."""
        b = self.block
        self.attn1.enable_fp8()
        self.attn2.enable_fp8()
        self.ff_in = Fp8Weight(b.ff.net[0].proj.weight)
        self.ff_out = Fp8Weight(b.ff.net[2].weight)
        self.fp16 = HostFp16(self.fp16_sources(), b.ff.net[2].weight.device)
        if host is not None:
            self.fp16.offload(host)
        object.__setattr__(self, "fp8_scales", scales)
        self.fp8_site = first_site

    def refresh(self) -> None:
        """Requantize the feed-forward's e4m3 weights from the current ones (attn1/attn2 refresh their own), and
        the fp16 copies kept on the GPU, in place."""
        if self.ff_in is not None:
            self.ff_in.refresh(self.block.ff.net[0].proj.weight)
            self.ff_out.refresh(self.block.ff.net[2].weight)
            self.attn1.refresh()  # first: the packed Q/K/V the copy is taken from
            self.fp16.refresh()

    @staticmethod
    def supports(block: nn.Module) -> bool:
        ff = getattr(block, "ff", None)
        return (type(block).__name__ == "BasicTransformerBlock" and block.norm_type == "layer_norm"
                and not block.only_cross_attention and not block.double_self_attention
                and block.pos_embed is None and block.attn2 is not None and ff is not None
                and type(ff.net[0]).__name__ == "GEGLU" and getattr(block, "norm4", None) is None
                and FusedAttention.supports(block.attn1) and FusedAttention.supports(block.attn2)
                and all(isinstance(n, nn.LayerNorm) for n in (block.norm1, block.norm2, block.norm3)))

    def _fp8_slots(self, e4m3: bool) -> tuple:
        """(scale, amax) of each e4m3 GEMM input (Q/K/V, cross Q, feed-forward in, out); (None, None) each
        outside FP8 mode or in fp16 (e4m3 False), where the kernels then write the model's dtype."""
        if not e4m3:
            return ((None, None),) * SITES_PER_BLOCK
        return tuple(self.fp8_scales.slot(self.fp8_site + i) for i in range(SITES_PER_BLOCK))

    def _in_fp8(self, h: torch.Tensor, context: torch.Tensor | None) -> bool:
        """In FP8 mode, whether this call's shapes run in e4m3 (fp8_mode.block_in_fp8 picks per shape)."""
        if self.ff_in is None:
            return False
        ctx = None if context is None else list(context.shape)
        key = (f"block x{list(h.shape)} ctx{ctx} ff{list(self.ff_in.data.shape)} "
               f"{str(h.dtype).removeprefix('torch.')}")
        inputs = [h] if context is None else [h, context]
        return fp8_mode.block_in_fp8(key, lambda e4m3: self._forward(h, context, e4m3, keep=False), self, inputs,
                                     self.fp16)

    def forward(self, h: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self._forward(h, context, self._in_fp8(h, context))

    def _forward(self, h: torch.Tensor, context: torch.Tensor, e4m3: bool, keep: bool = True) -> torch.Tensor:
        """The block; e4m3: its four GEMMs in e4m3 (FP8 mode only). h itself is not written. keep: an fp16 run
        is this shape's pick, so that weights waiting on the host come to the GPU for good (a pick's own timing
        runs with them lent)."""
        b = self.block
        qkv, cross_q, ff_in, ff_out = self._fp8_slots(e4m3)
        proj_in, proj_out = b.ff.net[0].proj, b.ff.net[2]
        w_qkv = w_cross_q = None  # the modules' own
        w_in, w_out = proj_in.weight, proj_out.weight
        if self.fp16 is not None and not e4m3:
            w_qkv, w_cross_q, w_in, w_out = self.fp16.get(keep)
        n = layer_norm(h, b.norm1.weight, b.norm1.bias, b.norm1.eps, out_scale=qkv[0], out_amax=qkv[1])
        a = F.linear(self.attn1(n, x_scale=qkv[0], weight=w_qkv), b.attn1.to_out[0].weight)
        n, h = layer_norm(a, b.norm2.weight, b.norm2.bias, b.norm2.eps, skip=h, input_bias=b.attn1.to_out[0].bias,
                          return_sum=True, out_scale=cross_q[0], out_amax=cross_q[1])
        if context is not None and context.shape[0] != h.shape[0]:
            # The latents came once for both CFG halves (repeat_batch): up to here they were the same, the
            # cross-attention with the two contexts is where they part.
            n, h = repeat_batch(n, context.shape[0]), repeat_batch(h, context.shape[0])
        a = F.linear(self.attn2(n, context, x_scale=cross_q[0], weight=w_cross_q), b.attn2.to_out[0].weight)
        # The residual stream h comes back with the feed-forward's output bias already in it, so the last GEMM
        # accumulates onto h in place (cuBLAS's beta = 1): no separate bias + residual kernel.
        n, h = layer_norm(a, b.norm3.weight, b.norm3.bias, b.norm3.eps, skip=h, input_bias=b.attn2.to_out[0].bias,
                          return_sum=True, sum_bias=proj_out.bias, out_scale=ff_in[0], out_amax=ff_in[1])
        if not e4m3:
            f = linear_geglu(n, w_in, proj_in.bias)  # cuBLAS + GEGLU kernel, or one fused kernel
            h.view(-1, h.shape[-1]).addmm_(f.view(-1, f.shape[-1]), w_out.t())
            return h
        # FP8: GEGLU's output comes in e4m3 for the second GEMM, whose fp16 result is added onto h (cuBLASLt's
        # e4m3 GEMM does not accumulate onto it).
        f = linear_geglu_fp8(n, ff_in[0], self.ff_in, proj_in.bias, ff_out[0], ff_out[1], h.dtype)
        return h.add_(fp8_linear(f, ff_out[0], self.ff_out, h.dtype))


class FusedTransformer2D(nn.Module):
    """GroupNorm -> proj_in -> blocks -> proj_out -> + residual on NHWC activations, no layout transposes."""

    def __init__(self, model: nn.Module, fp32_attention: bool = False):
        super().__init__()
        self.model = model
        self.blocks = nn.ModuleList(FusedTransformerBlock(b, fp32_attention) for b in model.transformer_blocks)
        # take_folded_bias: -proj_out's bias, which the input then carries (None: it does not).
        self.register_buffer("neg_out_bias", None, persistent=False)

    def take_folded_bias(self) -> None:
        """The input arrives with proj_out's bias added (fold_proj_out_biases): the norm takes it off again (its
        per-channel add), and proj_out's GEMM accumulates onto the input in place, whose bias is then the output's."""
        self.register_buffer("neg_out_bias", -self.model.proj_out.bias.detach().clone(), persistent=False)

    def refresh(self) -> None:
        """Rebuild -proj_out's bias in place (captured CUDA graphs read its address)."""
        if self.neg_out_bias is not None:
            with torch.no_grad():
                self.neg_out_bias.copy_(-self.model.proj_out.bias)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        return (type(model).__name__ == "Transformer2DModel" and getattr(model, "is_input_continuous", False)
                and isinstance(model.norm, nn.GroupNorm)
                and all(FusedTransformerBlock.supports(b) for b in model.transformer_blocks))

    @staticmethod
    def _linear_weight(layer: nn.Module) -> torch.Tensor:
        w = layer.weight
        return w.view(w.shape[0], w.shape[1]) if w.dim() == 4 else w  # a 1x1 conv is a linear layer on tokens

    def forward(self, x: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None, *args,
                return_dict: bool = True, **kwargs):
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        m = self.model
        batch, channels, height, width = x.shape
        x = x.contiguous(memory_format=torch.channels_last)
        h = group_norm(x, m.norm.num_groups, m.norm.weight, m.norm.bias, m.norm.eps, add=self.neg_out_bias)
        tokens = h.permute(0, 2, 3, 1).reshape(batch, height * width, channels)  # free: NHWC memory
        tokens = F.linear(tokens, self._linear_weight(m.proj_in), m.proj_in.bias)
        for block in self.blocks:
            tokens = block(tokens, encoder_hidden_states)
        residual = x.permute(0, 2, 3, 1).reshape(batch, height * width, channels)
        residual = repeat_batch(residual, tokens.shape[0])  # the blocks widened the latents to both CFG halves
        if self.neg_out_bias is not None:  # residual + proj_out's bias, written by the ResNet block before
            out = residual.reshape(-1, channels).addmm_(tokens.reshape(-1, tokens.shape[-1]),
                                                        self._linear_weight(m.proj_out).t())
        else:
            out = bias_add_(F.linear(tokens, self._linear_weight(m.proj_out)), m.proj_out.bias, residual)
        out = out.view(-1, height, width, channels).permute(0, 3, 1, 2)  # NCHW view of NHWC memory
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)


def fuse_modules(root: nn.Module, fp32_attention: bool = False, fp8: bool = False,
                 fp8_convs: bool = True, fp8_host_weights: bool = False) -> dict[str, int]:
    """Swap every supported block under `root` for its fused version, in place. Returns counts per kind.

    fp32_attention: run attention (q, k, v, softmax) in fp32 inside fp16/bf16 models, the seeds'
    `--force_fp32_ops unet:MultiHeadAttention`; the fused SDPA kernels already keep the softmax in fp32.
    fp8: the transformer blocks' Q/K/V, cross Q and feed-forward GEMMs and, unless fp8_convs is False, the ResNet
    blocks' convolutions in e4m3 (engines/fp8.py), with the scales' update hooked after `root`'s last layer
    (conv_out); fp8_host_weights: their fp16 weights wait in host memory until a shape runs them in fp16 (on a
    GPU: fp8.HostFp16)."""
    counts = _fuse_children(root, fp32_attention)
    counts["folded_out_biases"] = fold_proj_out_biases(root) if FOLD_PROJ_OUT_BIAS else 0
    # One packed time-embedding projection for all of the model's fused ResNet blocks (they share temb).
    blocks = [m for m in root.modules() if isinstance(m, FusedResnetBlock) and m.block.time_emb_proj is not None]
    counts["time_projections"] = 0
    if blocks and all(TimeEmbeddingProjections.eligible(b) for b in blocks):
        shared = TimeEmbeddingProjections(blocks)
        root.sdaccel_time_projections = shared  # registered once, so .to() and buffers() see it
        for block in blocks:
            object.__setattr__(block, "time_projections", shared)  # a reference, not another submodule
        counts["time_projections"] = len(blocks)
    # One K/V GEMM of the text context for all of its cross-attentions (they share the context). Shared outputs
    # are forgotten when a call begins (conv_in runs first) and ends (conv_out runs last): hooks on the root itself
    # would not fire, as the UNet stage calls its forward directly. Without those layers the context, which may
    # be the same tensor with new values at the next call, is not shared.
    first, last = getattr(root, "conv_in", None), getattr(root, "conv_out", None)
    bounded = isinstance(first, nn.Module) and isinstance(last, nn.Module)
    cross = [m for m in root.modules() if isinstance(m, FusedAttention) and m.is_cross]
    counts["context_projections"] = 0
    if bounded and cross and ContextProjections.eligible(cross):
        shared = ContextProjections(cross)
        root.sdaccel_context_projections = shared
        for attention in cross:
            object.__setattr__(attention, "context_projections", shared)
        counts["context_projections"] = len(cross)
    per_call = [m for m in (getattr(root, "sdaccel_time_projections", None),
                            getattr(root, "sdaccel_context_projections", None)) if m is not None]
    if bounded and per_call:
        for module in (first, last):
            # References, not submodules; module-level hook functions, so a deepcopy of the model keeps working.
            object.__setattr__(module, "sdaccel_per_call", per_call)
        first.register_forward_pre_hook(_clear_per_call)
        last.register_forward_hook(_clear_per_call)
    if fp8:
        counts["fp8_blocks"], counts["fp8_resnets"], on_host = _enable_fp8(root, last, fp8_convs, fp8_host_weights)
        counts["fp8_host_weights_MB"] = on_host >> 20
    return counts


# diffusers' blocks whose forward runs resnets[i] and then attentions[i] on its output, which nothing else reads (the
# mid block too: resnets[0], then attentions[i] and resnets[i + 1] in turn).
RESNET_THEN_TRANSFORMER = ("CrossAttnDownBlock2D", "CrossAttnUpBlock2D", "UNetMidBlock2DCrossAttn")
# On since the twenty-ninth session (H200, one UNet call alternated in one process, bench_unet.py fast vs fast-nofold):
# SD1.5 at CFG batch 2 5.17-5.21 -> 5.13-5.17 ms, at 16 29.84-29.95 -> 29.68-29.78, SDXL at 2 29.05-29.07 ->
# 29.02-29.04, FP8 at 2 4.90-4.91 -> 4.83-4.85; the same error against fp32 (1.34e-3 -> 1.35e-3) and memory.
FOLD_PROJ_OUT_BIAS = True


def fold_proj_out_biases(root: nn.Module) -> int:
    """Where a fused ResNet block's output goes only to a fused transformer, the transformer's proj_out bias joins the
    block's output bias (its convolution's epilogue adds it for free); the transformer's norm subtracts it again with
    its per-channel add, and proj_out's GEMM accumulates onto that input in place (cuBLAS's beta = 1): the separate
    bias + residual pass after proj_out goes (16 a SD1.5 UNet call). Returns how many pairs were folded."""
    folded = 0
    for block in root.modules():
        if type(block).__name__ not in RESNET_THEN_TRANSFORMER:
            continue
        for resnet, transformer in zip(block.resnets, block.attentions):
            if (isinstance(resnet, FusedResnetBlock) and resnet.split_biases and resnet.stream_scale == 1.0
                    and resnet.folded_layer is None and isinstance(transformer, FusedTransformer2D)
                    and transformer.neg_out_bias is None and transformer.model.proj_out.bias is not None
                    and resnet.block.conv2.out_channels == transformer.model.proj_out.bias.numel()):
                resnet.fold_bias_of(transformer.model.proj_out)
                transformer.take_folded_bias()
                folded += 1
    return folded


def _clear_per_call(module: nn.Module, *args) -> None:
    for shared in module.sdaccel_per_call:
        shared.clear()


def _enable_fp8(root: nn.Module, last: nn.Module | None, convs: bool, host_weights: bool) -> tuple[int, int, int]:
    """FP8 mode for every transformer block under root that takes it and is at least fp8_mode.MIN_WIDTH wide, and
    (convs) every fused ResNet block that may take it; the scales' update after `last`. Block by block, so that at
    most one block's e4m3 copy is on the GPU beside all fp16 weights (host_weights). Returns the two counts and
    the bytes of fp16 weights moved to the host."""
    blocks = [m for m in root.modules() if isinstance(m, FusedTransformerBlock) and m.fp8_refusal() is None
              and m.attn1.packed_weight.shape[1] >= fp8_mode.MIN_WIDTH]
    resnets = [m for m in root.modules() if convs and isinstance(m, FusedResnetBlock) and m.fp8_refusal() is None]
    if not (blocks or resnets) or not isinstance(last, nn.Module):
        return 0, 0, 0
    device = next(root.parameters()).device
    scales = Fp8Scales(SITES_PER_BLOCK * len(blocks) + SITES_PER_RESNET * len(resnets), device)
    root.sdaccel_fp8_scales = scales  # registered once, so .to() and buffers() see it
    host, on_host = None, 0
    if host_weights and fp8_mode.offloads(device):
        fp16 = [getattr(m, name) for b in (*blocks, *resnets) for m, name in b.fp16_sources()]
        host, on_host = HostArena(fp16), sum(t.nbytes for t in fp16)
        del fp16  # each weight's device memory goes as enable_fp8 moves it to the host, block by block
    for i, block in enumerate(blocks):
        block.enable_fp8(scales, SITES_PER_BLOCK * i, host)
    for i, block in enumerate(resnets):
        block.enable_fp8(scales, SITES_PER_BLOCK * len(blocks) + SITES_PER_RESNET * i, host)
    object.__setattr__(last, "sdaccel_fp8_scales", scales)
    last.register_forward_hook(_update_fp8_scales)
    return len(blocks), len(resnets), on_host


def _update_fp8_scales(module: nn.Module, *args) -> None:
    module.sdaccel_fp8_scales.update_()


def _fuse_children(root: nn.Module, fp32_attention: bool) -> dict[str, int]:
    counts = {"resnet": 0, "transformer": 0, "transformer_block": 0, "upsample": 0, "spatial_attention": 0,
              "group_norm_silu": 0, "up_block": 0}
    for name, child in list(root.named_children()):
        if FusedResnetBlock.supports(child):
            setattr(root, name, FusedResnetBlock(child))
            counts["resnet"] += 1
        elif FusedUpsample2D.supports(child):
            setattr(root, name, FusedUpsample2D(child))
            counts["upsample"] += 1
        elif FusedSpatialAttention.supports(child):
            setattr(root, name, FusedSpatialAttention(child))
            counts["spatial_attention"] += 1
        elif FusedTransformer2D.supports(child):
            fused = FusedTransformer2D(child, fp32_attention)
            setattr(root, name, fused)
            counts["transformer"] += 1
            counts["transformer_block"] += len(fused.blocks)
        else:
            for key, value in _fuse_children(child, fp32_attention).items():
                counts[key] += value
            for up_block in (FusedUpBlock, FusedCrossAttnUpBlock):
                if up_block.supports(child):  # after its own ResNet blocks were fused
                    setattr(root, name, up_block(child))
                    counts["up_block"] += 1
    # The final norm + SiLU of a UNet or VAE decoder.
    norm_out, act = getattr(root, "conv_norm_out", None), getattr(root, "conv_act", None)
    if isinstance(norm_out, nn.GroupNorm) and act is not None and _silu(act):
        root.conv_norm_out = GroupNormSiLU(norm_out)
        root.conv_act = nn.Identity()
        counts["group_norm_silu"] += 1
    return counts


class FusedUpBlock(nn.Module):
    """A UNet up block (diffusers' UpBlock2D; FusedCrossAttnUpBlock below for CrossAttnUpBlock2D) whose fused
    ResNet blocks read the skip connection in place (FusedResnetBlock's ``concat``) instead of after a torch.cat:
    one launch and one pass over the concatenation less per block. The UNet's loop reads ``resnets`` and
    ``has_cross_attention`` from it, so both pass through. FreeU (which the UNet's enable_freeu sets on this
    wrapper) and gradient checkpointing go to diffusers' own forward."""

    FREEU = ("s1", "s2", "b1", "b2")
    KIND = "UpBlock2D"

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    @classmethod
    def supports(cls, block: nn.Module) -> bool:
        return type(block).__name__ == cls.KIND and all(isinstance(r, FusedResnetBlock) for r in block.resnets)

    @property
    def resnets(self) -> nn.ModuleList:
        return self.block.resnets

    @property
    def has_cross_attention(self) -> bool:
        return bool(getattr(self.block, "has_cross_attention", False))

    def _needs_diffusers(self, extra_args: bool) -> bool:
        """FreeU on, checkpointing or arguments this forward does not handle: diffusers' forward runs, with FreeU's
        factors as last set (on this wrapper by the UNet's enable/disable_freeu, or on the block itself)."""
        b = self.block
        freeu = {k: self.__dict__[k] if k in self.__dict__ else getattr(b, k, None) for k in self.FREEU}
        if all(freeu.values()) or extra_args or (torch.is_grad_enabled() and b.gradient_checkpointing):
            for k, value in freeu.items():
                setattr(b, k, value)
            return True
        return False

    def _run(self, h: torch.Tensor, skips: tuple[torch.Tensor, ...], temb, upsample_size, attention_kwargs=None):
        b = self.block
        attentions = b.attentions if attention_kwargs is not None else [None] * len(b.resnets)
        for resnet, attn in zip(b.resnets, attentions):
            h = resnet(h, temb, concat=skips[-1])
            skips = skips[:-1]
            if attn is not None:
                h = attn(h, return_dict=False, **attention_kwargs)[0]
        for upsampler in b.upsamplers or ():
            h = upsampler(h, upsample_size)
        return h

    @staticmethod
    def _skips(hidden_states: torch.Tensor, skips: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        # A skip connection from before the shared CFG prefix ended (conv_in's output) holds the latents once.
        return tuple(repeat_batch(skip, hidden_states.shape[0]) for skip in skips)

    def forward(self, hidden_states: torch.Tensor, res_hidden_states_tuple: tuple[torch.Tensor, ...],
                temb: torch.Tensor | None = None, upsample_size=None, *args, **kwargs) -> torch.Tensor:
        res_hidden_states_tuple = self._skips(hidden_states, res_hidden_states_tuple)
        if self._needs_diffusers(bool(args or kwargs)):
            return self.block(hidden_states, res_hidden_states_tuple, temb, upsample_size, *args, **kwargs)
        return self._run(hidden_states, res_hidden_states_tuple, temb, upsample_size)


class FusedCrossAttnUpBlock(FusedUpBlock):
    """FusedUpBlock for diffusers' CrossAttnUpBlock2D: the same, with its transformers between the ResNet blocks."""

    KIND = "CrossAttnUpBlock2D"

    def forward(self, hidden_states: torch.Tensor, res_hidden_states_tuple: tuple[torch.Tensor, ...],
                temb: torch.Tensor | None = None, encoder_hidden_states: torch.Tensor | None = None,
                cross_attention_kwargs=None, upsample_size=None, attention_mask=None,
                encoder_attention_mask=None) -> torch.Tensor:
        res_hidden_states_tuple = self._skips(hidden_states, res_hidden_states_tuple)
        if self._needs_diffusers(False):
            return self.block(hidden_states, res_hidden_states_tuple, temb, encoder_hidden_states,
                              cross_attention_kwargs, upsample_size, attention_mask, encoder_attention_mask)
        attention_kwargs = dict(encoder_hidden_states=encoder_hidden_states,
                                cross_attention_kwargs=cross_attention_kwargs, attention_mask=attention_mask,
                                encoder_attention_mask=encoder_attention_mask)
        return self._run(hidden_states, res_hidden_states_tuple, temb, upsample_size, attention_kwargs)


class FusedUpsample2D(nn.Module):
    """diffusers' Upsample2D (nearest 2x, then a conv) with sdaccel's channels_last upsampling kernel."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.stream_scale = 1.0  # its input is scaled by this (vae_scaling.py): the conv's bias is too

    @staticmethod
    def supports(module: nn.Module) -> bool:
        return (type(module).__name__ == "Upsample2D" and module.interpolate and not module.use_conv_transpose
                and module.norm is None and (not module.use_conv or module.name == "conv"))

    def can_scale_stream(self) -> bool:
        return not self.module.use_conv or type(self.module.conv) is nn.Conv2d

    def forward(self, x: torch.Tensor, output_size=None, *args, **kwargs) -> torch.Tensor:
        m, s = self.module, self.stream_scale
        if output_size is not None and tuple(output_size) != (2 * x.shape[-2], 2 * x.shape[-1]):
            if s != 1.0:
                raise UsageError("a rescaled VAE decoder upsamples by 2 only")
            return m(x, output_size)  # an odd size the UNet asks for: diffusers' own path
        h = upsample_nearest2x(x)
        if not m.use_conv:
            return h
        c = m.conv
        if s == 1.0 and _plain_conv(c):
            # Through the convolution pick, as the ResNet blocks' (convolution.py), the bias in the Gluon kernel's
            # epilogue where the pick took it.
            return _conv_bias_add(c, h, c.bias)
        if s == 1.0:
            return c(h)
        return F.conv2d(h, c.weight, scaled_bias(c.bias, s), c.stride, c.padding, c.dilation, c.groups)


class GroupNormSiLU(nn.Module):
    def __init__(self, norm: nn.GroupNorm):
        super().__init__()
        self.norm = norm
        self.stream_scale = 1.0  # its input is scaled by this (vae_scaling.py); its output is not

    def forward(self, x):
        n, s = self.norm, self.stream_scale
        return group_norm(x, n.num_groups, n.weight, n.bias, n.eps * s * s, silu=True)


class FusedSpatialAttention(nn.Module):
    """A VAE mid-block's self-attention (GroupNorm, heads over all positions, biased projections, + residual) on
    NHWC activations: no layout transposes, sdaccel's GroupNorm, bias and residual in one kernel. With
    ``stream_scale`` s != 1 (vae_scaling.py) its input is the stream times s: V is computed times s, so the output
    and the residual share the scale."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.attn = attn
        self.stream_scale = 1.0

    @staticmethod
    def supports(attn: nn.Module) -> bool:
        if type(attn).__name__ != "Attention":
            return False
        proc = type(getattr(attn, "processor", None)).__name__
        layers = (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])
        return (proc in ("AttnProcessor2_0", "AttnProcessor")
                and isinstance(attn.group_norm, nn.GroupNorm) and attn.spatial_norm is None
                and attn.residual_connection and attn.rescale_output_factor == 1.0 and not attn.is_cross_attention
                and attn.norm_cross is None and getattr(attn, "norm_q", None) is None and attn.scale_qk
                and all(type(layer) is nn.Linear for layer in layers))

    def can_scale_stream(self) -> bool:
        return True

    def forward(self, x: torch.Tensor, encoder_hidden_states=None, attention_mask=None, **kwargs) -> torch.Tensor:
        a, s = self.attn, self.stream_scale
        if encoder_hidden_states is not None or attention_mask is not None or x.dim() != 4:
            if s != 1.0:
                raise UsageError("a rescaled VAE decoder's attention takes no context or mask")
            return a(x, encoder_hidden_states, attention_mask, **kwargs)
        batch, channels, height, width = x.shape
        x = x.contiguous(memory_format=torch.channels_last)
        g = a.group_norm
        n = group_norm(x, g.num_groups, g.weight, g.bias, g.eps * s * s)
        tokens = n.permute(0, 2, 3, 1).reshape(batch, height * width, channels)  # free: NHWC memory
        q, k = a.to_q(tokens), a.to_k(tokens)
        if s == 1.0:
            v = a.to_v(tokens)
        else:  # s * (t W^T + b) in the GEMM (cuBLAS's alpha)
            v_bias = scaled_bias(a.to_v.bias, s)
            v = torch.addmm(v_bias if v_bias is not None else tokens.new_zeros(()),
                            tokens.reshape(-1, channels), a.to_v.weight.t(), alpha=s)
            v = v.view(batch, -1, a.to_v.out_features)
        heads = a.heads
        q, k, v = (t.view(batch, -1, heads, t.shape[-1] // heads).transpose(1, 2) for t in (q, k, v))
        # Through the per-shape pick: at one head of 512 it offers cuBLAS GEMMs and a softmax beside SDPA's
        # memory-efficient kernel.
        out = attention(q, k, v).transpose(1, 2).reshape(batch, height * width, -1)
        proj = a.to_out[0]
        out = F.linear(out, proj.weight)
        residual = x.permute(0, 2, 3, 1).reshape(batch, height * width, channels)
        out = add_bias_residual(out, scaled_bias(proj.bias, s), residual)
        return out.view(batch, height, width, channels).permute(0, 3, 1, 2)  # NCHW view of NHWC memory


# What a UNet call may pass the latents through at batch B beside a context of 2B (the shared CFG prefix): the fused
# blocks, which widen what they hand on (repeat_batch), and modules that never meet the context or the time
# embedding's per-sample values (containers whose forward only passes tensors on, plain layers, the time embedding).
# A fused up block widens its skip connections, then runs its own blocks, which are checked like the rest. The FP8
# mode's scales are buffers with no forward: the two halves' identical prefix records the same amaxes at B samples
# as at 2B (until the twenty-first session they refused the prefix, and FP8 mode lost what it saves).
_PREFIX_SAFE_FUSED = (FusedResnetBlock, FusedTransformer2D, FusedUpsample2D, GroupNormSiLU,
                      TimeEmbeddingProjections, ContextProjections, Fp8Scales)
_PREFIX_SAFE_PLAIN = {"ModuleList", "Conv2d", "Linear", "SiLU", "Identity", "Timesteps", "TimestepEmbedding",
                      "Downsample2D", "DownBlock2D", "CrossAttnDownBlock2D", "UNetMidBlock2DCrossAttn"}


# How cfg_prefix_refusal's answer begins for a UNet whose halves differ from the start (SDXL's time embedding takes
# the pooled text): nothing to share, so nothing lost.
PREFIX_NEVER_SHARED = "its time embedding takes"


def cfg_prefix_refusal(unet: nn.Module) -> str | None:
    """Why a fused UNet cannot take classifier-free guidance's latents once, B samples beside the 2B context
    (uncond first), and compute what both halves share once (None: it can).

    Both halves of a CFG call get the same latents and timestep; they differ only through the text, which enters at
    the first cross-attention. Up to there (SD1.x/2.x: conv_in, the first ResNet block, the first transformer's
    norm, input projection and self-attention at 4096 tokens) one half's computation is the other's. That holds
    only while the time embedding is the same for both (no class or added text embedding, as SDXL's pooled text)
    and while every module that meets the context or a skip connection is a fused one that widens the batch where
    it has to; diffusers' own attention would silently fold the 2B context into B samples."""
    config = getattr(unet, "config", None)
    if type(unet).__name__ != "UNet2DConditionModel" or config is None:
        return f"{type(unet).__name__} is not a diffusers UNet2DConditionModel"
    for key in ("class_embed_type", "addition_embed_type"):
        if getattr(config, key, None) is not None:
            return f"{PREFIX_NEVER_SHARED} {key}={getattr(config, key)!r}, which differs between the halves"

    def first_unsafe(module: nn.Module, prefix: str) -> str | None:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(child, _PREFIX_SAFE_FUSED):
                continue
            if isinstance(child, FusedUpBlock):
                found = first_unsafe(child.block, f"{path}.block")
            elif type(child).__name__ in _PREFIX_SAFE_PLAIN:
                found = first_unsafe(child, path)
            else:
                return f"{path} ({type(child).__name__}) is not a fused block"
            if found:
                return found
        return None

    return first_unsafe(unet, "")
