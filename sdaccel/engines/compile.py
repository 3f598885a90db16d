"""torch.compile over the UNet and VAE-decoder calls (text encoders stay eager: ~1% of the time).

Modes are Inductor's: "default", "reduce-overhead" (CUDA graphs: the mode that pays on a launch-bound UNet),
"max-autotune" / "max-autotune-no-cudagraphs" (minutes of autotuning). Compiling costs ~1 minute per new shape on an
H100 for the SD1.5 UNet; Inductor's on-disk caches (kept under sdaccel's cache folder) shorten later starts.
"""

from __future__ import annotations

import os

import torch

from ..errors import UsageError
from ..models.components import Components
from .base import Engine, Stages, restore_weight_storages, weight_storages
from .eager import cast_stages, place_modules

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def use_persistent_cache() -> None:
    """Point Inductor's caches at a stable folder so a second process start reuses compiled kernels.

    Called when sdaccel.engines is imported: Inductor reads (and, on first use, sets) TORCHINDUCTOR_CACHE_DIR
    early, so setting it later in prepare() would be too late."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root(), "inductor")


def cache_root() -> str:
    return os.environ.get("SDACCEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sdaccel")


class CompileEngine(Engine):
    name = "compile"
    description = "torch.compile (Inductor) of UNet and VAE decoder; mode reduce-overhead on GPU uses CUDA graphs"

    def __init__(self, mode: str | None = None, fullgraph: bool = True, channels_last: bool = True):
        if mode is not None and mode not in MODES:
            raise UsageError(f"unknown compile mode {mode!r}; use one of {', '.join(MODES)}")
        self.mode = mode
        self.fullgraph = fullgraph
        self.channels_last = channels_last
        self._mode_used: str | None = None
        self._weights: list = []

    def refresh_weights(self, components: Components) -> dict[str, int]:
        """Compiled graphs take the weights as inputs at their recorded addresses: copy replaced ones back."""
        return {"copied": restore_weight_storages(self._weights)}

    def options(self):
        return {"mode": self._mode_used or self.mode or "auto", "fullgraph": self.fullgraph}

    def prepare(self, components: Components, dtype: torch.dtype, device: torch.device) -> Stages:
        # CUDA graphs don't exist on the CPU: "auto" means reduce-overhead on a GPU, default elsewhere.
        mode = self.mode or ("reduce-overhead" if device.type == "cuda" else "default")
        self._mode_used = mode
        place_modules(components, dtype, device, self.channels_last)
        self._weights = weight_storages(components)
        eager = cast_stages(components, dtype)
        unet = torch.compile(eager.unet, mode=mode, fullgraph=self.fullgraph, dynamic=False)
        decode = torch.compile(eager.decode, mode=mode, fullgraph=self.fullgraph, dynamic=False)
        graphs = "cudagraphs" in mode or mode == "reduce-overhead"

        def unet_call(*args, **kwargs):
            if graphs:
                # Each denoising step is a new "iteration" for CUDA-graph trees: earlier outputs may be reused.
                torch.compiler.cudagraph_mark_step_begin()
            return unet(*args, **kwargs)

        def decode_call(latents):
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            # Clone: a CUDA-graph output buffer is overwritten by the next replay.
            out = decode(latents)
            return out.clone() if graphs else out

        return Stages(text_encoders=eager.text_encoders, unet=unet_call, decode=decode_call,
                      info=dict(eager.info, mode=mode))
