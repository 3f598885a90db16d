"""Plain PyTorch: the baseline every other engine is measured against.

What it does beyond diffusers' defaults is only what costs nothing: weights cast once, channels_last UNet/VAE
(cuDNN's NHWC convolutions), SDPA attention (diffusers' default processor on torch 2), no autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.components import Components
from .base import Engine, Stages
from .options import option
from .stages import cast_stages, place_modules
from .step_cache import StepCacheOptions, attach_step_cache


@dataclass(frozen=True)
class EagerConfig(StepCacheOptions):
    channels_last: bool = option(True, "UNet and VAE in NHWC memory (cuDNN's fast convolution layout)")


class EagerEngine(Engine):
    name = "eager"
    description = "PyTorch eager: SDPA attention, channels_last, weights cast once (the baseline)"
    Config = EagerConfig

    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        self.bind(components)
        place_modules(components, dtype, device, self.config.channels_last)
        return attach_step_cache(cast_stages(components, dtype), self.config, components.unet)
