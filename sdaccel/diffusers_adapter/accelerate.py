"""`sdaccel.accelerate(pipe)`: one line to run a user's diffusers pipeline on an sdaccel engine.

The pipeline object stays theirs (scheduler, callbacks, prompt handling); only `pipe.unet.forward`,
`pipe.vae.decode` and `pipe.vae.encode` are replaced by the engine's stages. Calls the engine can't serve (ControlNet
residuals, cross-attention kwargs other than a LoRA scale, a tiled encode or decode) go to the original methods, so
behaviour never silently changes. diffusers' ControlNet pipelines (one ControlNetModel or a MultiControlNetModel) run
their ControlNets and UNet on the engine (controlnet.py). diffusers' LoRA calls on the pipeline (load_lora_weights,
set_adapters, fuse_lora, a call's cross_attention_kwargs={"scale": s}, ...) reach the engine: they merge into its
weights in place (lora.py, on models/lora.py). IP-Adapters loaded before accelerate run on the engine, their scale
a tensor it reads (ip_adapter.py).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..device import resolve_dtype
from ..engines import get_engine
from ..errors import UsageError
from ..models.components import Components
from ..models.configs import detect_arch, spec_from_modules
from ..models.controlnet import mismatch
from ..models.registry import get_spec
from .controlnet import DeferredResiduals, controlled_call, defer_controlnet_calls, pipeline_controlnets
from .ip_adapter import adopt_ip_adapters
from .lora import install_lora_methods

log = logging.getLogger(__name__)

_PASSTHROUGH_KWARGS = ("cross_attention_kwargs", "down_block_additional_residuals", "mid_block_additional_residual",
                       "down_intrablock_additional_residuals", "encoder_attention_mask", "attention_mask",
                       "class_labels", "timestep_cond")
_SERVED = ("StableDiffusion(XL)Pipeline, StableDiffusion(XL)Img2ImgPipeline and StableDiffusion(XL)InpaintPipeline "
           "(the SDXL refiner included), and their ControlNet pipelines")


def components_from_pipeline(pipe) -> Components:
    """The pipeline's own modules as Components, with the registry entry that describes them."""
    missing = [name for name in ("unet", "vae") if getattr(pipe, name, None) is None]
    encoders = [enc for enc in (getattr(pipe, "text_encoder", None), getattr(pipe, "text_encoder_2", None))
                if enc is not None]
    if not encoders:
        missing.append("text_encoder")
    if missing:
        raise UsageError(f"{type(pipe).__name__} lacks {', '.join(missing)}: sdaccel accelerates {_SERVED}")
    sched_cfg = dict(pipe.scheduler.config) if getattr(pipe, "scheduler", None) is not None else {}
    base = get_spec(detect_arch(dict(pipe.unet.config), sched_cfg))  # inpainting and refiner UNets included
    spec = spec_from_modules(base, pipe.unet, pipe.vae, encoders, sched_cfg)
    controlnets = pipeline_controlnets(pipe)
    for net in controlnets:
        problem = mismatch(net.config, spec)
        if problem:
            raise UsageError(f"{type(pipe).__name__}: its ControlNet does not fit its UNet: {problem}")
    return Components(spec=spec, unet=pipe.unet, vae=pipe.vae, text_encoders=encoders, tokenizers=[],
                      source=type(pipe).__name__, controlnets=controlnets)


def _pin_dtype(module: torch.nn.Module) -> None:
    """Make `module.to(dtype)` keep the module's dtype (a device or memory-format move still goes through).

    diffusers' SDXL pipelines cast a force_upcast VAE to fp32 around each encode and decode and back afterwards
    (`self.vae.to(dtype)`). The engine already runs that VAE in the precision it chose for it, and a cast would swap
    the weights its stages hold (fused copies, tensors captured in CUDA graphs) for new ones."""
    original_to = module.to

    def to(*args: Any, **kwargs: Any):
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and dtype != module.dtype:
            log.debug("%s stays %s under sdaccel (a cast to %s is ignored)", type(module).__name__, module.dtype,
                      dtype)
        moves = {k: v for k, v in (("device", device), ("memory_format", memory_format)) if v is not None}
        if not moves:
            return module
        return original_to(non_blocking=non_blocking, **moves)

    module.to = to


