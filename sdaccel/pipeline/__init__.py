"""One call of a loaded model: encode -> denoise -> decode (core.Pipeline), what it is asked (request, presets,
control, image_start), what it reports (timing), the output guard around it (guard, remedies), the SDXL base +
refiner pair (refiner), A1111's hires fix in two calls (hires), and `load` (load.py), which builds all of it from a
model reference.

The names below resolve on first use, so `sdaccel.pipeline.presets` and the other light modules import without
torch (`sdaccel --help`, `sdaccel cache`)."""

from __future__ import annotations

_EXPORTS = {"Conditioning": "core", "GenerationResult": "core", "Pipeline": "core", "initial_noise": "core",
            "latent_shape": "core", "MAX_SEED": "request", "MAX_SIDE": "request", "MAX_STEPS": "request",
            "Request": "request", "validate_request": "request"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
