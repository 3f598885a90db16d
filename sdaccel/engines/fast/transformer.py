"""The fused transformer: packed-projection attention, the transformer block with its norms and adds fused, and the
spatial transformer around the blocks, all on NHWC activations without layout transposes.

A transformer's input (B, C, H, W) in NHWC memory *is* the (B, H*W, C) token matrix, so entering and leaving the
transformer costs no transpose. The FP8 mode's variant of the block is fp8_blocks.Fp8TransformerBlock.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import UsageError
from ...kernels.bias_add import bias_add_
from ...kernels.group_norm import group_norm
from ...kernels.layer_norm import layer_norm
from ...models.ip_attention import IPAttnProcessor, split_context
from .common import merged_base, pack_weights, repeat_batch, view_rows
from .picks import KernelPicks


def context_batch(context, h: torch.Tensor) -> int:
    """The batch the cross-attention computes at: the text context's (2B with guidance), h's without a context."""
    text = split_context(context)[0]
    return h.shape[0] if text is None else text.shape[0]


class FusedAttention(nn.Module):
    """Self-attention with one packed QKV GEMM, or cross-attention with a packed KV GEMM; SDPA-class kernels
    picked per shape (attention.py)."""

    def __init__(self, attn: nn.Module, picks: KernelPicks, fp32: bool = False):
        super().__init__()
        self.attn = attn
        # IP-Adapter's K/V layers of this cross-attention (models/ip_attention.py), each adapter's packed [K; V]
        # weight a buffer: the image tokens' attention runs beside the text's, its output added with the scale.
        self.ip = attn.processor if isinstance(attn.processor, IPAttnProcessor) else None
        self.ip_adapters = 0 if self.ip is None else len(self.ip.to_k_ip)
        for j in range(self.ip_adapters):
            self.register_buffer(f"ip_packed_{j}", pack_weights(self._ip_layers(j)), persistent=False)
        self.picks = picks
        self.fp32 = fp32  # the per-op fp32 exception: q, k, v and softmax in fp32, result cast back
        self.heads = attn.heads
        self.is_cross = attn.is_cross_attention
        self.context_projections = None  # the UNet's shared ContextProjections (cross-attention; fuse.py)
        self.kv_slice: tuple[int, int] | None = None  # this attention's columns of the shared K/V projections
        q, k, v = attn.to_q, attn.to_k, attn.to_v
        if not all(type(layer) is nn.Linear for layer in (q, k, v)):
            raise UsageError("attention projections are wrapped (LoRA adapters loaded?): fuse them first")
        # A buffer, not a parameter: state_dict() keeps showing the original to_q/to_k/to_v views.
        self.register_buffer("packed_weight", pack_weights(self.projections()), persistent=False)

    def projections(self) -> list[nn.Linear]:
        """The layers packed_weight packs: K and V (cross-attention) or Q, K and V (self-attention)."""
        names = ("to_k", "to_v") if self.is_cross else ("to_q", "to_k", "to_v")
        return [merged_base(getattr(self.attn, name)) for name in names]

    def input_weight(self) -> torch.Tensor:
        """The weight the tokens x are multiplied by: Q's (cross-attention) or the packed Q/K/V (self-attention)."""
        return self.attn.to_q.weight if self.is_cross else self.packed_weight

    def view_packed(self) -> None:
        """Make the projections' weights views of packed_weight again, after it moved (fp8.HostFp16.offload)."""
        view_rows(self.projections(), self.packed_weight)

    def _ip_layers(self, j: int) -> list[nn.Linear]:
        return [self.ip.to_k_ip[j], self.ip.to_v_ip[j]]

    def refresh(self) -> None:
        """Copy the current q/k/v weights into the packed weight, in place (its address, which captured CUDA
        graphs read, stays), and make them views of it again. For weights changed after fusion (LoRA fuse)."""
        pack_weights(self.projections(), self.packed_weight)
        for j in range(self.ip_adapters):
            pack_weights(self._ip_layers(j), getattr(self, f"ip_packed_{j}"))

    @staticmethod
    def supports(attn: nn.Module) -> bool:
        proc = type(attn.processor).__name__
        ip = isinstance(attn.processor, IPAttnProcessor) and attn.is_cross_attention
        return (type(attn).__name__ == "Attention" and (proc in ("AttnProcessor2_0", "AttnProcessor") or ip)
                and attn.to_q.bias is None and attn.to_k.bias is None and attn.to_v.bias is None
                and attn.group_norm is None and attn.spatial_norm is None and attn.norm_cross is None
                and not attn.residual_connection and attn.rescale_output_factor == 1.0
                and getattr(attn, "norm_q", None) is None)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                weight: torch.Tensor | None = None) -> torch.Tensor:
        """Attention output before the output projection, as (B, L, heads * head_dim). weight: instead of
        input_weight() (an FP8 site's fp16 copy on the GPU)."""
        return self.attend(F.linear(x, self.input_weight() if weight is None else weight), context)

    def attend(self, projected: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        """The attention of tokens already multiplied by input_weight(): `projected` is (B, L, heads * d) Q
        (cross-attention, K/V come from the context) or (B, L, 3 * heads * d) packed Q/K/V."""
        batch, length, _ = projected.shape
        heads = self.heads
        context, images = split_context(context)
        if self.is_cross:
            q = projected.view(batch, length, heads, -1).transpose(1, 2)
            if self.context_projections is not None:
                kv = self.context_projections(context, self)  # a column slice of the one K/V GEMM
            else:
                kv = F.linear(context, self.packed_weight)
            kv = kv.view(batch, context.shape[1], 2, heads, -1)
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        else:
            qkv = projected.view(batch, length, 3, heads, -1)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        out = self._attention(q, k, v)
        for j, tokens in enumerate(images or ()):
            kv = F.linear(tokens, getattr(self, f"ip_packed_{j}")).view(batch, tokens.shape[1], 2, heads, -1)
            ip = self._attention(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2))
            out = out.addcmul_(ip, self.ip.scales.values[j])  # + scale_j * ip, one kernel; the scale a tensor
        return out.transpose(1, 2).reshape(batch, length, -1)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        attention = self.picks.attention
        if self.fp32 or (self.ip is not None and self.ip.fp32):
            return attention(q.float(), k.float(), v.float()).to(q.dtype)
        return attention(q, k, v, upcast=self.attn.upcast_attention)


