"""Stage builders every torch engine starts from: the modules cast and placed once (`place_modules`) and plain
stage callables around them (`cast_stages`) that cast inputs to the compute dtype and hand fp32 back to the
scheduler. The eager engine is these alone; compile and fast replace the stages they accelerate."""

from __future__ import annotations

import torch

from ..models.components import Components, controlled_unet_fn, text_encoder_fn, unet_fn, vae_decode_fn, vae_encode_fn
from ..models.ip_attention import cast_context
from .base import Stages


def vae_dtype_for(components: Components, dtype: torch.dtype, vae_dtype: torch.dtype | None = None) -> torch.dtype:
    """The VAE's dtype: `vae_dtype` when given; otherwise the model's. SDXL's VAE overflows in fp16 (its config
    says force_upcast): it decodes in fp32 there, as diffusers does."""
    if vae_dtype is not None:
        return vae_dtype
    if dtype == torch.float16 and components.spec.vae_force_upcast:
        return torch.float32
    return dtype


def place_modules(components: Components, dtype: torch.dtype, device: torch.device, channels_last: bool = True,
                  vae_dtype: torch.dtype | None = None):
    """Cast and move every module once; convolutional ones to channels_last on request."""
    # nn.Module.to, not diffusers' override: the latter warns about fp32-pinned modules these models don't have.
    to = torch.nn.Module.to
    for enc in components.text_encoders:
        to(enc, device=device, dtype=dtype)
    for net in (components.unet, *components.controlnets):
        to(net, device=device, dtype=dtype)
    if components.ip_adapters is not None:  # vision encoders and projections: run once per call, in `dtype`
        to(components.ip_adapters, device=device, dtype=dtype)
    to(components.vae, device=device, dtype=vae_dtype_for(components, dtype, vae_dtype))
    if channels_last:
        for module in (components.unet, components.vae, *components.controlnets):
            to(module, memory_format=torch.channels_last)


def cast_stages(components: Components, dtype: torch.dtype, vae_dtype: torch.dtype | None = None) -> Stages:
    """Stage callables that cast inputs to the compute dtype and hand fp32 back to the scheduler."""
    vae_dtype = vae_dtype_for(components, dtype, vae_dtype)
    denoise = unet_fn(components.unet)
    decode_raw = vae_decode_fn(components.vae)

    def unet(sample, timestep, context, text_embeds=None, time_ids=None):
        if text_embeds is not None:
            text_embeds, time_ids = text_embeds.to(dtype), time_ids.to(dtype)
        return denoise(sample.to(dtype), timestep, cast_context(context, dtype), text_embeds, time_ids).float()

    def decode(latents):
        return decode_raw(latents.to(vae_dtype)).float()

    encode_raw = vae_encode_fn(components.vae)

    def encode(image):
        return encode_raw(image.to(vae_dtype)).float()

    control_unet = None
    if components.controlnets:
        controlled = controlled_unet_fn(components.unet, components.controlnets)

        def control_unet(sample, timestep, context, text_embeds, time_ids, scales, *images):
            if text_embeds is not None:
                text_embeds, time_ids = text_embeds.to(dtype), time_ids.to(dtype)
            return controlled(sample.to(dtype), timestep, cast_context(context, dtype), text_embeds, time_ids,
                              scales.to(dtype), *(image.to(dtype) for image in images)).float()

    encoders = [text_encoder_fn(enc, te.penultimate)
                for enc, te in zip(components.text_encoders, components.spec.text_encoders)]
    return Stages(text_encoders=encoders, unet=unet, decode=decode, encode=encode, control_unet=control_unet,
                  info={"vae_dtype": str(vae_dtype)})
