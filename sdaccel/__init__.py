"""sdaccel: fast, honestly measured Stable Diffusion inference (SD1.x, SD2.x, SDXL).

    import sdaccel
    pipe = sdaccel.load("synthetic:sd15", engine="compile")       # or a diffusers folder, a .safetensors, a repo id
    image = pipe("an astronaut riding a horse on mars", steps=30).images[0]

    sdaccel.accelerate(diffusers_pipe, engine="compile")          # speed up a diffusers pipeline you already have
"""

from __future__ import annotations

from .errors import EngineUnavailableError, ModelLoadError, SdaccelError, UsageError
from .version import __version__

__all__ = ["__version__", "accelerate", "load", "refresh_weights", "Pipeline", "SdaccelError", "UsageError",
           "ModelLoadError", "EngineUnavailableError"]


def accelerate(pipe, engine="eager", dtype=None, **engine_options):
    """Run a diffusers pipeline's UNet and VAE (decoder and encoder) on an sdaccel engine, in place; returns `pipe`.

    Serves StableDiffusion(XL)Pipeline, StableDiffusion(XL)Img2ImgPipeline and StableDiffusion(XL)InpaintPipeline
    (9-channel inpainting UNets and plain ones; the SDXL refiner with its single text encoder). The pipeline keeps
    its scheduler, callbacks and generator: the encoder hands back the latent distribution, which the pipeline
    samples itself. While accelerated the VAE keeps the engine's dtype (diffusers' casts of an SDXL VAE around
    encode and decode are ignored: the engine computes it in the precision it chose for it)."""
    from .diffusers_adapter.accelerate import accelerate as _accelerate

    return _accelerate(pipe, engine=engine, dtype=dtype, **engine_options)


def refresh_weights(pipe) -> dict:
    """After changing weights (e.g. fusing a LoRA) of an sdaccel Pipeline or an accelerated diffusers pipeline."""
    if getattr(pipe, "_sdaccel_engine", None) is None and hasattr(pipe, "engine") and hasattr(pipe, "components"):
        return pipe.refresh_weights()
    from .diffusers_adapter.accelerate import refresh_weights as _refresh

    return _refresh(pipe)


def __getattr__(name):
    # Imported on first use: `import sdaccel` (and `sdaccel --help`) stays free of torch.
    if name == "load":
        from .pipeline.load import load

        return load
    if name == "Pipeline":
        from .pipeline.core import Pipeline

        return Pipeline
    raise AttributeError(f"module 'sdaccel' has no attribute {name!r}")
