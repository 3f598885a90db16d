"""IP-Adapter's decoupled cross-attention, with the image prompt's strength a device tensor.

An IP-Adapter gives every cross-attention of the UNet a second K/V projection (to_k_ip, to_v_ip) of the image
prompt's tokens; the layer's output is the text attention plus scale x the attention over the image tokens, before
the output projection: out = to_out(attn(q, K_text, V_text) + sum_j scale_j * attn(q, K_ip_j, V_ip_j)).

diffusers' IPAdapterAttnProcessor2_0 computes exactly that, with the scales Python floats and a `scale == 0` test per
layer: a new scale is a recompile under torch.compile, and a tensor scale a host sync per layer. This processor reads
each adapter's scale from one device tensor (IPScales) shared by every layer, so a new strength is a copy into it:
compiled code and captured CUDA graphs see it without being built again. It takes the same inputs as diffusers'
(encoder_hidden_states = (text context, [image tokens of each adapter])); a plain tensor is a call without an image
prompt, computed as the model alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class IPScales(nn.Module):
    """The scale of each loaded adapter, one device tensor every IP cross-attention reads. Written in place
    (`set`), so its address, which compiled code and CUDA graphs read, stays."""

    def __init__(self, adapters: int):
        super().__init__()
        self.register_buffer("values", torch.ones(adapters), persistent=False)

    def set(self, scales: list[float]) -> None:
        with torch.no_grad():
            for j, value in enumerate(scales):
                self.values[j].fill_(float(value))  # a kernel with the value as its argument: no host sync


class IPAttnProcessor(nn.Module):
    """A cross-attention's processor with IP-Adapter image tokens: diffusers' to_k_ip / to_v_ip layers (one per
    adapter, the same modules and parameter names), scales read from `scales` (IPScales, shared). Image masks
    are not taken (pipelines refuse them by name)."""

    def __init__(self, to_k_ip: nn.ModuleList, to_v_ip: nn.ModuleList, num_tokens: list[int], scales: IPScales):
        super().__init__()
        self.to_k_ip, self.to_v_ip = to_k_ip, to_v_ip
        self.num_tokens = list(num_tokens)
        object.__setattr__(self, "scales", scales)  # a reference: registered once, on the adapters' module
        self.fp32 = False  # the output guard's remedy: the attention products in fp32 (engines/upcast_attention.py)

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states=None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None, *args, **kwargs):
        if kwargs.get("ip_adapter_masks") is not None:
            raise ValueError("ip_adapter_masks are not supported")
        text, images = split_context(encoder_hidden_states)
        residual = hidden_states
        batch = hidden_states.shape[0]
        context = hidden_states if text is None else text
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, context.shape[1], batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        query = _heads(attn.to_q(hidden_states), attn.heads)
        out = self._attend(query, _heads(attn.to_k(context), attn.heads), _heads(attn.to_v(context), attn.heads),
                           attention_mask)
        for j, tokens in enumerate(images or ()):
            tokens = tokens.flatten(1, 2) if tokens.dim() == 4 else tokens  # (B, images, tokens, D) as diffusers'
            ip = self._attend(query, _heads(self.to_k_ip[j](tokens), attn.heads),
                              _heads(self.to_v_ip[j](tokens), attn.heads))
            out = out + self.scales.values[j] * ip  # no `scale == 0` branch: 0 * ip adds nothing
        out = attn.to_out[1](attn.to_out[0](out))
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor

    def _attend(self, q, k, v, mask=None) -> torch.Tensor:
        """(B, heads, L, d) -> (B, L, heads * d), in q's dtype."""
        dtype = q.dtype
        if self.fp32:
            q, k, v = q.float(), k.float(), v.float()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).flatten(2).to(dtype)

    @staticmethod
    def supports(attn: nn.Module) -> str | None:
        """Why this processor cannot serve `attn` exactly as diffusers' does (None: it can)."""
        for name in ("spatial_norm", "group_norm", "norm_q", "norm_k"):
            if getattr(attn, name, None) is not None:
                return f"the attention has a {name}"
        if getattr(attn, "norm_cross", None):
            return "the attention normalises its context"
        return None


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def split_context(context) -> tuple[torch.Tensor | None, list[torch.Tensor] | None]:
    """(text context, image tokens per adapter or None) from a UNet's encoder_hidden_states: diffusers' tuple
    (context, [tokens...]) with image prompts, a tensor without."""
    if isinstance(context, tuple):
        text, images = context
        return text, list(images)
    return context, None


def text_context(context) -> torch.Tensor | None:
    """The text part of encoder_hidden_states (what ControlNets, and the text K/V projections, read)."""
    return split_context(context)[0]


def cast_context(context, dtype: torch.dtype):
    """encoder_hidden_states in `dtype`, image tokens included."""
    text, images = split_context(context)
    text = None if text is None else text.to(dtype)
    return text if images is None else (text, [tokens.to(dtype) for tokens in images])
