"""What to do when a generation's image comes out non-finite: decode the same latents with the VAE in fp32.

The remedy is about precision, not about the model: the fp16/bf16 weights stay as they are, only the computation
that overflowed is lifted to fp32. (The UNet's remedy, fp32 attention, belongs to the engine:
Engine.upcast_attention.)
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..models.components import Components, vae_decode_fn


def to_uint8(decoded: torch.Tensor) -> torch.Tensor:
    """VAE output in [-1, 1] -> uint8 in [0, 255], exactly as the pipeline converts it: round((x/2 + 1/2) * 255)."""
    return ((decoded / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)


@torch.inference_mode()
def fp32_decode(components: Components, latents: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """Decode final latents (as in GenerationResult.latents: before the 1/scaling_factor) with the VAE in fp32.
    Returns the image in [-1, 1], fp32, on the VAE's device.

    in_place=False: decodes with an fp32 copy of post_quant_conv + decoder (the encoder is not copied), freed on
    return; costs that copy's memory (~200 MB for the SD VAE decoder) for the duration of the call.
    in_place=True: casts the VAE itself to fp32, decodes, and casts it back; no extra weight memory, and exact,
    since fp16/bf16 -> fp32 -> fp16/bf16 is lossless. Use it when memory is tight; not while another thread uses
    the VAE.
    """
    vae = components.vae
    weight = next(vae.parameters())
    z = latents.to(weight.device, torch.float32) / components.spec.vae_scaling_factor
    if in_place:
        original = weight.dtype
        nn.Module.to(vae, dtype=torch.float32)
        try:
            return vae_decode_fn(vae)(z).float()
        finally:
            nn.Module.to(vae, dtype=original)

    # Only the decoding half is copied: a namespace with the two attributes vae_decode_fn reads.
    decoder = nn.Module.to(copy.deepcopy(vae.decoder), dtype=torch.float32)
    post_quant = None if vae.post_quant_conv is None else \
        nn.Module.to(copy.deepcopy(vae.post_quant_conv), dtype=torch.float32)
    half = nn.Module()
    half.decoder, half.post_quant_conv = decoder, post_quant
    return vae_decode_fn(half)(z).float()