class FusedTransformerBlock(nn.Module):
    """LN -> self-attn -> (+res) LN -> cross-attn -> (+res) LN -> GEGLU FF -> +res.

    The residual adds, output-projection biases and the following LayerNorm run as one SkipLayerNorm kernel; the
    feed-forward's bias and GELU gate as one BiasSplitGelu kernel after its GEMM, or inside it (feed_forward.py,
    per shape); its output GEMM adds onto the residual in place.
    """

    def __init__(self, block: nn.Module, picks: KernelPicks, fp32_attention: bool = False):
        super().__init__()
        self.block = block
        self.picks = picks
        self.attn1 = FusedAttention(block.attn1, picks, fp32_attention)
        self.attn2 = FusedAttention(block.attn2, picks, fp32_attention)

    @staticmethod
    def supports(block: nn.Module) -> bool:
        ff = getattr(block, "ff", None)
        return (type(block).__name__ == "BasicTransformerBlock" and block.norm_type == "layer_norm"
                and not block.only_cross_attention and not block.double_self_attention
                and block.pos_embed is None and block.attn2 is not None and ff is not None
                and type(ff.net[0]).__name__ == "GEGLU" and getattr(block, "norm4", None) is None
                and FusedAttention.supports(block.attn1) and FusedAttention.supports(block.attn2)
                and all(isinstance(n, nn.LayerNorm) for n in (block.norm1, block.norm2, block.norm3)))

    def forward(self, h: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self._forward(h, context)

    def _forward(self, h: torch.Tensor, context: torch.Tensor,
                 weights: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """The block (h itself is not written). weights: the Q/K/V (packed), cross Q, feed-forward in and out
        weights to multiply by, instead of the modules' own (an FP8 block's fp16 copies on the GPU)."""
        b = self.block
        proj_in, proj_out = b.ff.net[0].proj, b.ff.net[2]
        w_qkv, w_cross_q, w_in, w_out = weights or (None, None, proj_in.weight, proj_out.weight)
        n = layer_norm(h, b.norm1.weight, b.norm1.bias, b.norm1.eps)
        a = F.linear(self.attn1(n, weight=w_qkv), b.attn1.to_out[0].weight)
        n, h = layer_norm(a, b.norm2.weight, b.norm2.bias, b.norm2.eps, skip=h, input_bias=b.attn1.to_out[0].bias,
                          return_sum=True)
        batch = context_batch(context, h)
        if batch != h.shape[0]:
            # The latents came once for both CFG halves (repeat_batch): up to here they were the same, the
            # cross-attention with the two contexts is where they part.
            n, h = repeat_batch(n, batch), repeat_batch(h, batch)
        a = F.linear(self.attn2(n, context, weight=w_cross_q), b.attn2.to_out[0].weight)
        # The residual stream h comes back with the feed-forward's output bias already in it, so the last GEMM
        # accumulates onto h in place (cuBLAS's beta = 1): no separate bias + residual kernel.
        n, h = layer_norm(a, b.norm3.weight, b.norm3.bias, b.norm3.eps, skip=h, input_bias=b.attn2.to_out[0].bias,
                          return_sum=True, sum_bias=proj_out.bias)
        f = self.picks.feed_forward.linear_geglu(n, w_in, proj_in.bias)  # cuBLAS + GEGLU kernel, or one kernel
        h.view(-1, h.shape[-1]).addmm_(f.view(-1, f.shape[-1]), w_out.t())
        return h


class FusedTransformer2D(nn.Module):
    """GroupNorm -> proj_in -> blocks -> proj_out -> + residual on NHWC activations, no layout transposes.
    make_block: what each BasicTransformerBlock becomes (the FP8 mode decides per block)."""

    def __init__(self, model: nn.Module, make_block: Callable[[nn.Module], FusedTransformerBlock]):
        super().__init__()
        self.model = model
        self.blocks = nn.ModuleList(make_block(b) for b in model.transformer_blocks)
        # take_folded_bias: -proj_out's bias, which the input then carries (None: it does not).
        self.register_buffer("neg_out_bias", None, persistent=False)

    def take_folded_bias(self) -> None:
        """The input arrives with proj_out's bias added (fold.py): the norm takes it off again (its per-channel
        add), and proj_out's GEMM accumulates onto the input in place, whose bias is then the output's."""
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
