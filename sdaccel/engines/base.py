"""The one small interface every engine implements.

An engine receives a model's modules (Components) and returns Stages: plain callables for the text encoder(s), the
UNet and the VAE decoder, ready for a dtype and device. The pipeline only ever calls Stages, so a new engine (fused
kernels, ONNX Runtime, ...) plugs in without the pipeline changing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from ..models.components import Components

TextStage = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # ids -> (hidden states, pooled)
# (latents, timestep, context, text_embeds, time_ids) -> model output; inputs in any float dtype, output fp32.
UNetStage = Callable[..., torch.Tensor]
DecodeStage = Callable[[torch.Tensor], torch.Tensor]  # scaled latents (fp32) -> image in [-1, 1] (fp32)


@dataclass
class Stages:
    text_encoders: list[TextStage]
    unet: UNetStage
    decode: DecodeStage
    info: dict[str, Any] = field(default_factory=dict)  # what the engine did, for reports (modes, fallbacks)


class Engine(ABC):
    """Subclasses set `name`/`description`, and implement `prepare`; `unavailable_reason` says why one can't run."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return None

    @classmethod
    def dtype_unsupported_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why this engine cannot compute in `dtype` on `device` (None: it can)."""
        return None

    @abstractmethod
    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        """Place/transform the modules and return the stage callables for this dtype and device."""

    def options(self) -> dict[str, Any]:
        """The engine's settings, recorded in benchmark rows and PNG metadata."""
        return {}
