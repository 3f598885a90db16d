"""Hires fix, as AUTOMATIC1111's web UI runs it (txt2img's "Hires. fix"): text to image at the asked size, the result
upscaled to a target size, then image to image there, which adds the detail the first size could not hold.

- The target: hires_size (A1111's hr_resize_x, hr_resize_y; one of them 0 keeps the first pass's aspect ratio; both
  of another aspect ratio: upscaled to cover it, then cropped to it, centred, in the latents, as A1111 truncates),
  else the first size x hires_scale. Each side lands on the latent grid (a multiple of 8, rounded down), as A1111's
  int(side * scale) // 8 latents do. A target equal to the first size runs the first pass alone, as A1111 does.
- The upscalers: A1111's latent modes (its shared.latent_upscale_modes: "Latent" is F.interpolate bilinear without
  antialiasing, ...) resize the first pass's latents, never decoded; "Lanczos", "Nearest" and "None" (a Lanczos
  resize, A1111's upscaler "None") decode the first pass, resize the images with PIL and encode them again (the
  second pass's init image: its encode stage).
- The second pass runs hires_steps steps (0 or None: the first pass's), as A1111 runs a step count it is given: the
  last hires_steps of a schedule of int(hires_steps / min(hires_strength, 0.999)) steps (A1111's
  setup_img2img_steps), from the upscaled latents noised to that schedule's step. Its noise is each image's seed's
  first draw at the target size, as A1111's second pass draws it afresh (with a pixel upscaler the VAE's sample is
  drawn first, as every image-to-image call here draws it). Same guidance and seeds; the prompt, negative prompt and
  scheduler unless hires_prompt, hires_negative_prompt, hires_scheduler (A1111's hr_prompt, hr_negative_prompt,
  hr_sampler_name) name others.

Both passes are calls of Pipeline.generate, so every engine runs them, the fast engine with its CUDA graphs for
each of the two shapes (captured on the first call, replayed by the next). The result is the second pass's, its
params recording the first pass's size and steps with the hires settings (A1111's "Hires upscale: 2, Hires steps:
20, Hires upscaler: Latent, Denoising strength: 0.7"); its timings hold both passes: `denoise` the first pass's
loop, `refine` the second's. A step callback sees both passes, each numbering its steps from 0, as A1111's progress
starts again with the second pass.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UsageError
from .memory_estimate import check_fits
from .limits import is_integer as _is_integer
from .request import MAX_SIDE, MAX_STEPS, Request, from_diffusers_names, validate_request
from .stopping import decode_stopped, stopped_at
from .timing import StageTimer, StageTimings

HIRES_STRENGTH = 0.7  # A1111's web UI default for the second pass's denoising strength
DEFAULT_UPSCALER = "Latent"  # A1111's latent_upscale_default_mode
MAX_STRENGTH = 0.999  # A1111 caps the strength in the step-count rule, so strength 1 keeps a finite schedule


@dataclass(frozen=True)
class Upscaler:
    """One of A1111's hires upscalers: a latent mode (torch.nn.functional.interpolate's mode and antialias), or a
    pixel resize (a PIL resampling filter)."""

    name: str  # A1111's spelling, as PNG parameters and /sdapi/v1/upscalers show it
    mode: str | None = None  # F.interpolate mode; None: a pixel upscaler
    antialias: bool = False
    resample: str | None = None  # PIL.Image.Resampling member of a pixel upscaler

    @property
    def latent(self) -> bool:
        return self.mode is not None


LATENT_UPSCALERS = (Upscaler("Latent", "bilinear"), Upscaler("Latent (antialiased)", "bilinear", True),
                    Upscaler("Latent (bicubic)", "bicubic"), Upscaler("Latent (bicubic antialiased)", "bicubic", True),
                    Upscaler("Latent (nearest)", "nearest"), Upscaler("Latent (nearest-exact)", "nearest-exact"))
PIXEL_UPSCALERS = (Upscaler("None", resample="LANCZOS"), Upscaler("Lanczos", resample="LANCZOS"),
                   Upscaler("Nearest", resample="NEAREST"))
UPSCALERS = {u.name.lower(): u for u in LATENT_UPSCALERS + PIXEL_UPSCALERS}
# What a hires call may not be given: (keyword, why), checked before any work.
REFUSED = (("image", "hires fix runs on text to image (A1111's img2img has no hires fix): leave out the image"),
           ("mask", "hires fix runs on text to image, not inpainting"),
           ("strength", "hires fix's second pass takes hires_strength"),
           ("denoising_start", "hires fix runs whole schedules (a refiner handoff is not one)"),
           ("denoising_end", "hires fix runs whole schedules (a refiner handoff is not one)"),
           ("control_image", "hires fix does not run ControlNets (their images have the first pass's size)"),
           ("generator", "hires fix draws each pass's noise from the seed, as A1111 does: give seed or seeds"))


def get_upscaler(name: str | None) -> Upscaler:
    """The upscaler A1111 calls `name` (any case); None: "Latent", A1111's default."""
    if name is None:
        name = DEFAULT_UPSCALER
    upscaler = UPSCALERS.get(name.strip().lower()) if isinstance(name, str) else None
    if upscaler is None:
        raise UsageError(f"hires_upscaler {name!r} is not supported; use one of "
                         f"{', '.join(u.name for u in LATENT_UPSCALERS + PIXEL_UPSCALERS)}")
    return upscaler


