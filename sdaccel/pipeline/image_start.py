"""Where a call enters and leaves the schedule, and the latents it starts from, per workload:

- text to image: the seed's noise, from the first timestep;
- image to image: the image through the VAE encoder, noised to the step `strength` names;
- inpainting: the same, plus the mask; a 9-channel inpainting UNet takes the mask and the masked image's latents
  beside the latents at every step, a plain UNet gets the known region put back (re-noised) after every step;
- the SDXL refiner: the base model's latents at `denoising_start`, continued without new noise.

Each as the diffusers pipeline for that workload computes it, drawing from one CPU generator seeded with the seed in
the same order, so on the CPU a seed gives diffusers' latents, and the same start on every device. With per-image
seeds (`seeds=`), image i draws from its own generator in that order: it starts where a call of its own with
seeds[i] starts, whichever images share its call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..engines.base import EncodeStage
from ..errors import UsageError
from .request import Request

# After step i (an index into the window), the latents with the known region put back: plain-UNet inpainting.
Blend = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Window:
    """The scheduler timesteps a call evaluates: sched.timesteps[first:stop]."""

    first: int
    stop: int


def schedule_window(sched, request: Request) -> Window:
    """The part of the `request.steps`-step schedule (already set on `sched`) this call runs, as diffusers'
    get_timesteps and denoising_start / denoising_end pick it. Sets the scheduler's begin index where diffusers does."""
    timesteps = sched.timesteps.tolist()
    trained = sched.config.num_train_timesteps
    first = 0
    if request.denoising_start is not None:  # the refiner: the timesteps below the cut
        cutoff = int(round(trained - request.denoising_start * trained))
        kept = sum(1 for t in timesteps if t < cutoff)
        if sched.order == 2 and kept % 2 == 0:
            kept += 1  # a second-order scheduler must not start between its two evaluations of a step
        first = len(timesteps) - min(kept, len(timesteps))
    elif request.strength is not None:  # img2img (from an image or latents), inpainting: steps * strength remain
        kept = min(int(request.steps * request.strength), request.steps)
        if kept < 1:
            raise UsageError(f"strength {request.strength} of {request.steps} steps leaves no step to run: raise "
                             "one of them")
        first = (request.steps - kept) * sched.order
        if hasattr(sched, "set_begin_index"):
            sched.set_begin_index(first)
    stop = len(timesteps)
    if request.denoising_end is not None:  # a base model handing over to a refiner: the timesteps above the cut
        cutoff = int(round(trained - request.denoising_end * trained))
        stop = first + sum(1 for t in timesteps[first:] if t >= cutoff)
    if stop <= first:
        raise UsageError(f"denoising_start {request.denoising_start} / denoising_end {request.denoising_end} leave no "
                         f"step of {request.steps} to run: raise steps or widen the window")
    return Window(first, stop)


@dataclass
class Start:
    """What the denoising loop starts from."""

    latents: torch.Tensor  # fp32, on the device, already scaled for the scheduler
    unet_extra: torch.Tensor | None = None  # 9-channel UNet: mask and masked-image latents, after the latents
    blend: Blend | None = None  # plain-UNet inpainting


