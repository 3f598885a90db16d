"""sdaccel: fast, honestly measured Stable Diffusion inference (SD1.x, SD2.x, SDXL).

    import sdaccel
    pipe = sdaccel.load("synthetic:sd15", engine="compile")       # or a diffusers folder, a .safetensors, a repo id
    image = pipe("an astronaut riding a horse on mars", steps=30).images[0]

    sdaccel.accelerate(diffusers_pipe, engine="compile")          # speed up a diffusers pipeline you already have
"""

from __future__ import annotations

from .version import __version__

from .errors import EngineUnavailableError, ModelLoadError, SdaccelError, UsageError

__all__ = ["__version__", "accelerate", "load", "refresh_weights", "Pipeline", "SdaccelError", "UsageError",
           "ModelLoadError", "EngineUnavailableError"]


def load(model: str = "synthetic:sd15", engine="eager", dtype=None, device=None, *, arch: str | None = None,
         seed: int = 0, **engine_options):
    """Load `model` and prepare it on `engine` (a name, with its options as keyword arguments or `config=`, or an
    engine object). Returns the Pipeline inside the output guard (quality.GuardedPipeline): callable like a diffusers
    pipeline, each call's output checked once and repaired in fp32 if it came out non-finite.

    model: a diffusers folder, a single-file checkpoint, a Hugging Face repo id (from the local cache when
    offline), or `synthetic:<arch>` (exact architecture, random weights: images are noise by construction).
    """
    from .device import resolve_device, resolve_dtype
    from .models import load_components
    from .pipeline import Pipeline
    from .quality.guard import GuardedPipeline

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    # Load weights in the target dtype straight onto the device: no fp32 copy of SDXL on the host.
    components = load_components(model, arch=arch, seed=seed, device=dev, dtype=dt)
    return GuardedPipeline(Pipeline(components, engine=engine, dtype=dt, device=dev, **engine_options))


def accelerate(pipe, engine="eager", dtype=None, **engine_options):
    """Run a diffusers StableDiffusion(XL)Pipeline's UNet and VAE decoder on an sdaccel engine, in place."""
    from .diffusers_integration import accelerate as _accelerate

    return _accelerate(pipe, engine=engine, dtype=dtype, **engine_options)


def refresh_weights(pipe) -> dict:
    """After changing weights (e.g. fusing a LoRA) of an sdaccel Pipeline or an accelerated diffusers pipeline."""
    if getattr(pipe, "_sdaccel_engine", None) is None and hasattr(pipe, "engine") and hasattr(pipe, "components"):
        return pipe.refresh_weights()
    from .diffusers_integration import refresh_weights as _refresh

    return _refresh(pipe)


def __getattr__(name):
    if name == "Pipeline":
        from .pipeline import Pipeline

        return Pipeline
    raise AttributeError(name)
