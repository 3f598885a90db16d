"""What to do when a generation comes out non-finite: fp32 attention in the UNet, or an fp32 VAE decode.

Both remedies are about precision, not about the model: the fp16/bf16 weights stay as they are, only the
computation that overflowed is lifted to fp32.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..models.components import Components, vae_decode_fn
from .upcast_attention import UpcastAttnProcessor

# Processors whose computation UpcastAttnProcessor reproduces exactly (in fp32). Any other processor (IP-adapter,
# custom ones) is left in place: replacing it would silently drop what it does.
_REPLACEABLE = ("AttnProcessor2_0", "AttnProcessor", "UpcastAttnProcessor")


def _attention_modules(root: nn.Module):
    """diffusers Attention modules under `root` (also those wrapped by the fast engine's FusedAttention)."""
    return [m for m in root.modules() if type(m).__name__ == "Attention" and hasattr(m, "processor")]


def remedy_unet(components: Components, stages=None) -> dict[str, int]:
    """Switch every attention layer of the UNet to fp32 attention, in place and for good (the overflow would come
    back on the next prompt). Returns {"upcast": n switched, "kept": n with a processor left as it was}.

    Sets `upcast_attention` / `upcast_softmax` on each Attention (honoured by diffusers' legacy processor), turns
    on the fast engine's fp32 attention, and installs UpcastAttnProcessor (AttnProcessor2_0, the default, ignores
    those flags). Pass the pipeline's `stages` so that captured CUDA graphs are dropped and recaptured with the
    new attention; torch.compile notices the changed processor through its guards and recompiles.
    """
    counts = {"upcast": 0, "kept": 0}
    processor = UpcastAttnProcessor()
    for attn in _attention_modules(components.unet):
        attn.upcast_attention = True
        attn.upcast_softmax = True
        if type(attn.processor).__name__ in _REPLACEABLE:
            attn.set_processor(processor)
            counts["upcast"] += 1
        else:
            counts["kept"] += 1
    # The fast engine's fused attention bypasses processors: it has its own fp32 switch.
    for module in components.unet.modules():
        if type(module).__name__ == "FusedAttention":
            module.fp32 = True
            counts["upcast"] += 1
    if stages is not None:
        drop_captured_graphs(stages)
    return counts


def drop_captured_graphs(stages) -> int:
    """Forget every CUDA graph an engine captured (they replay the old kernels); the next call recaptures.
    Returns how many were dropped. Engines without graphs: nothing to do, 0."""
    dropped = 0
    for graphed in (getattr(stages, "info", None) or {}).get("graphs", {}).values():
        cache = getattr(graphed, "graphs", None)
        if isinstance(cache, dict):
            dropped += len(cache)
            cache.clear()
    return dropped


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
