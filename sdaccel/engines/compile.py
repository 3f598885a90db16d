"""torch.compile over the UNet and VAE (decoder, encoder) calls (text encoders stay eager: ~1% of the time).

Modes are Inductor's: "default", "reduce-overhead" (CUDA graphs: the mode that pays on a launch-bound UNet),
"max-autotune" / "max-autotune-no-cudagraphs" (minutes of autotuning). Compiling costs ~1 minute per new shape on an
H100 for the SD1.5 UNet; Inductor's on-disk caches (kept under sdaccel's cache folder: engines/__init__.py)
shorten later starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.components import Components
from .base import Engine, Stages, restore_weight_storages, weight_storages
from .options import option
from .stages import cast_stages, place_modules
from .step_cache import StepCacheOptions, attach_step_cache

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class CompileConfig(StepCacheOptions):
    mode: str | None = option(None, "Inductor's mode; None: reduce-overhead (CUDA graphs) on a GPU, default on the "
                                    "CPU", choices=MODES)
    fullgraph: bool = option(True, "compile each stage as one graph (an unsupported op is an error, not a break)")
    channels_last: bool = option(True, "UNet and VAE in NHWC memory (cuDNN's fast convolution layout)")


class CompileEngine(Engine):
    name = "compile"
    description = "torch.compile (Inductor) of UNet and VAE; mode reduce-overhead on GPU uses CUDA graphs"
    first_call = ("compiles the UNet and VAE with torch.compile: tens of seconds to minutes, once per shape "
                  "(Inductor keeps the result on disk for the next process)")

    Config = CompileConfig

    def __init__(self, config: CompileConfig | None = None, **options):
        super().__init__(config, **options)
        self._mode_used: str | None = None
        self._weights: list = []

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        """The folder chosen for Inductor's compiled graphs (SDACCEL_CACHE's, or TORCHINDUCTOR_CACHE_DIR) must be
        writable: a setting that cannot be honoured is refused by name, not swapped for torch's temporary folder."""
        from . import inductor_cache_problem

        return inductor_cache_problem()

    def refresh_weights(self, components: Components) -> dict[str, int]:
        """Compiled graphs take the weights as inputs at their recorded addresses: copy replaced ones back."""
        return {"copied": restore_weight_storages(self._weights)}

    def options(self):
        return {**self.config.as_dict(), "mode": self._mode_used or self.config.mode or "auto"}

    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        # CUDA graphs don't exist on the CPU: "auto" means reduce-overhead on a GPU, default elsewhere.
        self.bind(components)
        mode = self.config.mode or ("reduce-overhead" if device.type == "cuda" else "default")
        self._mode_used = mode
        place_modules(components, dtype, device, self.config.channels_last)
        self._weights = weight_storages(components)
        eager = cast_stages(components, dtype)
        unet = torch.compile(eager.unet, mode=mode, fullgraph=self.config.fullgraph, dynamic=False)
        decode = torch.compile(eager.decode, mode=mode, fullgraph=self.config.fullgraph, dynamic=False)
        encode = torch.compile(eager.encode, mode=mode, fullgraph=self.config.fullgraph, dynamic=False)
        graphs = "cudagraphs" in mode or mode == "reduce-overhead"

        def unet_call(*args, **kwargs):
            if graphs:
                # Each denoising step is a new "iteration" for CUDA-graph trees: earlier outputs may be reused.
                torch.compiler.cudagraph_mark_step_begin()
            return unet(*args, **kwargs)

        def vae_call(stage):
            def call(x):
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                out = stage(x)
                return out.clone() if graphs else out  # a CUDA-graph output is overwritten by the next replay

            return call

        control_unet = None
        if eager.control_unet is not None:
            controlled = torch.compile(eager.control_unet, mode=mode, fullgraph=self.config.fullgraph, dynamic=False)

            def control_unet(*args):
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                return controlled(*args)

        def compiled_step(fn):  # a full or shallow step (step_cache.py), compiled once each
            compiled = torch.compile(fn, mode=mode, fullgraph=self.config.fullgraph, dynamic=False)

            def call(*args):
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                return compiled(*args)

            return call

        stages = Stages(text_encoders=eager.text_encoders, unet=unet_call, decode=vae_call(decode),
                        encode=vae_call(encode), control_unet=control_unet, info=dict(eager.info, mode=mode))
        # The cached steps compile the eager stages: a compiled function inside a compiled one would be two graphs.
        return attach_step_cache(stages, self.config, components.unet, compile=compiled_step, keep_copy=graphs,
                                 steps_of=eager)
