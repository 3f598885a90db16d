"""Small pieces the fused blocks share: packed weights, the shared-CFG-prefix batch widening, scaled biases."""

from __future__ import annotations

import torch
from torch import nn

from ...errors import UsageError
from ...kernels.fp8 import is_float8


def is_silu(module: nn.Module) -> bool:
    return isinstance(module, nn.SiLU) or getattr(module, "__name__", "") == "silu"


def merged_base(layer: nn.Module) -> nn.Module:
    """The layer whose weight the packed buffers mirror: under a PEFT LoRA wrapper, its base layer, which holds
    the weights once the adapters are merged (unmerged active adapters are refused: packed weights ignore them)."""
    base = getattr(layer, "base_layer", None)
    if base is None:
        return layer
    if not getattr(layer, "merged", False) and getattr(layer, "active_adapters", None):
        raise UsageError("LoRA adapters must be fused into the weights (pipe.fuse_lora()) before "
                         "refresh_weights(): the fast engine's packed projections do not run unfused adapters")
    return base


def pack_weights(layers: list[nn.Module], packed: torch.Tensor | None = None) -> torch.Tensor:
    """The layers' weights stacked along rows into `packed` (a new tensor when None; otherwise rewritten in place,
    so the address captured CUDA graphs read stays), and each layer's weight made a view of its rows: one copy."""
    with torch.no_grad():
        stacked = torch.cat([layer.weight for layer in layers], 0)
        packed = stacked if packed is None else packed.copy_(stacked)
    view_rows(layers, packed)
    return packed


def view_rows(layers: list[nn.Module], packed: torch.Tensor) -> None:
    """Each layer's weight made a view of its rows of `packed`, in order."""
    start = 0
    for layer in layers:
        rows = layer.weight.shape[0]
        layer.weight.data = packed[start:start + rows]
        start += rows


def scaled_bias(bias: torch.Tensor | None, scale: float) -> torch.Tensor | None:
    """A bias times a rescaled VAE decoder's stream scale (vae_scaling.py); the bias itself when there is none."""
    return bias if bias is None or scale == 1.0 else bias * scale


def repeat_batch(t: torch.Tensor, batch: int) -> torch.Tensor:
    """`t` with its samples repeated up to `batch`, [t; t] for classifier-free guidance's two halves (the order
    of torch.cat([latents, latents])), in t's memory format; `t` itself when it has `batch` samples already.

    A UNet called with the latents once and the context twice (the shared CFG prefix: cfg_prefix.py) computes at
    batch B until the first cross-attention, where the halves start to differ. The fused blocks widen their
    activations there, and later widen what still arrives at batch B from before that point (conv_in's skip
    connection, the time embedding)."""
    if t.shape[0] == batch:
        return t
    if t.shape[0] == 0 or batch % t.shape[0]:
        raise UsageError(f"cannot repeat a batch of {t.shape[0]} to {batch}: the context's batch must be a multiple "
                         "of the latents'")
    if is_float8(t):  # e4m3 (FP8 mode): copied as bytes, whatever cat supports
        return torch.cat([t.view(torch.uint8)] * (batch // t.shape[0])).view(t.dtype)
    return torch.cat([t] * (batch // t.shape[0]))
