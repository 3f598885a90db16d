"""The one small interface every engine implements.

An engine receives a model's modules (Components) and returns Stages: plain callables for the text encoder(s), the
UNet, the VAE decoder and encoder, ready for a dtype and device. The pipeline only ever calls Stages, so a new engine (fused
kernels, ONNX Runtime, ...) plugs in without the pipeline changing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from ..errors import UsageError
from ..models.components import Components
from .options import EngineConfig

# (ids[, clip_skip]) -> (hidden states, pooled); clip_skip (diffusers' meaning, default 0) selects an earlier layer
TextStage = Callable[..., tuple[torch.Tensor, torch.Tensor]]
# (latents, timestep, context, text_embeds, time_ids) -> model output; inputs in any float dtype, output fp32.
UNetStage = Callable[..., torch.Tensor]
# One image's denoising loop: (step index, latents) -> model output, as UNetStage's for that step's timestep.
UNetStep = Callable[[int, torch.Tensor], torch.Tensor]
DecodeStage = Callable[[torch.Tensor], torch.Tensor]  # scaled latents (fp32) -> image in [-1, 1] (fp32)
# image in [-1, 1] (fp32) -> the VAE latent distribution's moments (mean, log variance), fp32
EncodeStage = Callable[[torch.Tensor], torch.Tensor]
# (latents, timestep, context, text_embeds, time_ids, scales, *control_images) -> model output: the UNet with every
# ControlNet's residuals added, scales (one per ControlNet) a device tensor; output fp32.
ControlledUNetStage = Callable[..., torch.Tensor]


@dataclass
class Stages:
    text_encoders: list[TextStage]
    unet: UNetStage
    decode: DecodeStage
    info: dict[str, Any] = field(default_factory=dict)  # what the engine did, for reports (modes, fallbacks)
    # The VAE encoder, for an init image (img2img, inpainting); None: this engine cannot encode images.
    encode: EncodeStage | None = None
    # True: with classifier-free guidance the UNet stage takes the latents once, B samples beside the 2B context
    # (uncond first), and returns the 2B predictions, computing what the two halves share once (the fast engine's
    # shared CFG prefix). False: the pipeline passes the latents twice, torch.cat([latents, latents]).
    unet_takes_cfg_once: bool = False
    # Optional: (timesteps, context, text_embeds, time_ids) -> UNetStep for one image's loop, from an engine that
    # computes what every step shares once before it (the fast engine's loop_plan.py). None: each step calls unet.
    plan_loop: Callable[..., UNetStep] | None = None
    # The UNet steered by the model's ControlNets (Components.controlnets), one call per step; None without them.
    control_unet: ControlledUNetStage | None = None
    # As unet_takes_cfg_once, for control_unet: True, it takes the latents and control inputs once beside the 2B
    # context; False, the pipeline doubles them for guidance.
    control_takes_cfg_once: bool = False
    # Optional: (*control_images) -> each ControlNet's conditioning embedding (control_embedding_fn), which the
    # pipeline computes once per image and control_unet then takes in place of the images. None: control_unet
    # takes the images and embeds them at every step, as diffusers' pipelines do.
    embed_controls: Callable[..., tuple[torch.Tensor, ...]] | None = None
    # Optional: step caching (step_cache.CachedSteps): the loop's UNet calls on a schedule of full and shallow
    # steps. None: every step is exact.
    step_cache: Any = None

    def unet_steps(self, timesteps: torch.Tensor, context: torch.Tensor, text_embeds: torch.Tensor | None = None,
                   time_ids: torch.Tensor | None = None) -> UNetStep:
        """The UNet calls of one image's denoising loop over `timesteps` (on the device), with one conditioning."""
        if self.step_cache is not None:
            return self.step_cache.steps(timesteps, context, text_embeds, time_ids)
        if self.plan_loop is not None:
            return self.plan_loop(timesteps, context, text_embeds, time_ids)
        return lambda i, sample: self.unet(sample, timesteps[i], context, text_embeds, time_ids)

    def controlled_step(self, i: int, *args) -> torch.Tensor:
        """Step i of the loop unet_steps began, steered by the ControlNets (control_unet's arguments)."""
        if self.step_cache is not None:
            return self.step_cache.control(i, *args)
        return self.control_unet(*args)


