"""One generation's settings, checked and resolved before any work: defaults from the model, a preset's recipe,
the init image and mask of image-to-image and inpainting, and the window of the schedule a call denoises.

Every entry point goes through here (the CLI, `sdaccel bench`, `compare`, the Python API), so a bad setting is one
UsageError naming it, raised before a model loads (validate_request) or before any GPU work (resolve_request).
"""

from __future__ import annotations

import math
import numbers
import secrets
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UsageError
from .control import Control, check_control_size, resolve_control
from .images import image_batch, mask_batch
from .limits import LIBRARY, LIBRARY_MAX_SIDE, SCHEDULE_STEPS, GenerationLimits
from .limits import is_integer as _is_integer  # True is an int to Python, not a count here
from .presets import get_preset
from .prompts import parse

MAX_STEPS, MAX_SIDE = SCHEDULE_STEPS, LIBRARY_MAX_SIDE  # the library's bounds (limits.py)
# Classifier-free guidance beyond this only saturates the image; a larger scale overflows fp16's range (65504) in
# the guided prediction, and 1e308 even float32's.
MAX_GUIDANCE = 100.0
MAX_SEED = 2**63 - 2  # torch's generators take 64-bit seeds; the ancestral samplers' generator uses seed + 1
IMG2IMG_STRENGTH = 0.8  # diffusers' img2img default
INPAINT_STRENGTH = 1.0  # diffusers' inpainting default: the masked region starts from pure noise
AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE = 6.0, 2.5  # the SDXL refiner's published defaults


def validate_request(steps, height, width, batch_size: int = 1, guidance: float | None = 0.0, seed: int = 0,
                     strength: float | None = None, limits: GenerationLimits = LIBRARY) -> None:
    """Raise UsageError for settings no engine can run, or that `limits` (limits.py) refuse; cheap, so the CLI calls
    it before loading a model."""
    limits.check_steps(steps)
    limits.check_side("height", height)
    limits.check_side("width", width)
    limits.check_images(batch_size)
    if guidance is not None:
        if not _is_number(guidance) or not math.isfinite(guidance) or not 0 <= guidance <= MAX_GUIDANCE:
            raise UsageError(f"guidance must be a finite number >= 0, got {guidance!r} (at most {MAX_GUIDANCE:g})")
    validate_seed("seed", seed)
    if strength is not None and (not _is_number(strength) or not 0 < strength <= 1):
        raise UsageError(f"strength must be a number in (0, 1], got {strength!r}")


def validate_seed(name: str, seed) -> None:
    if not _is_integer(seed) or not 0 <= seed <= MAX_SEED:
        raise UsageError(f"{name} must be an integer from 0 to {MAX_SEED}, got {seed!r}")


def validate_text(name: str, text) -> None:
    """A prompt the tokenizer can read: a string of Unicode characters (a lone surrogate such as "\\ud800", which
    JSON can carry, is not one)."""
    if not isinstance(text, str):
        raise UsageError(f"{name}s must be strings, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{name} is not valid text: {exc.reason} at character {exc.start}") from None


def random_seed() -> int:
    """A seed for a call that names none: in A1111's range, a seed a user can type back in."""
    return secrets.randbelow(2**32)


def _check_generators(generator) -> None:
    for one in generator if isinstance(generator, (list, tuple)) else [generator]:
        if not isinstance(one, torch.Generator):
            raise UsageError(f"generator must be a torch.Generator or a list of them, got {type(one).__name__}")


# diffusers' names for Pipeline.generate's keywords: a call written for a diffusers pipeline runs unchanged.
DIFFUSERS_NAMES = {"num_inference_steps": "steps", "guidance_scale": "guidance", "num_images_per_prompt": "batch_size",
                   "output_type": "output"}
OUTPUT_TYPES = {"pil": "pil", "latent": "latent"}  # diffusers' output_type values with the same meaning here


def from_diffusers_names(given: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """`ours` (generate's keywords as called) with diffusers' names in `given` put in their place. A name neither
    knows is a TypeError, as Python's own; one given under both names, or an output_type with another meaning
    here ("pt", "np": float arrays in [0, 1]), is a UsageError."""
    unknown = sorted(set(given) - set(DIFFUSERS_NAMES))
    if unknown:
        raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}")
    defaults = {"steps": None, "guidance": None, "batch_size": 1, "output": "pil"}
    out = dict(ours)
    for name, value in given.items():
        mine = DIFFUSERS_NAMES[name]
        if out[mine] != defaults[mine]:
            raise UsageError(f"{name} and {mine} name one setting: give one of them")
        if name == "output_type":
            if value not in OUTPUT_TYPES:
                raise UsageError(f"output_type {value!r} is not returned: use 'pil' or 'latent', or output='tensor' "
                                 "for a uint8 tensor on the device")
            value = OUTPUT_TYPES[value]
        out[mine] = value
    return out


