"""An attention processor that runs softmax(q k^T * scale) v in fp32, whatever dtype the module's weights are.

Why a processor of our own: diffusers 0.42's default processor (AttnProcessor2_0) ignores the module's
`upcast_attention` / `upcast_softmax` flags and calls SDPA in the module's dtype; only the legacy AttnProcessor
(baddbmm + softmax, materialising the full score matrix) honours them. In fp16 the score q·k can exceed 65504 (SD2.1
at 768 px is the known case) and SDPA's math backend then produces inf and NaN. This processor keeps the projections
in the module's dtype (where the FLOPs are) and only lifts q, k, v to fp32 for the attention product itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class UpcastAttnProcessor:
    """Drop-in for diffusers' Attention processors: same inputs and outputs, attention computed in fp32."""

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None, *args, **kwargs):
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        spatial = hidden_states.dim() == 4  # the VAE's mid-block attention sees (B, C, H, W) feature maps
        if spatial:
            batch, channels, height, width = hidden_states.shape
            hidden_states = hidden_states.flatten(2).transpose(1, 2)  # (B, H*W, C) tokens
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        if encoder_hidden_states is None:  # self-attention attends to the (normalised) tokens themselves
            context = hidden_states
        else:
            context = attn.norm_encoder_hidden_states(encoder_hidden_states) if attn.norm_cross \
                else encoder_hidden_states
        batch_size = hidden_states.shape[0]
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, context.shape[1], batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
            if attention_mask.is_floating_point():
                attention_mask = attention_mask.float()

        compute_dtype = hidden_states.dtype
        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)

        def heads(x: torch.Tensor) -> torch.Tensor:  # (B, L, heads * d) -> (B, heads, L, d)
            return x.unflatten(-1, (attn.heads, -1)).transpose(1, 2)

        query, key, value = heads(query), heads(key), heads(value)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        # The one place precision matters: scores q·k and their softmax in fp32, then back to the module's dtype.
        out = F.scaled_dot_product_attention(query.float(), key.float(), value.float(), attn_mask=attention_mask,
                                             scale=attn.scale)
        out = out.transpose(1, 2).flatten(2).to(compute_dtype)  # (B, L, heads * d)

        out = attn.to_out[0](out)
        out = attn.to_out[1](out)  # dropout (identity at inference)
        if spatial:
            out = out.transpose(1, 2).reshape(batch, channels, height, width)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor


# Processors whose computation UpcastAttnProcessor reproduces exactly (in fp32). Any other processor (IP-adapter,
# custom ones) is left in place: replacing it would silently drop what it does.
_REPLACEABLE = ("AttnProcessor2_0", "AttnProcessor", "UpcastAttnProcessor")


def upcast_diffusers_attention(root: torch.nn.Module) -> int:
    """Every diffusers Attention under `root` computes its attention in fp32 from now on, in place and for good (an
    overflow would come back on the next prompt). Sets `upcast_attention` / `upcast_softmax` (which diffusers'
    legacy processor honours) and installs UpcastAttnProcessor where the processor is a plain one (the default,
    AttnProcessor2_0, ignores those flags). Returns how many processors were replaced."""
    processor = UpcastAttnProcessor()
    switched = 0
    for attn in root.modules():
        if type(attn).__name__ != "Attention" or not hasattr(attn, "processor"):
            continue
        attn.upcast_attention = True
        attn.upcast_softmax = True
        if type(attn.processor).__name__ in _REPLACEABLE:
            attn.set_processor(processor)
            switched += 1
    return switched
