"""IP-Adapters of an accelerated diffusers pipeline (`pipe.load_ip_adapter(...)` before `sdaccel.accelerate`).

diffusers' loader leaves the adapters' image projection on the UNet (encoder_hid_proj, which the UNet's forward
applies to `added_cond_kwargs["image_embeds"]` at every step) and IPAdapterAttnProcessor2_0 in each
cross-attention, its scales Python floats. Under sdaccel the cross-attentions get sdaccel's processor (the same
K/V layers; the scales one device tensor: models/ip_attention.py), which the fast engine fuses, and the UNet's own
projection step is switched off: the accelerated forward projects the pipeline's image embeds and hands the UNet
diffusers' (text, [image tokens]) context, so every engine, and the fallback to diffusers' forward, computes the
image prompt. `pipe.set_ip_adapter_scale` writes the device tensor (one number, or one per adapter); loading or
unloading adapters after accelerate is refused: the engine has fused the UNet without them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UsageError
from ..models.ip_adapter import install_ip_processors
from ..models.ip_attention import IPScales
from ..pipeline.image_prompts import check_scales


class PipelineImagePrompts:
    """The accelerated UNet's image-prompt projection and scales (None when the pipeline has no IP-Adapter)."""

    def __init__(self, projection: torch.nn.Module | None, scales: IPScales | None):
        self.projection, self.scales = projection, scales

    def context(self, encoder_hidden_states, added_cond_kwargs: dict | None) -> tuple[Any, dict | None]:
        """(encoder_hidden_states, added_cond_kwargs) with the image embeds, if any, projected into the context."""
        if not added_cond_kwargs or added_cond_kwargs.get("image_embeds") is None:
            return encoder_hidden_states, added_cond_kwargs
        if self.projection is None:
            raise UsageError("image_embeds reached a UNet without IP-Adapters")
        rest = {k: v for k, v in added_cond_kwargs.items() if k != "image_embeds"}
        tokens = [t.flatten(1, 2) if t.dim() == 4 else t for t in self.projection(added_cond_kwargs["image_embeds"])]
        return (encoder_hidden_states, tokens), rest or None


def adopt_ip_adapters(pipe) -> PipelineImagePrompts:
    """Take over the pipeline's loaded IP-Adapters (if any) as the module doc says; refuse later (un)loading."""
    from diffusers.models.attention_processor import IPAdapterAttnProcessor2_0

    def refused(*args, **kwargs):
        raise UsageError("load or unload IP-Adapters before sdaccel.accelerate(pipe): the engine has prepared the "
                         "UNet without them")

    for name in ("load_ip_adapter", "unload_ip_adapter"):
        if hasattr(pipe, name):
            setattr(pipe, name, refused)
    unet = pipe.unet
    if getattr(unet, "encoder_hid_proj", None) is None or unet.config.encoder_hid_dim_type != "ip_image_proj":
        return PipelineImagePrompts(None, None)
    processors = [p for p in unet.attn_processors.values() if isinstance(p, IPAdapterAttnProcessor2_0)]
    count = len(unet.encoder_hid_proj.image_projection_layers)
    first = processors[0].scale
    if any(p.scale != first for p in processors) or any(isinstance(s, list) for s in first):
        raise UsageError("per-block IP-Adapter scales (InstantStyle) are not supported under sdaccel: set one "
                         "scale per adapter before accelerate")
    scales = torch.nn.Module.to(IPScales(count), device=unet.device, dtype=unet.dtype)
    scales.set(first)
    install_ip_processors(unet, scales)
    unet.config.encoder_hid_dim_type = None  # the accelerated forward projects the embeds (module doc)

    def set_ip_adapter_scale(scale):
        scales.set(check_scales(scale, count))

    pipe.set_ip_adapter_scale = set_ip_adapter_scale
    pipe._sdaccel_ip_scales = scales  # owned by the pipeline: every processor reads it
    return PipelineImagePrompts(unet.encoder_hid_proj, scales)
