"""The fused ResNet block and the up blocks that feed it their skip connections in place.

Activations stay channels_last (NHWC) end to end. Each replacement keeps the original module's parameters (same
tensors, no copies). The FP8 mode's variant of the ResNet block is fp8_blocks.Fp8ResnetBlock.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import UsageError
from ...kernels.group_norm import group_norm
from .common import is_silu, repeat_batch, scaled_bias
from .picks import KernelPicks


def plain_conv(conv: nn.Module) -> bool:
    """A conv whose weight and bias can be applied separately (no adapter wrapped around it)."""
    return type(conv) is nn.Conv2d and conv.padding_mode == "zeros"


class FusedResnetBlock(nn.Module):
    """GN+SiLU -> conv1 -> (+temb) GN+SiLU -> conv2 -> + shortcut, with the norms, SiLUs, biases and adds fused.

    conv1's bias joins the time-embedding add inside the second norm (GroupNorm of h + bias + temb[n] is what
    the block computes); conv2's and the shortcut conv's biases join the residual add, in conv2's epilogue or one
    kernel after it. When the UNet's blocks share a TimeEmbeddingProjections, every block's time projection comes
    from one GEMM. A norm and the convolution it feeds are `_norm` and `_conv`, which the FP8 mode overrides.
    """

    def __init__(self, block: nn.Module, picks: KernelPicks):
        super().__init__()
        self.block = block  # keeps the parameters registered under the same names
        self.picks = picks
        self.time_projections = None  # the UNet's shared TimeEmbeddingProjections (set by fuse_modules)
        self.time_slice: tuple[int, int] | None = None  # this block's columns of the shared projections
        convs = [block.conv1, block.conv2] + ([block.conv_shortcut] if block.conv_shortcut is not None else [])
        self.split_biases = all(plain_conv(c) for c in convs)
        self.stream_scale = 1.0  # activations kept times this (vae_scaling.py): 1 but in a rescaled VAE decoder
        # The next transformer's proj_out, whose bias this block's output carries (fold.py; a reference, not a
        # submodule).
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
                and is_silu(block.nonlinearity) and not block.skip_time_act)

    def _out_bias(self) -> torch.Tensor:
        b = self.block
        terms = [t for t in (b.conv2.bias, b.conv_shortcut.bias if b.conv_shortcut is not None else None,
                             self.folded_layer.bias if self.folded_layer is not None else None) if t is not None]
        if not terms:
            return torch.zeros_like(b.conv2.weight[:, 0, 0, 0]).detach()
        bias = terms[0].float()
        for term in terms[1:]:
            bias = bias + term.float()  # summed in fp32, rounded once (the biases only: in FP8 mode the weights
            # may wait on the host)
        return (bias * self.stream_scale).to(terms[0].dtype).detach()

    def fold_bias_of(self, layer: nn.Module) -> None:
        """Add `layer`'s bias (the next transformer's proj_out) to this block's output: see fold.py."""
        object.__setattr__(self, "folded_layer", layer)
        self._rebuild_out_bias()

    def _rebuild_out_bias(self) -> None:
        """The combined output bias, rebuilt in place (captured CUDA graphs read its address)."""
        if self.split_biases:
            with torch.no_grad():
                self.out_bias.copy_(self._out_bias())

    def can_scale_stream(self) -> bool:
        return self.split_biases and self.block.time_emb_proj is None

    def refresh(self) -> None:
        """Rebuild what is derived from the weights in place (captured CUDA graphs read its address)."""
        self._rebuild_out_bias()

    def _norm(self, index: int, x: torch.Tensor, norm: nn.GroupNorm, **kwargs):
        """GroupNorm + SiLU of the input of convolution `index` (0: conv1, 1: conv2), kwargs as group_norm's; returns
        (its result, what _conv needs to know of it: nothing here)."""
        return group_norm(x, norm.num_groups, norm.weight, norm.bias, silu=True, **kwargs), None

    def _conv(self, index: int, conv: nn.Conv2d, h: torch.Tensor, plan, bias: torch.Tensor | None,
              residual: torch.Tensor | None) -> torch.Tensor:
        """conv(h) + bias + residual, through the convolution picked for the shape."""
        return self.picks.convolution.module(conv, h, bias, residual)

    def _time_add(self, temb: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """What the second norm adds before normalizing: conv1's bias plus the time embedding's projection."""
        b = self.block
        if temb is None or b.time_emb_proj is None:
            return scaled_bias(b.conv1.bias, self.stream_scale)  # (C,): broadcast by the kernel
        if self.time_projections is not None:
            add = self.time_projections(temb, self, batch)  # conv1's bias already added
        else:
            add = b.time_emb_proj(F.silu(temb))
            add = add + b.conv1.bias if b.conv1.bias is not None else add
        if add.dim() == 2 and add.shape[0] not in (1, batch):
            add = repeat_batch(add, batch)  # a time embedding of the latents once, h of both CFG halves
        return add

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None, *args,
                concat: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """``concat``: channels appended to x's (an up block's skip connection), read in place by the first norm,
        which also writes the concatenation the shortcut convolution takes: no separate torch.cat."""
        if not self.split_biases:
            return self._forward_wrapped(x, temb, concat)
        b, s = self.block, self.stream_scale
        # Scaled activations (s != 1): the norms see x and conv1's output times s (eps times s^2 keeps them
        # exact) and hand the convolutions inputs times s, so that their outputs come out times s.
        if concat is None:
            h, plan = self._norm(0, x, b.norm1, eps=b.norm1.eps * s * s, output_scale=s)
        else:
            if s != 1.0:
                raise UsageError("a rescaled VAE decoder's ResNet blocks take no concatenated input")
            (h, x), plan = self._norm(0, x, b.norm1, eps=b.norm1.eps, concat=concat, return_sum=True)
        h = self._conv(0, b.conv1, h, plan, None, None)
        h, plan = self._norm(1, h, b.norm2, eps=b.norm2.eps * s * s, add=self._time_add(temb, x.shape[0]),
                             output_scale=s)
        shortcut = self.picks.convolution.module(b.conv_shortcut, x) if b.conv_shortcut is not None else x
        # conv2's epilogue adds the biases and the shortcut where it can; else bias_add, which matches the shortcut
        # to h's layout.
        return self._conv(1, b.conv2, h, plan, self.out_bias, shortcut)

    def _forward_wrapped(self, x: torch.Tensor, temb: torch.Tensor | None, concat: torch.Tensor | None):
        """Convolutions wrapped by adapters (a LoRA's conv layers): the norms fused, the convolutions as they are."""
        b = self.block
        if concat is None:
            h = group_norm(x, b.norm1.num_groups, b.norm1.weight, b.norm1.bias, b.norm1.eps, silu=True)
        else:
            h, x = group_norm(x, b.norm1.num_groups, b.norm1.weight, b.norm1.bias, b.norm1.eps, silu=True,
                              concat=concat, return_sum=True)
        h = b.conv1(h)
        add = b.time_emb_proj(F.silu(temb)) if temb is not None and b.time_emb_proj is not None else None
        if add is not None and add.dim() == 2 and add.shape[0] not in (1, x.shape[0]):
            add = repeat_batch(add, x.shape[0])
        h = group_norm(h, b.norm2.num_groups, b.norm2.weight, b.norm2.bias, b.norm2.eps, silu=True, add=add)
        h = b.conv2(h)
        shortcut = b.conv_shortcut(x) if b.conv_shortcut is not None else x
        return shortcut + h


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