@dataclass(frozen=True)
class Target:
    """The second pass's size, and how the upscaled first pass maps onto it, in latents (pixels / vae_scale)."""

    width: int  # pixels
    height: int
    cover: tuple[int, int]  # (width, height) in latents the upscaler resizes the first pass to
    crop: tuple[int, int, int, int]  # (left, top, right, bottom) in latents: the part of `cover` kept


def hires_target(width: int, height: int, scale: float | None = None, size: tuple[int, int] | None = None,
                 vae_scale: int = 8) -> Target:
    """Where a first pass of width x height goes, as A1111's calculate_target_resolution computes it: width and
    height x scale, or `size` = (hr_resize_x, hr_resize_y)."""
    crop_x = crop_y = 0
    if size is None:
        cover_w, cover_h = int(width * scale), int(height * scale)
    else:
        resize_x, resize_y = size
        if resize_y == 0:
            cover_w, cover_h = resize_x, resize_x * height // width
        elif resize_x == 0:
            cover_w, cover_h = resize_y * width // height, resize_y
        else:  # cover the asked box, keeping the aspect ratio, then crop to it
            if width / height < resize_x / resize_y:
                cover_w, cover_h = resize_x, resize_x * height // width
            else:
                cover_w, cover_h = resize_y * width // height, resize_y
            crop_x, crop_y = (cover_w - resize_x) // vae_scale, (cover_h - resize_y) // vae_scale
    lw, lh = cover_w // vae_scale, cover_h // vae_scale
    crop = (crop_x // 2, crop_y // 2, lw - (crop_x + 1) // 2, lh - (crop_y + 1) // 2)
    return Target((crop[2] - crop[0]) * vae_scale, (crop[3] - crop[1]) * vae_scale, (lw, lh), crop)


def second_pass_schedule(steps: int, strength: float) -> tuple[int, float]:
    """(schedule steps, strength) for Pipeline.generate such that it runs the last `steps` of a schedule of
    int(steps / min(strength, 0.999)) steps, as A1111 runs a second pass: generate runs int(schedule * strength)
    steps, and (steps + 0.5) / schedule lands that product inside [steps, steps + 1) whatever the float rounding."""
    schedule = int(steps / min(strength, MAX_STRENGTH))
    if schedule > MAX_STEPS:
        raise UsageError(f"hires fix: {steps} steps at hires_strength {strength} run on a schedule of {schedule} "
                         f"steps (A1111's rule: steps / strength), over the {MAX_STEPS} a schedule can have: raise "
                         "hires_strength or lower hires_steps")
    return schedule, min(1.0, (steps + 0.5) / schedule)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_hires_settings(scale=None, size=None, upscaler=None, steps=None, strength=None) -> Upscaler:
    """UsageError naming the setting that no hires call could run (cheap: the CLI and the server check before any
    work); the upscaler."""
    if scale is not None and size is not None:
        raise UsageError("give hires_scale or hires_size, not both")
    if scale is not None and (not _is_number(scale) or scale <= 0):
        raise UsageError(f"hires_scale must be a number > 0, got {scale!r}")
    if size is not None:
        if isinstance(size, (str, bytes)) or not hasattr(size, "__len__") or len(size) != 2 or \
                not all(_is_integer(side) and 0 <= side <= MAX_SIDE for side in size) or not any(size):
            raise UsageError(f"hires_size must be (width, height), each from 0 to {MAX_SIDE} pixels, 0 keeping the "
                             f"first pass's aspect ratio (not both 0), got {size!r}")
    if steps is not None and (not _is_integer(steps) or not 0 <= steps <= MAX_STEPS):
        raise UsageError(f"hires_steps must be an integer from 0 to {MAX_STEPS} (0: the first pass's steps), got "
                         f"{steps!r}")
    if strength is not None and (not _is_number(strength) or not 0 < strength <= 1):
        raise UsageError(f"hires_strength must be a number in (0, 1], got {strength!r}")
    return get_upscaler(upscaler)


HIRES_KEYWORDS = ("hires_scale", "hires_size", "hires_upscaler", "hires_steps", "hires_strength", "hires_prompt",
                  "hires_negative_prompt", "hires_scheduler")


def hires_call(keywords: dict[str, Any]) -> HiresCall | None:
    """Pipeline.generate's keywords (its locals at entry) as a checked HiresCall; None when neither hires_scale nor
    hires_size asks for hires fix (then every other hires keyword is refused by name)."""
    hires = {name: keywords.get(name) for name in HIRES_KEYWORDS}
    if hires["hires_scale"] is None and hires["hires_size"] is None:
        given = [name for name, value in hires.items() if value is not None]
        if given:
            raise UsageError(f"{given[0]} needs hires_scale or hires_size (hires fix)")
        return None
    for name, why in REFUSED:
        if keywords.get(name) is not None:
            raise UsageError(f"{name}: {why}")
    upscaler = check_hires_settings(hires["hires_scale"], hires["hires_size"], hires["hires_upscaler"],
                                    hires["hires_steps"], hires["hires_strength"])
    call = {k: v for k, v in keywords.items() if k not in HIRES_KEYWORDS and k not in ("self", "diffusers_names")}
    names = keywords.get("diffusers_names") or {}
    if names:  # as generate reads them, once, so that each pass gets one name per setting
        call.update(from_diffusers_names(names, {k: call[k] for k in ("steps", "guidance", "batch_size", "output")}))
    size = None if hires["hires_size"] is None else tuple(hires["hires_size"])
    return HiresCall(call, hires["hires_scale"], size, upscaler, hires["hires_steps"] or 0,
                     HIRES_STRENGTH if hires["hires_strength"] is None else float(hires["hires_strength"]),
                     hires["hires_prompt"], hires["hires_negative_prompt"], hires["hires_scheduler"])


@dataclass
class HiresCall:
    """One hires fix call: the keywords both passes share (Pipeline.generate's), and the hires settings."""

    call: dict[str, Any]
    scale: float | None
    size: tuple[int, int] | None
    upscaler: Upscaler
    steps: int  # 0: the first pass's
    strength: float
    prompt: Any = None  # None: the first pass's
    negative_prompt: Any = None
    scheduler: str | None = None

    def run(self, pipe, request: Request):
        """Both passes on `pipe` (a Pipeline), `request` being the first pass's settings, resolved (its seed chosen
        when the call named none, so both passes draw from it)."""
        spec = pipe.spec
        target = hires_target(request.width, request.height, self.scale, self.size, spec.vae_scale)
        if (target.width, target.height) == (request.width, request.height):
            return pipe.generate(**self.first_pass(request))  # nothing to upscale: A1111 runs the first pass alone
        if min(target.width, target.height) < 8 or max(target.width, target.height) > MAX_SIDE:
            raise UsageError(f"hires fix: the target {target.width}x{target.height} must have sides from 8 to "
                             f"{MAX_SIDE} pixels")
        steps = self.steps or request.steps
        schedule, strength = second_pass_schedule(steps, self.strength)
        validate_request(schedule, target.height, target.width)
        check_fits(spec, target.height, target.width, request.n, pipe.dtype, request.cfg, pipe.device)
        timer = StageTimer(pipe.device)
        with timer.stage("total"):  # both passes and the upscale between them, read after the second pass
            first = pipe.generate(**dict(self.first_pass(request), output="latent" if self.upscaler.latent
                                         else "tensor"))
            if stopped_at(first) is not None:  # interrupted: A1111 skips the second pass, answers the first's images
                return decode_stopped(pipe, first, self.call["output"])
            if self.upscaler.latent:
                start = dict(latents=upscaled_latents(first.latents, target, self.upscaler))
            else:
                start = dict(image=upscaled_images(pipe, first, target, self.upscaler), latents=None)
            second = pipe.generate(**dict(
                self.first_pass(request), **start, steps=schedule, strength=strength, height=target.height,
                width=target.width, scheduler=self.scheduler or self.call["scheduler"],
                prompt=self.call["prompt"] if self.prompt is None else self.prompt,
                negative_prompt=self.call["negative_prompt"] if self.negative_prompt is None else self.negative_prompt))
        second.timings = both_passes(first.timings, second.timings, timer.result().total)
        second.params.update(self.params(first.params, second.params, target, steps))
        return second

    def first_pass(self, request: Request) -> dict[str, Any]:
        """The first pass's keywords: the call's, with the seed it resolved (a random one when it named none)."""
        return dict(self.call, seed=request.seed) if request.seeds is None else dict(self.call)

    def params(self, first: dict, second: dict, target: Target, steps: int) -> dict[str, Any]:
        """What the result records beyond the second pass's own params: the first pass's size, steps and scheduler
        (A1111's Size, Steps, Sampler), its prompts, and the hires settings."""
        out = dict(prompt=first["prompt"], negative_prompt=first["negative_prompt"], steps=first["steps"],
                   height=first["height"], width=first["width"], scheduler=first["scheduler"], workload="hires",
                   strength=self.strength, denoising_start=None,
                   hires_scale=self.scale, hires_resize=None if self.size is None else list(self.size),
                   hires_width=target.width, hires_height=target.height, hires_upscaler=self.upscaler.name,
                   hires_steps=steps)
        if second["scheduler"] != first["scheduler"]:
            out["hires_scheduler"] = second["scheduler"]
        for name, given, own in (("hires_prompt", second["prompt"], first["prompt"]),
                                 ("hires_negative_prompt", second["negative_prompt"], first["negative_prompt"])):
            if given != own:
                out[name] = given
        return out


def upscaled_latents(latents: torch.Tensor, target: Target, upscaler: Upscaler) -> torch.Tensor:
    """The first pass's latents resized by a latent upscaler to the cover size, cropped to the target."""
    width, height = target.cover
    resized = F.interpolate(latents, size=(height, width), mode=upscaler.mode, antialias=upscaler.antialias)
    left, top, right, bottom = target.crop
    return resized[:, :, top:bottom, left:right].contiguous()


def upscaled_images(pipe, first, target: Target, upscaler: Upscaler) -> list:
    """The first pass's images (uint8, decoded) resized by a pixel upscaler (PIL) to the cover size on the latent
    grid, cropped to the target: the second pass's init images. A decode that came out non-finite is done again
    in fp32 first (the output guard's remedy for a final image, here for the one the second pass starts from)."""
    from PIL import Image

    from .guard import NonFiniteOutputError, PrecisionFallbackWarning
    from .remedies import fp32_decode, to_uint8

    image = first.image_tensor
    if first.decoded_finite is not None and not bool(first.decoded_finite):  # the copy to the host syncs anyway
        if pipe.components.vae is None:
            raise NonFiniteOutputError("hires fix: the first pass decoded to NaN/Inf, and there is no torch VAE to "
                                       "decode it again in fp32")
        warnings.warn("hires fix: the first pass decoded to NaN/Inf: decoded again in fp32 before upscaling",
                      PrecisionFallbackWarning, stacklevel=3)
        image = to_uint8(fp32_decode(pipe.components, first.latents))
    scale = pipe.spec.vae_scale
    cover = (target.cover[0] * scale, target.cover[1] * scale)
    box = tuple(side * scale for side in target.crop)
    resample = getattr(Image.Resampling, upscaler.resample)
    return [Image.fromarray(array).resize(cover, resample=resample).crop(box)
            for array in image.permute(0, 2, 3, 1).cpu().numpy()]


def both_passes(first: StageTimings, second: StageTimings, total: float) -> StageTimings:
    """One hires call's stage times: `denoise` the first pass's loop, `refine` the second's, the others summed;
    `total` the whole call, the upscale between the passes included."""
    return StageTimings(text=first.text + second.text, encode=first.encode + second.encode, denoise=first.denoise,
                        refine=second.denoise, decode=first.decode + second.decode, total=total,
                        steps=first.steps + second.steps, unet_calls=first.evaluations + second.evaluations)
