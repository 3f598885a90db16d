"""The fuse driver: swap a UNet's or VAE decoder's supported blocks for their fused versions, in place.

Each replacement keeps the original module's parameters (same tensors, no copies): packed QKV / KV weights are built
once and the original q/k/v weights become views into them, so memory does not grow. Blocks whose config uses a
feature not handled here (scale-shift time norm, up/down-sampling resnets, ada-norm transformer blocks, custom
attention processors) are left as they are. Then, across blocks: proj_out biases folded into the ResNet block
before (fold_proj_out_biases), one time-embedding GEMM and one text K/V GEMM per call (projections.py), and in FP8
mode the e4m3 weights and scales (fp8_blocks.py).
"""

from __future__ import annotations

from torch import nn

from .common import is_silu
from .fp8_blocks import FP8Settings, Fp8ResnetBlock, Fp8TransformerBlock, attach_fp8, resnet_refusal, \
    transformer_refusal
from .picks import KernelPicks
from .projections import ContextProjections, TimeEmbeddingProjections
from .resnet import FusedCrossAttnUpBlock, FusedResnetBlock, FusedUpBlock
from .transformer import FusedAttention, FusedTransformer2D, FusedTransformerBlock
from .vae import FusedSpatialAttention, FusedUpsample2D, GroupNormSiLU


def fuse_modules(root: nn.Module, picks: KernelPicks | None = None, fp32_attention: bool = False,
                 fold_biases: bool = True, fp8: FP8Settings | None = None) -> dict[str, int]:
    """Swap every supported block under `root` for its fused version, in place. Returns counts per kind.

    picks: the engine's kernel choices, which every fused module calls (KernelPicks.build()'s defaults when None).
    fp32_attention: run attention (q, k, v, softmax) in fp32 inside fp16/bf16 models, the seeds'
    `--force_fp32_ops unet:MultiHeadAttention`; the fused SDPA kernels already keep the softmax in fp32.
    fold_biases: fold each transformer's proj_out bias into the ResNet block before it (fold_proj_out_biases).
    fp8: the FP8 mode's settings (None: off): the transformer blocks' Q/K/V, cross Q and feed-forward GEMMs and,
    with fp8.convs, the ResNet blocks' convolutions in e4m3 (fp8.py), with the scales' update hooked after `root`'s
    last layer (conv_out; without one, FP8 stays off)."""
    picks = picks if picks is not None else KernelPicks.build()
    # The first and last layers a call runs: a ControlNet's last is the convolution on its mid block's output.
    first = getattr(root, "conv_in", None)
    last = getattr(root, "conv_out", None) or getattr(root, "controlnet_mid_block", None)
    bounded = isinstance(first, nn.Module) and isinstance(last, nn.Module)
    builder = _Builder(picks, fp32_attention, fp8 if bounded else None)
    counts = builder.fuse_children(root)
    counts["folded_out_biases"] = fold_proj_out_biases(root) if fold_biases else 0
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
    if builder.fp8 is not None:
        counts.update(attach_fp8(root, last, builder.fp8.host_weights))
    return counts


class _Builder:
    """Which fused class each supported block becomes: the FP8 mode's where it is on and the block takes it."""

    def __init__(self, picks: KernelPicks, fp32_attention: bool, fp8: FP8Settings | None):
        self.picks, self.fp32_attention, self.fp8 = picks, fp32_attention, fp8

    def resnet(self, block: nn.Module) -> FusedResnetBlock:
        if self.fp8 is not None and self.fp8.convs and resnet_refusal(block) is None:
            return Fp8ResnetBlock(block, self.picks)
        return FusedResnetBlock(block, self.picks)

    def transformer_block(self, block: nn.Module) -> FusedTransformerBlock:
        if (self.fp8 is not None and block.attn1.to_q.in_features >= self.fp8.min_width
                and transformer_refusal(block) is None):
            return Fp8TransformerBlock(block, self.picks, self.fp32_attention)
        return FusedTransformerBlock(block, self.picks, self.fp32_attention)

    def fuse_children(self, root: nn.Module) -> dict[str, int]:
        counts = {"resnet": 0, "transformer": 0, "transformer_block": 0, "upsample": 0, "spatial_attention": 0,
                  "group_norm_silu": 0, "up_block": 0}
        for name, child in list(root.named_children()):
            if FusedResnetBlock.supports(child):
                setattr(root, name, self.resnet(child))
                counts["resnet"] += 1
            elif FusedUpsample2D.supports(child):
                setattr(root, name, FusedUpsample2D(child, self.picks))
                counts["upsample"] += 1
            elif FusedSpatialAttention.supports(child):
                setattr(root, name, FusedSpatialAttention(child, self.picks))
                counts["spatial_attention"] += 1
            elif FusedTransformer2D.supports(child):
                fused = FusedTransformer2D(child, self.transformer_block)
                setattr(root, name, fused)
                counts["transformer"] += 1
                counts["transformer_block"] += len(fused.blocks)
            else:
                for key, value in self.fuse_children(child).items():
                    counts[key] += value
                for up_block in (FusedUpBlock, FusedCrossAttnUpBlock):
                    if up_block.supports(child):  # after its own ResNet blocks were fused
                        setattr(root, name, up_block(child))
                        counts["up_block"] += 1
        # The final norm + SiLU of a UNet or VAE decoder.
        norm_out, act = getattr(root, "conv_norm_out", None), getattr(root, "conv_act", None)
        if isinstance(norm_out, nn.GroupNorm) and act is not None and is_silu(act):
            root.conv_norm_out = GroupNormSiLU(norm_out)
            root.conv_act = nn.Identity()
            counts["group_norm_silu"] += 1
        return counts


# diffusers' blocks whose forward runs resnets[i] and then attentions[i] on its output, which nothing else reads (the
# mid block too: resnets[0], then attentions[i] and resnets[i + 1] in turn).
RESNET_THEN_TRANSFORMER = ("CrossAttnDownBlock2D", "CrossAttnUpBlock2D", "UNetMidBlock2DCrossAttn")


def fold_proj_out_biases(root: nn.Module) -> int:
    """Where a fused ResNet block's output goes only to a fused transformer, the transformer's proj_out bias joins
    the block's output bias (its convolution's epilogue adds it for free); the transformer's norm subtracts it again
    with its per-channel add, and proj_out's GEMM accumulates onto that input in place (cuBLAS's beta = 1): the
    separate bias + residual pass after proj_out goes (16 a SD1.5 UNet call). On an H200, one UNet call: SD1.5 at
    CFG batch 2 5.17-5.21 -> 5.13-5.17 ms, at 16 29.84-29.95 -> 29.68-29.78, FP8 at 2 4.90-4.91 -> 4.83-4.85; the
    same error against fp32 and the same memory. Returns how many pairs were folded."""
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