def validate_clip_skip(spec, clip_skip) -> int:
    """clip_skip as diffusers defines it (A1111's "Clip skip" N is N - 1 here): None or 0 is the model's own layer;
    at most every text encoder's layers less one."""
    if clip_skip is None:
        return 0
    most = min(int(te.config["num_hidden_layers"]) for te in spec.text_encoders) - 1
    if not _is_integer(clip_skip) or not 0 <= clip_skip <= most:
        raise UsageError(f"clip_skip must be an integer from 0 to {most} for {spec.name} (diffusers' count: 1 "
                         f"skips one layer, A1111's 'Clip skip: 2'), got {clip_skip!r}")
    return int(clip_skip)


def variation(subseed, strength, n: int, generator=None) -> tuple[tuple[int, ...] | None, float]:
    """A1111's variation seeds: (one subseed per image, strength). subseed: an integer (image i takes subseed + i,
    as A1111 numbers them), a list of one per image, or None (a random one when strength > 0); strength in [0, 1],
    0 (the default) meaning no variation."""
    strength = 0.0 if strength is None else strength
    if not _is_number(strength) or not 0 <= strength <= 1:
        raise UsageError(f"subseed_strength must be a number from 0 to 1, got {strength!r}")
    if strength == 0:
        if subseed is not None and not _is_integer(subseed) and not isinstance(subseed, (list, tuple)):
            raise UsageError(f"subseed must be an integer or a list of them, got {subseed!r}")
        return None, 0.0
    if generator is not None:
        raise UsageError("subseed_strength draws the variation from subseeds: give seed / seeds, not generator")
    if subseed is None:
        subseed = random_seed()
    if isinstance(subseed, (list, tuple)):
        if len(subseed) != n:
            raise UsageError(f"subseed: {len(subseed)} subseeds for {n} output images (give one, or one per image)")
        subseeds = tuple(subseed)
    else:
        subseeds = tuple(subseed + i for i in range(n)) if _is_integer(subseed) else (subseed,)
    for one in subseeds:
        validate_seed("subseed", one)
    return subseeds, float(strength)


def validate_fraction(name: str, value) -> None:
    """denoising_start / denoising_end / refiner_start: a fraction of the schedule strictly inside (0, 1)."""
    if value is not None and (not _is_number(value) or not 0 < value < 1):
        raise UsageError(f"{name} must be a number in (0, 1), got {value!r}")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass
class Request:
    """A call's settings, resolved: every field has its final value. `prompts`/`negatives` hold one entry per
    output image (prompts x batch_size)."""

    prompts: list[str]
    negatives: list[str]
    steps: int
    guidance: float
    height: int
    width: int
    seed: int
    scheduler: str | None  # None: the model's default
    timestep_spacing: str | None
    prediction_type: str | None
    preset: str | None
    output: str
    # given starting latents: noise (txt2img), the state at denoising_start, or with strength clean latents that
    # image to image noises (hires fix's second pass)
    latents: torch.Tensor | None
    image: torch.Tensor | None  # (1 or n, 3, H, W) in [-1, 1], on the CPU
    mask: torch.Tensor | None  # (1 or n, 1, H, W) in [0, 1] (white: repaint), blurred, not binarized, on the CPU
    mask_blur: float
    strength: float | None
    keep_unmasked: bool
    denoising_start: float | None
    denoising_end: float | None
    aesthetic_score: float
    negative_aesthetic_score: float
    control: Control | None = None  # the ControlNets' images, scales and spans; None: no ControlNet this call
    seeds: tuple[int, ...] | None = None  # one per output image, each drawing its own noise; None: `seed` for all
    prompt_syntax: str = "a1111"  # how prompts are read: A1111's emphasis and BREAK, or "none" (prompts.py)
    generator: Any = None  # a torch.Generator (or one per image) the noise is drawn from instead of a seed
    clip_skip: int = 0  # diffusers' meaning: condition on the hidden states this many layers earlier
    subseeds: tuple[int, ...] | None = None  # A1111's variation seeds, one per image; None: no variation
    subseed_strength: float = 0.0  # how far each image's noise turns towards its subseed's (A1111's slerp)

    @property
    def n(self) -> int:
        return len(self.prompts)

    @property
    def cfg(self) -> bool:
        """Classifier-free guidance: guidance <= 1 is the conditional prediction alone (no uncond half)."""
        return self.guidance > 1.0

    @property
    def workload(self) -> str:
        if self.mask is not None:
            return "inpaint"
        if self.denoising_start is not None:
            return "refine"
        return "img2img" if self.image is not None or self.strength is not None else "txt2img"

    def params(self) -> dict[str, Any]:
        """What the output records (PNG parameters, benchmark rows) beyond the pipeline's own fields."""
        return dict(prompt=self.prompts[0], negative_prompt=self.negatives[0], steps=self.steps,
                    guidance=self.guidance, height=self.height, width=self.width,
                    seed=None if self.generator is not None else self.seed,
                    **({"seeds": list(self.seeds)} if self.seeds is not None else {}),
                    **({"prompt_syntax": self.prompt_syntax} if self.prompt_syntax != "a1111" else {}),
                    **({"clip_skip": self.clip_skip} if self.clip_skip else {}),
                    **({"subseeds": list(self.subseeds), "subseed_strength": self.subseed_strength}
                       if self.subseeds is not None else {}),
                    batch_size=self.n, preset=self.preset, workload=self.workload,
                    strength=self.strength if self.workload in ("img2img", "inpaint") else None,
                    denoising_start=self.denoising_start, denoising_end=self.denoising_end,
                    keep_unmasked=self.keep_unmasked if self.mask is not None else None,
                    mask_blur=self.mask_blur if self.mask is not None else None,
                    **(self.control.params() if self.control is not None else {}))