def accelerate(pipe, engine="eager", dtype=None, **engine_options: Any):
    """Patch `pipe` in place and return it. dtype defaults to the UNet's current dtype."""
    from diffusers.models.autoencoders.vae import DecoderOutput, DiagonalGaussianDistribution
    from diffusers.models.modeling_outputs import AutoencoderKLOutput
    from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

    if getattr(pipe, "_sdaccel_engine", None) is not None:
        raise UsageError("this pipeline is already accelerated by sdaccel; build a fresh one to change engines")
    components = components_from_pipeline(pipe)
    device = pipe.unet.device
    dt = resolve_dtype(dtype or pipe.unet.dtype, device)
    eng = get_engine(engine, device, **engine_options)
    if getattr(eng.config, "cache", "off") != "off":
        # diffusers' loop calls the UNet without saying which step of how many it is: a fixed schedule of full
        # and shallow steps needs sdaccel's own loop.
        raise UsageError("step caching (cache=deepcache) runs in sdaccel's own pipeline (sdaccel.load), not under "
                         "accelerate(): diffusers' loop does not tell the engine which step it is on")
    if getattr(eng.config, "vae_dtype", None) == "auto" and components.spec.vae_force_upcast:
        # diffusers' SDXL pipelines run a force_upcast VAE in fp32 (encode and decode): "auto" here means what
        # those pipelines want, fp32, rather than the fast engine's scaled fp16 decode (engines/fast/vae_scaling.py).
        eng = type(eng)(eng.config.replace(vae_dtype="fp32"))
    loras = install_lora_methods(pipe, eng, components)  # before prepare: LoRA layers go by their unfused names
    image_prompts = adopt_ip_adapters(pipe)  # before prepare: the fast engine fuses the IP cross-attentions
    stages = eng.prepare(components, dt, device)
    unet, vae = pipe.unet, pipe.vae
    original_forward, original_decode, original_encode = unet.forward, vae.decode, vae.encode

    def forward(sample, timestep, encoder_hidden_states, *args, added_cond_kwargs=None, return_dict=True, **kwargs):
        kwargs = loras.take_call_scale(kwargs)  # a LoRA scale is merged into the weights, not a reason to fall back
        encoder_hidden_states, added_cond_kwargs = image_prompts.context(encoder_hidden_states, added_cond_kwargs)
        deferred = kwargs.get("down_block_additional_residuals")
        if isinstance(deferred, DeferredResiduals):
            if not args and kwargs.get("mid_block_additional_residual") is None and not any(
                    kwargs.get(k) is not None for k in _PASSTHROUGH_KWARGS if "residual" not in k):
                embeds = time_ids = None
                if added_cond_kwargs:
                    embeds, time_ids = added_cond_kwargs["text_embeds"], added_cond_kwargs["time_ids"]
                if not torch.is_tensor(timestep):
                    timestep = torch.tensor(timestep, device=sample.device)
                out = controlled_call(stages.control_unet, deferred, sample, timestep, encoder_hidden_states,
                                      embeds, time_ids)
                if out is not None:
                    out = out.to(sample.dtype)
                    return UNet2DConditionOutput(sample=out) if return_dict else (out,)
            # Not the call the ControlNet's inputs were recorded for: its residuals, computed by diffusers.
            kwargs["down_block_additional_residuals"], kwargs["mid_block_additional_residual"] = deferred.resolve()
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
        if getattr(vae, "use_tiling", False) and max(z.shape[-2:]) > vae.tile_latent_min_size:
            # vae.enable_tiling() asks for tiles (memory): diffusers' own tiled decode, in the engine's VAE dtype.
            out = original_decode(z.to(vae.dtype), return_dict=False)[0].to(z.dtype)
        else:
            out = stages.decode(z).to(z.dtype)
        return DecoderOutput(sample=out) if return_dict else (out,)

    def encode(x, return_dict=True):
        tiled = getattr(vae, "use_tiling", False) and max(x.shape[-2:]) > vae.tile_sample_min_size
        if stages.encode is None or tiled:
            # The VAE keeps the engine's dtype (_pin_dtype): the original encode takes its input in that dtype.
            moments = original_encode(x.to(vae.dtype), return_dict=False)[0].parameters
        else:
            moments = stages.encode(x)
        # In the input's dtype, as the original's (diffusers feeds the VAE its own dtype): the pipeline then draws
        # the latent sample from these moments, with its own generator, in that dtype.
        dist = DiagonalGaussianDistribution(moments.to(x.dtype))
        return AutoencoderKLOutput(latent_dist=dist) if return_dict else (dist,)

    defer_controlnet_calls(pipe)
    unet.forward = forward
    vae.decode = decode
    vae.encode = encode
    _pin_dtype(vae)
    pipe._sdaccel_engine = eng
    pipe._sdaccel_components = components
    pipe._sdaccel_originals = (original_forward, original_decode, original_encode)
    return pipe


def refresh_weights(pipe) -> dict[str, int]:
    """After pipe.fuse_lora() (or any weight change) on an accelerated diffusers pipeline: let the engine see it."""
    engine = getattr(pipe, "_sdaccel_engine", None)
    if engine is None:
        raise UsageError("this pipeline was not accelerated by sdaccel.accelerate()")
    return engine.refresh_weights(pipe._sdaccel_components)
