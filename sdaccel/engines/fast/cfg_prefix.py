"""Whether a fused UNet can share classifier-free guidance's common prefix: take the latents once, B samples beside
the 2B context (uncond first), and compute what both halves share once (the fast engine's share_cfg_prefix)."""

from __future__ import annotations

from torch import nn

from .fp8 import Fp8Scales
from .projections import ContextProjections, TimeEmbeddingProjections
from .resnet import FusedResnetBlock, FusedUpBlock
from .transformer import FusedTransformer2D
from .vae import FusedUpsample2D, GroupNormSiLU


# What a UNet call may pass the latents through at batch B beside a context of 2B (the shared CFG prefix): the fused
# blocks, which widen what they hand on (repeat_batch), and modules that never meet the context or the time
# embedding's per-sample values (containers whose forward only passes tensors on, plain layers, the time embedding).
# A fused up block widens its skip connections, then runs its own blocks, which are checked like the rest. The FP8
# mode's scales are buffers with no forward: the two halves' identical prefix records the same amaxes at B samples
# as at 2B.
_PREFIX_SAFE_FUSED = (FusedResnetBlock, FusedTransformer2D, FusedUpsample2D, GroupNormSiLU,
                      TimeEmbeddingProjections, ContextProjections, Fp8Scales)
_PREFIX_SAFE_PLAIN = {"ModuleList", "Conv2d", "Linear", "SiLU", "Identity", "Timesteps", "TimestepEmbedding",
                      "Downsample2D", "DownBlock2D", "CrossAttnDownBlock2D", "UNetMidBlock2DCrossAttn",
                      # A ControlNet's: the control image (or its embedding) is the same for both halves.
                      "ControlNetConditioningEmbedding"}


# How cfg_prefix_refusal's answer begins for a UNet whose halves differ from the start (SDXL's time embedding takes
# the pooled text): nothing to share, so nothing lost.
PREFIX_NEVER_SHARED = "its time embedding takes"


def cfg_prefix_refusal(unet: nn.Module) -> str | None:
    """Why a fused UNet (or ControlNet) cannot take classifier-free guidance's latents once, B samples beside the
    2B context (uncond first), and compute what both halves share once (None: it can).

    Both halves of a CFG call get the same latents and timestep; they differ only through the text, which enters at
    the first cross-attention. Up to there (SD1.x/2.x: conv_in, the first ResNet block, the first transformer's
    norm, input projection and self-attention at 4096 tokens) one half's computation is the other's. That holds
    only while the time embedding is the same for both (no class or added text embedding, as SDXL's pooled text)
    and while every module that meets the context or a skip connection is a fused one that widens the batch where
    it has to; diffusers' own attention would silently fold the 2B context into B samples."""
    config = getattr(unet, "config", None)
    if type(unet).__name__ not in ("UNet2DConditionModel", "ControlNetModel") or config is None:
        return f"{type(unet).__name__} is not a diffusers UNet2DConditionModel or ControlNetModel"
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