def latent_shape(spec, height: int, width: int, batch: int = 1) -> tuple[int, int, int, int]:
    return (batch, spec.latent_channels, height // spec.vae_scale, width // spec.vae_scale)


def initial_noise(spec, height: int, width: int, seed: int, batch: int = 1) -> torch.Tensor:
    """The starting latents for `seed`: drawn on the CPU, so the same seed gives the same start on every device."""
    return torch.randn(latent_shape(spec, height, width, batch), generator=torch.Generator("cpu").manual_seed(seed),
                       dtype=torch.float32)


def slerp(t: float, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """A1111's spherical interpolation of two (C, H, W) noises from `low` (t = 0) to `high` (t = 1), along dim 1 as
    its variation seeds take it; nearly parallel noises (cosine above 0.9995) interpolate linearly."""
    low_unit, high_unit = low / low.norm(dim=1, keepdim=True), high / high.norm(dim=1, keepdim=True)
    cos = (low_unit * high_unit).sum(1)
    if cos.mean() > 0.9995:
        return torch.lerp(low, high, t)
    omega = torch.acos(cos)
    sin = torch.sin(omega)
    return (torch.sin((1 - t) * omega) / sin).unsqueeze(1) * low + (torch.sin(t * omega) / sin).unsqueeze(1) * high


class Draws:
    """A call's random draws: from one generator (seeded with the call's seed, on the CPU, or the caller's own), or
    each image's share (one row of the batch) from its own (per-image seeds, or a list of the caller's)."""

    def __init__(self, seed: int, seeds: tuple[int, ...] | None = None, generator=None,
                 subseeds: tuple[int, ...] | None = None, subseed_strength: float = 0.0):
        self.subseeds, self.subseed_strength = subseeds, subseed_strength
        if isinstance(generator, (list, tuple)):
            self.generator, self.generators = None, list(generator)
        elif generator is not None:
            self.generator, self.generators = generator, None
        elif seeds:
            self.generator, self.generators = None, [torch.Generator("cpu").manual_seed(s) for s in seeds]
        else:
            self.generator, self.generators = torch.Generator("cpu").manual_seed(seed), None

    def randn(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.generators is None:
            return torch.randn(shape, generator=self.generator, device=self.generator.device, dtype=torch.float32)
        return torch.cat([torch.randn((1, *shape[1:]), generator=g, device=g.device, dtype=torch.float32)
                          for g in self.generators])

    def noise(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The starting noise: randn, each image's turned towards its subseed's by A1111's variation slerp."""
        noise = self.randn(shape)
        if self.subseeds is None:
            return noise
        rows = [slerp(self.subseed_strength, noise[i], torch.randn(
            shape[1:], generator=torch.Generator("cpu").manual_seed(s), dtype=torch.float32).to(noise.device))
            for i, s in enumerate(self.subseeds)]
        return torch.stack(rows)

    def sample(self, moments: torch.Tensor, n: int) -> torch.Tensor:
        """A sample of the VAE encoder's distribution for n images (one image's moments serve them all)."""
        from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

        if self.generators is None:
            latents = DiagonalGaussianDistribution(moments).sample(generator=self.generator)
            return latents.expand(n, -1, -1, -1) if len(latents) == 1 else latents
        moments = moments.expand(n, -1, -1, -1) if len(moments) == 1 else moments
        return DiagonalGaussianDistribution(moments).sample(generator=self.generators)  # one row per generator


class ImageEncoder:
    """Images through the engine's VAE encoder to scaled latents, sampled from the encoder's distribution. An engine
    without an encode stage (onnxruntime: the exported encoder draws its sample inside the graph, which a seed cannot
    reproduce) has the model's torch VAE encoder run as it is, when the model has one."""

    def __init__(self, encode: EncodeStage | None, scaling_factor: float, device: torch.device, engine_name: str,
                 vae: torch.nn.Module | None = None):
        self.encode, self.scaling_factor, self.device = encode, scaling_factor, device
        self.engine_name, self.vae = engine_name, vae
        self.finite: list[torch.Tensor] = []  # device-side "moments finite" flags of this call, for the guard

    def _moments(self, image: torch.Tensor) -> torch.Tensor:
        if self.encode is not None:
            return self.encode(image.to(self.device, torch.float32))
        if self.vae is None:
            raise UsageError(f"this needs the VAE encoder, which the {self.engine_name} engine does not run from an "
                             "ONNX pipeline folder: load the model the folder was built from instead")
        from ..models.components import vae_encode_fn

        weight = next(self.vae.parameters())
        return vae_encode_fn(self.vae)(image.to(weight.device, weight.dtype)).float().to(self.device)

    def __call__(self, image: torch.Tensor, draws: Draws, n: int) -> torch.Tensor:
        moments = self._moments(image)
        self.finite.append(torch.isfinite(moments).all())
        return draws.sample(moments, n) * self.scaling_factor


def starting_point(spec, sched, request: Request, window: Window, encoder: ImageEncoder,
                   device: torch.device) -> Start:
    """The loop's starting latents (and an inpainting UNet's extra inputs or a plain UNet's blend) for `request`."""
    n, draws = request.n, Draws(request.seed, request.seeds, request.generator, request.subseeds,
                                request.subseed_strength)
    timesteps = sched.timesteps[window.first:window.stop]
    if request.denoising_start is not None:  # the refiner continues the given state: no new noise
        latents = request.latents if request.latents is not None else encoder(request.image, draws, n)
        return Start(latents.to(device, torch.float32))
    if request.image is None and request.strength is None:  # a fresh generator's first draw: initial_noise(seed)
        noise = request.latents if request.latents is not None else draws.noise(
            latent_shape(spec, request.height, request.width, n))
        return Start(noise.to(device, torch.float32) * sched.init_noise_sigma)
    first_t = timesteps[:1].repeat(n)
    if request.mask is None:  # img2img: the image's latents, or the latents given
        given = request.image is None
        encoded = request.latents.to(device, torch.float32) if given else encoder(request.image, draws, n)
        noise = draws.noise(encoded.shape).to(device)
        return Start(sched.add_noise(encoded, noise, first_t))

    # Inpainting. The model sees the mask binarized at 0.5 (diffusers' mask processor), at latent resolution.
    mask = (request.mask >= 0.5).float()
    masked_image = request.image * (mask < 0.5)
    from_noise = request.strength == 1.0  # diffusers: the masked region starts from pure noise
    image_latents = None
    if not spec.is_inpaint or not from_noise:
        image_latents = encoder(request.image, draws, n)
    noise = draws.noise(latent_shape(spec, request.height, request.width, n)).to(device)
    latents = noise * sched.init_noise_sigma if from_noise else sched.add_noise(image_latents, noise, first_t)
    latent_mask = F.interpolate(mask, size=(request.height // spec.vae_scale, request.width // spec.vae_scale))
    latent_mask = latent_mask.to(device).expand(n, -1, -1, -1)
    if spec.is_inpaint:
        masked_latents = encoder(masked_image, draws, n)
        return Start(latents, unet_extra=torch.cat([latent_mask, masked_latents], dim=1))

    known = _renoised(sched, image_latents, noise, timesteps)

    def blend(i: int, latents: torch.Tensor) -> torch.Tensor:
        return torch.lerp(known[i], latents, latent_mask)  # (1 - mask) * known + mask * latents

    return Start(latents, blend=blend)


def _renoised(sched, image_latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    """The known region's latents after each step of the window: noised to the next step's level, the last one
    clean (diffusers' inpainting with a plain UNet). Computed before the loop, so the loop never waits on the host
    (scheduler.add_noise moves its tables to the device at every call): (steps, B, C, h, w), a few MB.
    A copy of the scheduler without a begin index finds each timestep's noise level by its value, as diffusers'
    call after the step finds it by its step index."""
    import copy

    probe = copy.deepcopy(sched)
    for name in ("_begin_index", "_step_index"):
        if hasattr(probe, name):
            setattr(probe, name, None)
    known = [probe.add_noise(image_latents, noise, timesteps[i + 1:i + 2]) for i in range(len(timesteps) - 1)]
    return torch.stack(known + [image_latents])


def paste_unmasked(decoded: torch.Tensor, request: Request) -> torch.Tensor:
    """The decoded image (in [-1, 1]) with the init image's pixels kept where the mask is black, blended across the
    mask's soft (blurred) edge: what keep_unmasked asks for, since a VAE round trip alters the pixels it keeps."""
    mask = request.mask.to(decoded.device, decoded.dtype)
    return torch.lerp(request.image.to(decoded.device, decoded.dtype), decoded, mask)
