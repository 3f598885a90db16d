"""One number for `sdaccel bench --quality`: the PSNR of an engine/dtype's image against eager fp32's.

Self-contained: loads the reference and the candidate one after the other (never both at once), from the same
weights (`seed` also seeds synthetic weights), prompt and initial noise.
"""

from __future__ import annotations

import gc

import torch

from ..pipeline.core import initial_noise
from .metrics import psnr

PROMPT = "an astronaut riding a horse on mars"


def _generate(pipe, noise: torch.Tensor, height: int, width: int, steps: int, seed: int,
              scheduler: str | None = None) -> torch.Tensor:
    result = pipe(PROMPT, steps=steps, height=height, width=width, seed=seed, output="tensor", latents=noise,
                  scheduler=scheduler)
    return result.image_tensor.cpu()


def reference_image(model: str, device, noise: torch.Tensor, *, height: int, width: int, steps: int, seed: int = 0,
                    scheduler: str | None = None, arch: str | None = None) -> torch.Tensor:
    """Eager fp32's uint8 image for these weights and initial noise (loaded, used, released)."""
    from ..pipeline.load import load

    pipe = load(model, engine="eager", dtype="fp32", device=device, seed=seed, arch=arch)
    image = _generate(pipe, noise, height, width, steps, seed, scheduler)
    del pipe
    _release(torch.device(device))
    return image


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def psnr_against_reference(model: str, engine: str, dtype: str, height: int | None, width: int | None, steps: int,
                           seed: int = 0, device=None) -> float:
    """PSNR in dB (10 log10(255^2 / MSE) over the uint8 images) of `engine`/`dtype` against eager fp32, both from
    the same initial noise. math.inf when the images are identical. height/width None: the model's own size.

    Costs two model loads and two generations. A non-finite candidate is not repaired: its PSNR is that of
    whatever its uint8 conversion produced (low), which is what a user of that engine would get.
    """
    from ..device import resolve_device
    from ..pipeline.load import load

    device = resolve_device(device)
    pipe = load(model, engine=engine, dtype=dtype, device=device, seed=seed)
    height, width = height or pipe.spec.height, width or pipe.spec.width
    noise = initial_noise(pipe.spec, height, width, seed)
    candidate = _generate(pipe, noise, height, width, steps, seed)
    del pipe
    _release(device)
    return psnr(candidate, reference_image(model, device, noise, height=height, width=width, steps=steps, seed=seed))