def weight_storages(components: Components) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Every parameter with the tensor it holds now: the memory that stages (and graphs captured from them) read."""
    return [(p, p.data) for m in components.modules() for p in m.parameters()]


def restore_weight_storages(pairs: list[tuple[torch.nn.Parameter, torch.Tensor]]) -> int:
    """Weights replaced since `weight_storages` (`param.data = merged`, as a LoRA fuse does) are copied into the
    recorded memory and the parameter points at it again: captured graphs see the new values, no recapture.
    Returns how many were copied."""
    copied = 0
    with torch.no_grad():
        for param, storage in pairs:
            if param.data.data_ptr() == storage.data_ptr():
                continue  # unchanged, or changed in place: already visible
            if param.data.shape != storage.shape:
                raise UsageError("a weight changed shape after the engine was prepared: load a new pipeline")
            storage.copy_(param.data)
            param.data = storage
            copied += 1
    return copied


class Engine(ABC):
    """One model on one engine. Subclasses set `name`, `description` and `Config` (their options: options.py) and
    implement `prepare`; `unavailable_reason` says why one can't run on a device.

    An engine object is made for one model: `prepare` binds it to that model's components, and what it decides while
    it runs (kernel picks, captured graphs, caches) lives on the object, never in module globals. The remedies the
    output guard applies go through `upcast_attention` and `drop_graphs`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # What the first call at a new shape does beyond computing, said once before it so a long first call is not
    # mistaken for a hang ("" when it only computes).
    first_call: ClassVar[str] = ""
    # The same for `prepare` on a machine whose caches do not have this model yet.
    first_start: ClassVar[str] = ""
    Config: ClassVar[type[EngineConfig]] = EngineConfig
    # Whether the engine runs a model loaded from an ONNX pipeline folder (graphs, no torch modules).
    runs_onnx_folders: ClassVar[bool] = False
    # Whether the stages compute with the torch modules' weights (so refresh_weights can make them see new ones).
    reads_module_weights: ClassVar[bool] = True
    # Whether the engine builds Stages.control_unet for a model with ControlNets.
    runs_controlnets: ClassVar[bool] = True

    def __init__(self, config: EngineConfig | None = None, **options: Any):
        self.config = self.Config.from_options(options, base=config, what=f"engine {self.name!r}")
        self.components: Components | None = None  # set by prepare: the model this engine serves

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        return None

    @classmethod
    def dtype_unsupported_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why this engine cannot compute in `dtype` on `device` (None: it can)."""
        return None

    @abstractmethod
    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        """Place/transform the modules and return the stage callables for this dtype and device. Subclasses call
        `self.bind(components)` first."""

    def bind(self, components: Components) -> None:
        """Make this engine the one serving `components`; an engine prepared for another model is refused."""
        if self.components is not None and self.components is not components:
            raise UsageError(f"this {self.name} engine already serves another model: make one engine per model")
        if getattr(components, "onnx_folder", None) is not None and not self.runs_onnx_folders:
            raise UsageError(f"{components.source} is an ONNX pipeline folder (no torch weights for the {self.name} "
                             f"engine): use --engine onnxruntime (engine='onnxruntime')")
        if components.controlnets and not self.runs_controlnets:
            raise UsageError(f"the {self.name} engine does not run ControlNets: use the fast, compile or eager engine")
        self.components = components

    def refresh_weights(self, components: Components) -> dict[str, int]:
        """Make prepared stages use weights the caller changed after prepare() (a LoRA fused in or out, a swapped
        fine-tune of the same architecture). Engines that read the modules' weights at every call need nothing:
        this default does nothing. Returns what was updated, by kind."""
        return {}

    def upcast_attention(self) -> int:
        """From now on compute the UNet's attention in fp32 (scores and softmax), for a model whose attention
        overflows fp16; returns how many attention layers were switched (0: this engine cannot, and nothing changed).
        This default installs an fp32 attention processor in every diffusers Attention of the UNet, which engines
        that run the modules' own forward (eager, torch.compile, which recompiles on the change) follow. Call
        drop_graphs() after it."""
        if self.components is None:
            return 0
        from .upcast_attention import upcast_diffusers_attention

        return upcast_diffusers_attention(self.components.unet)

    def drop_graphs(self) -> int:
        """Forget every captured CUDA graph (they replay the kernels chosen before a change); the next call
        captures again. Returns how many were dropped; engines without graphs of their own drop none."""
        return 0

    def options(self) -> dict[str, Any]:
        """The engine's settings, recorded in benchmark rows and PNG metadata."""
        return self.config.as_dict()

    def report(self) -> dict[str, Any]:
        """What the engine chose while it ran (e.g. a kernel per shape), for benchmark reports; read after the
        runs, since choices are made on first use."""
        return {}