def resolve_request(spec, prompt, negative_prompt=None, *, steps=None, guidance=None, height=None, width=None,
                    batch_size: int = 1, seed: int | None = None, seeds=None, scheduler=None, output: str = "pil",
                    latents=None,
                    timestep_spacing=None, prediction_type=None, preset=None, image=None, mask=None,
                    mask_blur: float = 0, strength=None, keep_unmasked: bool = False, denoising_start=None,
                    denoising_end=None, aesthetic_score=None, negative_aesthetic_score=None, controlnets: int = 0,
                    control_image=None, controlnet_scale=None, control_start=None, control_end=None,
                    prompt_syntax: str = "a1111", generator=None, clip_skip=None, subseed=None,
                    subseed_strength=None) -> Request:
    """Check and complete one call's settings for a model `spec` (Pipeline.generate's arguments) with
    `controlnets` ControlNets loaded beside it (control.py). seed None: a random one (reported in params), or
    seeds[0] with per-image `seeds`; `generator` (a torch.Generator, or one per image) draws the noise instead, as
    diffusers' pipelines draw it. clip_skip: validate_clip_skip; subseed, subseed_strength: variation()."""
    if preset is not None:  # the preset fills what the call leaves unset
        given = dict(scheduler=scheduler, steps=steps, guidance=guidance, timestep_spacing=timestep_spacing,
                     prediction_type=prediction_type)
        chosen = {k: given[k] if given[k] is not None else v for k, v in get_preset(preset).settings().items()}
        scheduler, steps, guidance = chosen["scheduler"], chosen["steps"], chosen["guidance"]
        timestep_spacing, prediction_type = chosen["timestep_spacing"], chosen["prediction_type"]
    steps = spec.steps if steps is None else steps
    guidance = spec.guidance if guidance is None else guidance
    validate_fraction("denoising_start", denoising_start)
    validate_fraction("denoising_end", denoising_end)
    if denoising_start is not None and denoising_end is not None and denoising_start >= denoising_end:
        raise UsageError(f"denoising_start {denoising_start} must be below denoising_end {denoising_end}")

    init_image = init_mask = None
    if image is not None:
        if latents is not None:
            raise UsageError("latents and image exclude each other (the image's latents are the start)")
        init_image = image_batch(image)
        for name, given, size in (("height", height, init_image.shape[2]), ("width", width, init_image.shape[3])):
            if given is not None and given != size:
                raise UsageError(f"{name} {given} differs from the image's {size}: leave it unset with an image")
        height, width = init_image.shape[2], init_image.shape[3]
    if mask is not None:
        if init_image is None:
            raise UsageError("mask needs an image (inpainting repaints the image where the mask is white)")
        if denoising_start is not None:
            raise UsageError("inpainting from a given denoising_start is not supported: use strength")
        init_mask = mask_batch(mask, mask_blur)
        if init_mask.shape[2:] != init_image.shape[2:]:
            raise UsageError(f"mask: {init_mask.shape[3]}x{init_mask.shape[2]} differs from the image's "
                             f"{init_image.shape[3]}x{init_image.shape[2]}")
    elif mask_blur:
        raise UsageError("mask_blur needs a mask")
    elif keep_unmasked:
        raise UsageError("keep_unmasked needs a mask")
    if spec.is_inpaint and init_mask is None:
        raise UsageError(f"{spec.name} is an inpainting model: give an image and a mask (--image, --mask)")
    if spec.is_refiner and init_image is None and not (latents is not None and denoising_start is not None):
        raise UsageError(f"{spec.name} refines an image: give one (--image), or run it as a base model's refiner "
                         "(--refiner)")

    if denoising_start is not None:
        if init_image is None and latents is None:
            raise UsageError("denoising_start needs the state to continue from: an image or latents")
        if strength is not None:
            raise UsageError("strength and denoising_start exclude each other (the start is denoising_start)")
    elif init_image is not None:
        strength = (INPAINT_STRENGTH if init_mask is not None else IMG2IMG_STRENGTH) if strength is None else strength
    elif strength is not None and latents is None:
        raise UsageError("strength needs an image (image to image), or latents to noise to it")

    control = resolve_control(controlnets, control_image, controlnet_scale, control_start, control_end)
    if control is not None and init_image is None:  # the output takes the control image's size by default
        height = control.images[0].shape[2] if height is None else height
        width = control.images[0].shape[3] if width is None else width
    height = spec.height if height is None else height
    width = spec.width if width is None else width
    if seeds is not None:
        if seed is not None:
            raise UsageError("give seed (the batch's) or seeds (one per image), not both")
        if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__len__") or not len(seeds):
            raise UsageError(f"seeds must be a list of integers, one per output image, got {seeds!r}")
        seeds = tuple(seeds)
        for one in seeds:
            validate_seed("each of seeds", one)
        seed = seeds[0]
    if generator is not None:
        if seed is not None or seeds is not None:
            raise UsageError("give generator (diffusers' way) or seed / seeds, not both")
        _check_generators(generator)
        seed = 0  # recorded as None: the generator's state, not a seed, decides the noise
    elif seed is None:
        seed = random_seed()
    validate_request(steps, height, width, batch_size, guidance, seed, strength)
    if output not in ("pil", "tensor", "latent"):
        raise UsageError(f"output must be pil, tensor or latent, got {output!r}")
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts:
        raise UsageError("no prompt given")
    negatives = _as_list(negative_prompt, len(prompts), "negative prompts")
    for text in prompts + negatives:  # the syntax's errors (a weight that is not a number) before any work
        validate_text("prompt", text)
        parse(text, prompt_syntax)
    prompts = [p for p in prompts for _ in range(batch_size)]
    negatives = [n for n in negatives for _ in range(batch_size)]
    for name, given in (("image", init_image), ("mask", init_mask)):
        if given is not None and len(given) not in (1, len(prompts)):
            raise UsageError(f"{name}: {len(given)} {name}s for {len(prompts)} outputs (give one, or one per output)")
    check_control_size(control, height, width, len(prompts))
    if seeds is not None and len(seeds) != len(prompts):
        raise UsageError(f"seeds: {len(seeds)} seeds for {len(prompts)} output images (give one per image)")
    if isinstance(generator, (list, tuple)) and len(generator) != len(prompts):
        raise UsageError(f"generator: {len(generator)} generators for {len(prompts)} output images (give one, or "
                         "one per image)")
    subseeds, subseed_strength = variation(subseed, subseed_strength, len(prompts), generator)
    if subseeds is not None and latents is not None:
        raise UsageError("subseed_strength varies the seed's noise: it does not apply to given latents")
    scores = []
    for name, value, default in (("aesthetic_score", aesthetic_score, AESTHETIC_SCORE),
                                 ("negative_aesthetic_score", negative_aesthetic_score, NEGATIVE_AESTHETIC_SCORE)):
        if value is not None and not spec.aesthetic_score:
            raise UsageError(f"{name}: {spec.name} is not conditioned on an aesthetic score (the SDXL refiner is)")
        if value is not None and (not _is_number(value) or not math.isfinite(value)):
            raise UsageError(f"{name} must be a finite number, got {value!r}")
        scores.append(float(default if value is None else value))
    return Request(prompts=prompts, negatives=negatives, steps=steps, guidance=float(guidance), height=height,
                   width=width, seed=seed, scheduler=scheduler, timestep_spacing=timestep_spacing,
                   prediction_type=prediction_type, preset=preset, output=output, latents=latents, image=init_image,
                   mask=init_mask, mask_blur=mask_blur, strength=strength, keep_unmasked=bool(keep_unmasked),
                   denoising_start=denoising_start, denoising_end=denoising_end, aesthetic_score=scores[0],
                   negative_aesthetic_score=scores[1], control=control, seeds=seeds, prompt_syntax=prompt_syntax,
                   generator=generator, clip_skip=validate_clip_skip(spec, clip_skip), subseeds=subseeds,
                   subseed_strength=subseed_strength)


def _as_list(value: str | list[str] | None, n: int, what: str) -> list[str]:
    if value is None:
        return [""] * n
    if isinstance(value, str):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise UsageError(f"{what}: got {len(value)} entries for {n} prompts")
    return value
