"""diffusers' ControlNet pipelines on an sdaccel engine (`sdaccel.accelerate`).

Those pipelines call their ControlNet, then their UNet with the residuals it returned. Accelerated, the ControlNet call
only records its inputs and returns a placeholder (DeferredResiduals); the UNet call that receives it runs the
engine's ControlNets-and-UNet stage (Stages.control_unet: on the fast engine the ControlNets' fused blocks and the
UNet in one CUDA graph per shape, the scales an input). Anything the stage does not compute as diffusers would
(guess mode, class labels, attention masks, a context other than the UNet's, other residuals) makes the placeholder
run diffusers' own ControlNet forward instead, and the UNet call goes to diffusers' forward: never a silent change.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import nn

log = logging.getLogger(__name__)


def pipeline_controlnets(pipe) -> list[nn.Module]:
    """The pipeline's ControlNetModel(s) the engine can run: one, or a MultiControlNetModel's. Other kinds (union,
    XS, ...) are left to diffusers (an empty list)."""
    net = getattr(pipe, "controlnet", None)
    if net is None:
        return []
    nets = list(getattr(net, "nets", [net]))
    if all(type(n).__name__ == "ControlNetModel" for n in nets):
        return nets
    log.info("%s runs in diffusers' own forward under sdaccel (ControlNetModel and MultiControlNetModel run on the "
             "engine)", type(net).__name__)
    return []


class DeferredResiduals(tuple):
    """What a ControlNet call of an accelerated pipeline returns in place of its down-block residuals: its inputs,
    to be computed with the UNet call that receives it. A tuple, as the residuals are; `resolve()` computes the
    real residuals with diffusers' forward when the engine cannot take them."""

    def __new__(cls, call: Callable[[], Any], sample: torch.Tensor, context: torch.Tensor,
                images: list[torch.Tensor], scales: list[float]):
        made = super().__new__(cls)
        made.call, made.sample, made.context, made.images, made.scales = call, sample, context, images, scales
        made._resolved = None
        return made

    def resolve(self) -> tuple:
        """(down-block residuals, mid-block residual), computed once by diffusers' ControlNet forward."""
        if self._resolved is None:
            self._resolved = tuple(self.call())
        return self._resolved


def defer_controlnet_calls(pipe) -> Callable[[], None] | None:
    """Make the pipeline's ControlNet calls return DeferredResiduals (module forward patched in place). Returns a
    function undoing it; None when the pipeline has no ControlNet the engine runs."""
    if not pipeline_controlnets(pipe):
        return None
    module = pipe.controlnet
    original = module.forward
    multi = hasattr(module, "nets")

    def forward(sample, timestep, encoder_hidden_states=None, controlnet_cond=None, conditioning_scale=1.0,
                class_labels=None, timestep_cond=None, attention_mask=None, added_cond_kwargs=None,
                cross_attention_kwargs=None, guess_mode=False, return_dict=True, **extra):
        def call():
            return original(sample, timestep, encoder_hidden_states=encoder_hidden_states,
                            controlnet_cond=controlnet_cond, conditioning_scale=conditioning_scale,
                            class_labels=class_labels, timestep_cond=timestep_cond, attention_mask=attention_mask,
                            added_cond_kwargs=added_cond_kwargs, cross_attention_kwargs=cross_attention_kwargs,
                            guess_mode=guess_mode, return_dict=return_dict, **extra)

        if guess_mode or return_dict or extra or any(x is not None for x in (class_labels, timestep_cond,
                                                                              attention_mask)) \
                or cross_attention_kwargs:
            return call()
        images = list(controlnet_cond) if multi else [controlnet_cond]
        scales = list(conditioning_scale) if isinstance(conditioning_scale, (list, tuple)) else [conditioning_scale]
        if len(scales) != len(images) or not all(torch.is_tensor(image) for image in images):
            return call()
        return DeferredResiduals(call, sample, encoder_hidden_states, images, [float(s) for s in scales]), None

    module.forward = forward

    def undo() -> None:
        module.forward = original

    return undo


def controlled_call(stage, deferred: DeferredResiduals, sample, timestep, context, embeds, time_ids):
    """The UNet output for a UNet call given DeferredResiduals, from the engine's ControlNets-and-UNet stage; None
    when that call is not the one the ControlNet's inputs were recorded for (the caller then resolves them)."""
    if stage is None or deferred.context is not context or deferred.sample.shape[0] != sample.shape[0] \
            or deferred.sample.shape[2:] != sample.shape[2:]:
        return None
    scales = torch.tensor(deferred.scales, dtype=torch.float32).to(sample.device, non_blocking=True)
    return stage(sample, timestep, context, embeds, time_ids, scales, *deferred.images)
