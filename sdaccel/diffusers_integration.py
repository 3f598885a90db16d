"""`sdaccel.accelerate(pipe)`: one line to run a user's diffusers pipeline on an sdaccel engine.

The pipeline object stays theirs (scheduler, callbacks, prompt handling); only `pipe.unet.forward` and
`pipe.vae.decode` are replaced by the engine's stages. Calls the engine can't serve (ControlNet residuals,
cross-attention kwargs such as a LoRA scale) go to the original forward, so behaviour never silently changes.
"""

from __future__ import annotations

from typing import Any

import torch

from .device import resolve_dtype
from .engines import get_engine
from .errors import UsageError
from .models.components import Components
from .models.loading import _spec_from_modules, detect_arch
from .models.registry import get_spec

_PASSTHROUGH_KWARGS = ("cross_attention_kwargs", "down_block_additional_residuals", "mid_block_additional_residual",
                       "down_intrablock_additional_residuals", "encoder_attention_mask", "attention_mask",
                       "class_labels", "timestep_cond")


def components_from_pipeline(pipe) -> Components:
    missing = [name for name in ("unet", "vae", "text_encoder") if getattr(pipe, name, None) is None]
    if missing:
        raise UsageError(f"{type(pipe).__name__} lacks {', '.join(missing)}: sdaccel accelerates "
                         "StableDiffusionPipeline and StableDiffusionXLPipeline")
    encoders = [pipe.text_encoder] + ([pipe.text_encoder_2] if getattr(pipe, "text_encoder_2", None) else [])
    sched_cfg = dict(pipe.scheduler.config) if getattr(pipe, "scheduler", None) is not None else {}
    base = get_spec(detect_arch(dict(pipe.unet.config), sched_cfg))
    spec = _spec_from_modules(base, pipe.unet, pipe.vae, encoders, sched_cfg)
    return Components(spec=spec, unet=pipe.unet, vae=pipe.vae, text_encoders=encoders, tokenizers=[],
                      source=type(pipe).__name__)


def accelerate(pipe, engine="eager", dtype=None, **engine_options: Any):
    """Patch `pipe` in place and return it. dtype defaults to the UNet's current dtype."""
    from diffusers.models.autoencoders.vae import DecoderOutput
    from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

    if getattr(pipe, "_sdaccel_engine", None) is not None:
        raise UsageError("this pipeline is already accelerated by sdaccel; build a fresh one to change engines")
    components = components_from_pipeline(pipe)
    device = pipe.unet.device
    dt = resolve_dtype(dtype or pipe.unet.dtype, device)
    eng = get_engine(engine, device, **engine_options)
    if getattr(eng.config, "vae_dtype", None) == "auto" and components.spec.vae_force_upcast:
        # diffusers' SDXL pipeline casts a force_upcast VAE it finds in fp16 to fp32 around every decode: under it
        # the fast engine's scaled fp16 decode (engines/fast/vae_scaling.py) would be cast back and forth at each
        # call. "auto" here means what that pipeline wants: fp32.
        eng = type(eng)(eng.config.replace(vae_dtype="fp32"))
    stages = eng.prepare(components, dt, device)
    unet, vae = pipe.unet, pipe.vae
    original_forward, original_decode = unet.forward, vae.decode

    def forward(sample, timestep, encoder_hidden_states, *args, added_cond_kwargs=None, return_dict=True, **kwargs):
        if args or any(kwargs.get(k) is not None for k in _PASSTHROUGH_KWARGS):
            return original_forward(sample, timestep, encoder_hidden_states, *args,
                                    added_cond_kwargs=added_cond_kwargs, return_dict=return_dict, **kwargs)
        if not torch.is_tensor(timestep):
            timestep = torch.tensor(timestep, device=sample.device)
        embeds = time_ids = None
        if added_cond_kwargs:
            embeds, time_ids = added_cond_kwargs["text_embeds"], added_cond_kwargs["time_ids"]
        out = stages.unet(sample, timestep, encoder_hidden_states, embeds, time_ids).to(sample.dtype)
        return UNet2DConditionOutput(sample=out) if return_dict else (out,)

    def decode(z, return_dict=True, generator=None):
        out = stages.decode(z).to(z.dtype)
        return DecoderOutput(sample=out) if return_dict else (out,)

    unet.forward = forward
    vae.decode = decode
    pipe._sdaccel_engine = eng
    pipe._sdaccel_components = components
    pipe._sdaccel_originals = (original_forward, original_decode)
    return pipe


def refresh_weights(pipe) -> dict[str, int]:
    """After pipe.fuse_lora() (or any weight change) on an accelerated diffusers pipeline: let the engine see it."""
    engine = getattr(pipe, "_sdaccel_engine", None)
    if engine is None:
        raise UsageError("this pipeline was not accelerated by sdaccel.accelerate()")
    return engine.refresh_weights(pipe._sdaccel_components)
