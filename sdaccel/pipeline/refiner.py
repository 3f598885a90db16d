"""SDXL base + refiner ("ensemble of expert denoisers"): the base model denoises the first `refiner_start` of the
schedule and hands its latents over, not decoded; the refiner denoises the rest and decodes. Both models stay
loaded, each on its own engine object of the same kind, so a call swaps nothing.

As diffusers' StableDiffusionXLPipeline(denoising_end=f, output_type="latent") followed by
StableDiffusionXLImg2ImgPipeline(image=latents, denoising_start=f): the same schedule of `steps`, cut at f.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .request import validate_fraction
from .stopping import decode_stopped, stopped_at
from .timing import StageTimings

REFINER_START = 0.8  # the handoff diffusers' documentation uses for SDXL base + refiner


class BaseAndRefiner:
    """Two pipelines (each a Pipeline, or the output guard around one, as sdaccel.load returns them) run as one:
    `pair(prompt, ...)` returns the refiner's GenerationResult, with the base's stages in its timings
    (`denoise` is the base's loop, `refine` the refiner's, `text` both models' text encoding)."""

    def __init__(self, base, refiner, refiner_start: float = REFINER_START):
        for role, pipe, wanted in (("base", base, False), ("refiner", refiner, True)):
            if not pipe.spec.is_xl or pipe.spec.is_refiner != wanted:
                kind = "an SDXL refiner" if wanted else "an SDXL base model (text to image)"
                raise UsageError(f"{role}: {pipe.spec.name} is not {kind}")
        if base.spec.vae_scaling_factor != refiner.spec.vae_scaling_factor or \
                base.spec.latent_channels != refiner.spec.latent_channels:
            raise UsageError(f"{base.spec.name} and {refiner.spec.name} do not share a latent space")
        validate_fraction("refiner_start", refiner_start)
        self.base, self.refiner, self.refiner_start = base, refiner, refiner_start

    @property
    def spec(self):
        return self.base.spec

    def __call__(self, prompt, negative_prompt=None, *, refiner_start: float | None = None, output: str = "pil",
                 aesthetic_score: float | None = None, negative_aesthetic_score: float | None = None,
                 callback=None, progress: bool = False, **settings: Any):
        """Settings as Pipeline.generate's (steps, guidance, seed, scheduler, size, batch, preset, ...), shared by
        both models; the refiner's aesthetic scores apply to it alone. No init image or mask: a text-to-image call.
        callback: after each step of both models, the refiner's numbered on from the base's (STOP ends the call:
        stopping.py)."""
        for name in ("image", "mask", "latents", "denoising_start", "denoising_end", "strength"):
            if settings.get(name) is not None:
                raise UsageError(f"{name}: not taken by a base + refiner call (the handoff sets where each starts)")
        hires = [name for name, value in settings.items() if name.startswith("hires_") and value is not None]
        if hires:
            raise UsageError(f"{hires[0]}: hires fix does not run with a refiner (run the base model alone)")
        start = self.refiner_start if refiner_start is None else refiner_start
        validate_fraction("refiner_start", start)
        # A ControlNet steers the base, the one it was loaded with; the refiner finishes the image as it is.
        control = {k: settings.pop(k) for k in ("control_image", "controlnet_scale", "control_start", "control_end")
                   if k in settings}
        first = self.base(prompt, negative_prompt, denoising_end=start, output="latent", progress=progress,
                          callback=callback, **settings, **control)
        if stopped_at(first) is not None:  # interrupted in the base's share: its latents decoded, no refiner
            first.params.update(refiner_start=start, workload="refiner")
            return decode_stopped(self.base, first, output)
        settings.pop("height", None), settings.pop("width", None)  # the latents carry the size
        h, w = first.params["height"], first.params["width"]
        ran = first.timings.evaluations  # the refiner's steps are numbered on from the base's
        second = self.refiner(prompt, negative_prompt, latents=first.latents, denoising_start=start, output=output,
                              height=h, width=w, aesthetic_score=aesthetic_score, progress=progress,
                              negative_aesthetic_score=negative_aesthetic_score, **settings,
                              callback=None if callback is None else lambda i, t, x: callback(ran + i, t, x))
        if stopped_at(second) is not None:
            second.params["interrupted_at_step"] += ran
        second.timings = _combined(first.timings, second.timings)
        if first.guard is not None and second.guard is not None:  # what the base's check repaired, named as its
            second.guard.remedies = [f"base: {r}" for r in first.guard.remedies] + second.guard.remedies
        second.params.update(model=f"{first.params['model']} + {second.params['model']}", refiner_start=start,
                             workload="refiner", denoising_start=None)
        return second

    generate = __call__


def _combined(base: StageTimings, refiner: StageTimings) -> StageTimings:
    return StageTimings(text=base.text + refiner.text, denoise=base.denoise, refine=refiner.denoise,
                        decode=refiner.decode, total=base.total + refiner.total,
                        steps=base.steps + refiner.steps, unet_calls=base.evaluations + refiner.evaluations)
