"""Fused blocks that appear in the VAE decoder (and the UNet's upsamplers and final norm): nearest-2x upsampling
with its convolution, the final GroupNorm + SiLU, and the mid block's spatial self-attention, all on NHWC
activations. Each keeps a `stream_scale` for a decoder whose activations are kept scaled down (vae_scaling.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import UsageError
from ...kernels.group_norm import group_norm
from ...kernels.upsample import upsample_nearest2x
from .common import scaled_bias
from .convolution import add_bias_residual
from .picks import KernelPicks
from .resnet import plain_conv


class FusedUpsample2D(nn.Module):
    """diffusers' Upsample2D (nearest 2x, then a conv) with sdaccel's channels_last upsampling kernel."""

    def __init__(self, module: nn.Module, picks: KernelPicks):
        super().__init__()
        self.module = module
        self.picks = picks
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
        if s == 1.0 and plain_conv(c):
            # Through the convolution pick, as the ResNet blocks' (convolution.py), the bias in the Gluon kernel's
            # epilogue where the pick took it.
            return self.picks.convolution.module(c, h, c.bias)
        if s == 1.0:
            return c(h)
        return F.conv2d(h, c.weight, scaled_bias(c.bias, s), c.stride, c.padding, c.dilation, c.groups)


class GroupNormSiLU(nn.Module):
    """A model's final GroupNorm + SiLU (conv_norm_out, conv_act) as one kernel."""

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

    def __init__(self, attn: nn.Module, picks: KernelPicks):
        super().__init__()
        self.attn = attn
        self.picks = picks
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
        out = self.picks.attention(q, k, v).transpose(1, 2).reshape(batch, height * width, -1)
        proj = a.to_out[0]
        out = F.linear(out, proj.weight)
        residual = x.permute(0, 2, 3, 1).reshape(batch, height * width, channels)
        out = add_bias_residual(out, scaled_bias(proj.bias, s), residual)
        return out.view(batch, height, width, channels).permute(0, 3, 1, 2)  # NCHW view of NHWC memory
