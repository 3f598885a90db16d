"""Text to image (and image to image) for every family: encode -> denoise -> decode, calling only the engine's
stages; an init image enters through the VAE encoder, noised to the step its strength names.

The loop never waits for the GPU: the scheduler gets host-side timesteps (computed once), the UNet a device tensor,
through the stages' per-image steps (Stages.unet_steps: an engine may compute what every step shares once), guidance
is one batched call (uncond + cond; a UNet stage that shares the halves' common prefix takes the latents
once), and the only synchronisation is fetching the finished images.

A Pipeline computes; it does not judge its output. `sdaccel.load()` wraps it in the output guard (quality/guard.py),
which hands the pipeline its device-side checks to queue behind the decode (`output_checks`) and repairs a
non-finite result through the engine.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .device import dtype_name, resolve_device, resolve_dtype
from .engines import Engine, get_engine
from .errors import UsageError
from .images import image_batch
from .memory_estimate import check_fits
from .models.components import Components
from .presets import get_preset
from .schedulers import canonical, make_scheduler
from .timing import StageTimer, StageTimings

StepCallback = Callable[[int, float, torch.Tensor], None]  # (step index, timestep, latents after the step)
# (final latents, decoded-finite flag or None, uint8 image or None) -> flags on the device, without a sync
OutputChecks = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]


@dataclass
class GenerationResult:
    images: list  # PIL images ("pil"), or empty
    image_tensor: torch.Tensor | None  # (B, 3, H, W) uint8 on the device ("tensor" and "pil")
    latents: torch.Tensor  # final latents, fp32, before VAE scaling
    timings: StageTimings
    params: dict[str, Any] = field(default_factory=dict)
    decoded_finite: torch.Tensor | None = None  # device-side "decoder output had no NaN/Inf" flag
    checks: torch.Tensor | None = None  # Pipeline.output_checks' flags, queued on the device behind the decode
    guard: Any = None  # the output guard's verdict (quality.guard.GuardReport) when the call was guarded


@dataclass
class Conditioning:
    context: torch.Tensor  # (B', 77, D): B' = 2B with guidance (uncond first), else B
    text_embeds: torch.Tensor | None = None  # SDXL pooled embedding
    time_ids: torch.Tensor | None = None  # SDXL size/crop conditioning


# Bounds every entry point checks (CLI, Python API, bench, compare) through validate_request.
MAX_STEPS = 1000  # the schedulers' training schedule has 1000 timesteps: more steps than that cannot be spaced
MAX_SIDE = 16384  # pixels; far beyond any SD model's training size (memory is checked separately, per machine)
MAX_SEED = 2**63 - 2  # torch's generators take 64-bit seeds; the ancestral samplers' generator uses seed + 1


def validate_request(steps, height, width, batch_size: int = 1, guidance: float | None = 0.0, seed: int = 0,
                     strength: float | None = None) -> None:
    """Raise UsageError for settings no engine can run; cheap, so the CLI calls it before loading a model."""
    if not _is_integer(steps) or not 1 <= steps <= MAX_STEPS:
        raise UsageError(f"steps must be an integer from 1 to {MAX_STEPS}, got {steps!r}")
    for name, size in (("height", height), ("width", width)):
        if size is not None and (not _is_integer(size) or not 8 <= size <= MAX_SIDE or size % 8):
            raise UsageError(f"{name} must be a multiple of 8 from 8 to {MAX_SIDE}, got {size!r}")
    if not _is_integer(batch_size) or batch_size < 1:
        raise UsageError(f"batch size must be an integer >= 1, got {batch_size!r}")
    if guidance is not None:
        if not _is_number(guidance) or not math.isfinite(guidance) or guidance < 0:
            raise UsageError(f"guidance must be a finite number >= 0, got {guidance!r}")
    if not _is_integer(seed) or not 0 <= seed <= MAX_SEED:
        raise UsageError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    if strength is not None and (not _is_number(strength) or not 0 < strength <= 1):
        raise UsageError(f"strength must be a number in (0, 1], got {strength!r}")


def _is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # True is an int to Python


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def latent_shape(spec, height: int, width: int, batch: int = 1) -> tuple[int, int, int, int]:
    return (batch, spec.latent_channels, height // spec.vae_scale, width // spec.vae_scale)


def initial_noise(spec, height: int, width: int, seed: int, batch: int = 1) -> torch.Tensor:
    """The starting latents for `seed`: drawn on the CPU, so the same seed gives the same start on every device."""
    return torch.randn(latent_shape(spec, height, width, batch), generator=torch.Generator("cpu").manual_seed(seed),
                       dtype=torch.float32)


def _as_list(value: str | list[str] | None, n: int, what: str) -> list[str]:
    if value is None:
        return [""] * n
    if isinstance(value, str):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise UsageError(f"{what}: got {len(value)} entries for {n} prompts")
    return value


class Pipeline:
    """A loaded model on one engine. Call it like a diffusers pipeline; it returns a GenerationResult.

    output_checks: a function queued right after the decode, before the call's one sync, whose device tensor
    becomes GenerationResult.checks (the output guard's reductions: queued after the sync, each small kernel waited
    on its own launch, about 1 ms at batch 1 on an H200)."""

    def __init__(self, components: Components, engine: str | Engine = "eager", dtype: str | torch.dtype | None = None,
                 device: str | torch.device | None = None, output_checks: OutputChecks | None = None,
                 **engine_options: Any):
        self.components = components
        self.spec = components.spec
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if self.device.type == "cpu" and self.dtype == torch.float16:
            raise UsageError("fp16 needs a GPU; use fp32 or bf16 on the CPU")
        self.engine = get_engine(engine, self.device, **engine_options)
        self.stages = self.engine.prepare(components, self.dtype, self.device)
        self.output_checks = output_checks
        self._schedulers: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------------ pieces

    def refresh_weights(self) -> dict[str, int]:
        """Call after changing the model's weights (e.g. fusing a LoRA into them) so every engine uses them."""
        return self.engine.refresh_weights(self.components)

    def scheduler(self, name: str | None = None, timestep_spacing: str | None = None,
                  prediction_type: str | None = None):
        """The scheduler `name` (default: the model's), built once per (name, spacing, prediction type)."""
        key = (canonical(name or self.spec.default_scheduler), timestep_spacing, prediction_type)
        if key not in self._schedulers:
            self._schedulers[key] = make_scheduler(key[0], self.spec.scheduler, timestep_spacing, prediction_type)
        return self._schedulers[key]

    @torch.inference_mode()
    def encode_prompt(self, prompts: list[str], negatives: list[str], guidance: bool,
                      height: int, width: int) -> Conditioning:
        """One batched pass per text encoder over [negatives..., prompts...]."""
        spec = self.spec
        texts = negatives + prompts if guidance else prompts
        hiddens, pooled = [], None
        for tokenizer, encode in zip(self.components.tokenizers, self.stages.text_encoders):
            ids = tokenizer(texts).to(self.device, non_blocking=True)
            hidden, pooled = encode(ids)
            hiddens.append(hidden)
        context = torch.cat(hiddens, dim=-1) if len(hiddens) > 1 else hiddens[0]
        if not spec.is_xl:
            return Conditioning(context)
        n = len(prompts)
        if guidance and all(not neg for neg in negatives):
            # SDXL base was trained to take zeros, not the embedding of "", as the unconditional input.
            context = torch.cat([torch.zeros_like(context[:n]), context[n:]])
            pooled = torch.cat([torch.zeros_like(pooled[:n]), pooled[n:]])
        # (original size, crop top-left, target size): no crop, native size.
        time_ids = torch.tensor([height, width, 0, 0, height, width], dtype=torch.float32, device=self.device)
        return Conditioning(context, pooled, time_ids.expand(context.shape[0], 6))

    # ------------------------------------------------------------------------------------------------ the call

    def __call__(self, prompt: str | list[str], negative_prompt: str | list[str] | None = None,
                 **kwargs: Any) -> GenerationResult:
        """`generate`. The output is not judged here: sdaccel.load() returns the pipeline inside the output guard,
        whose call checks it once and repairs a non-finite result."""
        return self.generate(prompt, negative_prompt, **kwargs)

    @torch.inference_mode()
    def generate(self, prompt: str | list[str], negative_prompt: str | list[str] | None = None, *,
                 steps: int | None = None, guidance: float | None = None, height: int | None = None,
                 width: int | None = None, batch_size: int = 1, seed: int = 0, scheduler: str | None = None,
                 output: str = "pil", callback: StepCallback | None = None, progress: bool = False,
                 latents: torch.Tensor | None = None, timestep_spacing: str | None = None,
                 prediction_type: str | None = None, preset: str | None = None, image=None,
                 strength: float | None = None) -> GenerationResult:
        """Text to image; with `image` (PIL image(s) or a tensor, sizes multiples of 8), image to image: the image
        through the VAE encoder, noised to the step `strength` of the way (0 < strength <= 1, default 0.8) and
        denoised from there, as diffusers' img2img pipelines do (steps * strength UNet steps)."""
        spec = self.spec
        if preset is not None:  # the preset fills what the call leaves unset
            given = dict(scheduler=scheduler, steps=steps, guidance=guidance, timestep_spacing=timestep_spacing,
                         prediction_type=prediction_type)
            chosen = {k: given[k] if given[k] is not None else v for k, v in get_preset(preset).settings().items()}
            scheduler, steps, guidance = chosen["scheduler"], chosen["steps"], chosen["guidance"]
            timestep_spacing, prediction_type = chosen["timestep_spacing"], chosen["prediction_type"]
        steps = spec.steps if steps is None else steps
        guidance = spec.guidance if guidance is None else guidance
        init_image = None
        if image is not None:
            init_image = image_batch(image)
            for name, given, size in (("height", height, init_image.shape[2]), ("width", width, init_image.shape[3])):
                if given is not None and given != size:
                    raise UsageError(f"{name} {given} differs from the image's {size}: leave it unset with an image")
            height, width = init_image.shape[2], init_image.shape[3]
            strength = 0.8 if strength is None else strength
        elif strength is not None:
            raise UsageError("strength needs an image (image to image)")
        height = spec.height if height is None else height
        width = spec.width if width is None else width
        validate_request(steps, height, width, batch_size, guidance, seed, strength)
        guidance = float(guidance)
        if output not in ("pil", "tensor", "latent"):
            raise UsageError(f"output must be pil, tensor or latent, got {output!r}")
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts:
            raise UsageError("no prompt given")
        prompts = [p for p in prompts for _ in range(batch_size)]
        negatives = _as_list(negative_prompt, len(prompts) // batch_size, "negative prompts")
        negatives = [n for n in negatives for _ in range(batch_size)]
        cfg = guidance > 1.0  # guidance <= 1 is the conditional prediction alone: skip the uncond half
        check_fits(spec, height, width, len(prompts), self.dtype, cfg, self.device)
        sched_name = canonical(scheduler or spec.default_scheduler)
        sched = self.scheduler(sched_name, timestep_spacing, prediction_type)

        timer = StageTimer(self.device)
        n = len(prompts)
        if init_image is not None:
            if len(init_image) not in (1, n):
                raise UsageError(f"image: {len(init_image)} images for {n} outputs (give one, or one per output)")
            if latents is not None:
                raise UsageError("latents and image exclude each other (the image's latents are the start)")
        if latents is None and init_image is None:
            latents = initial_noise(spec, height, width, seed, n)
        elif latents is not None:
            shape = latent_shape(spec, height, width, n)
            if tuple(latents.shape) != shape:
                raise UsageError(f"latents must have shape {shape}, got {tuple(latents.shape)}")
        if latents is not None:
            latents = latents.to(self.device, torch.float32)
        step_gen = torch.Generator(self.device).manual_seed(seed + 1)  # ancestral samplers' per-step noise

        with timer.stage("text"):
            cond = self.encode_prompt(prompts, negatives, cfg, height, width)
        sched.set_timesteps(steps)  # on the host: the scheduler's arithmetic never waits for the GPU
        start = 0
        if init_image is not None:
            start = self._img2img_start(sched, steps, strength)
            with timer.stage("encode"):
                latents = self._noised_image_latents(sched, init_image, n, start, seed)
        else:
            latents = latents * sched.init_noise_sigma
        with timer.stage("denoise"):
            latents = self._denoise(sched, latents, cond, guidance, cfg, step_gen, callback, progress,
                                    steps - start, start)
        with timer.stage("decode"):
            image = decoded_finite = None
            if output != "latent":
                decoded = self.stages.decode(latents / spec.vae_scaling_factor)
                decoded_finite = torch.isfinite(decoded).all()  # read later, with the image: no sync here
                image = ((decoded / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
        # Queued before the call's one sync, the checks run back to back behind the decode (a few us).
        checks = None if self.output_checks is None else self.output_checks(latents, decoded_finite, image)
        timings = timer.result(steps=steps - start, unet_calls=len(sched.timesteps) - start * sched.order)

        params = dict(prompt=prompts[0], negative_prompt=negatives[0], steps=steps, guidance=guidance,
                      height=height, width=width, seed=seed, scheduler=sched_name, batch_size=n,
                      model=self.components.source, engine=self.engine.name, dtype=dtype_name(self.dtype),
                      timestep_spacing=sched.config.timestep_spacing, prediction_type=sched.config.prediction_type,
                      preset=preset, strength=strength if init_image is not None else None)
        images = _to_pil(image) if output == "pil" else []
        return GenerationResult(images=images, image_tensor=image, latents=latents, timings=timings, params=params,
                                decoded_finite=decoded_finite, checks=checks)

    def _img2img_start(self, sched, steps: int, strength: float) -> int:
        """The first of the `steps` the image enters at (diffusers' get_timesteps): steps * strength steps remain."""
        kept = min(int(steps * strength), steps)
        if kept < 1:
            raise UsageError(f"strength {strength} of {steps} steps leaves no step to run: raise one of them")
        start = steps - kept
        if hasattr(sched, "set_begin_index"):
            sched.set_begin_index(start * sched.order)
        return start

    def _noised_image_latents(self, sched, image: torch.Tensor, n: int, start: int, seed: int) -> torch.Tensor:
        """The image's latents (a sample of the VAE encoder's distribution), scaled, noised to the start timestep.
        Both draws come from one CPU generator seeded with `seed`, so a seed gives the same start on every device
        (and, on the CPU, diffusers' img2img pipeline's with generator=torch.Generator().manual_seed(seed))."""
        vae = self.components.vae
        if vae is None:
            raise UsageError(f"image to image needs the VAE encoder: the {self.engine.name} engine over an ONNX "
                             f"pipeline folder does not run it yet; load the torch model instead")
        weight = next(vae.parameters())
        generator = torch.Generator("cpu").manual_seed(seed)
        posterior = vae.encode(image.to(weight.device, weight.dtype)).latent_dist  # under generate's inference_mode
        encoded = posterior.sample(generator=generator).to(self.device, torch.float32)
        encoded = encoded * self.spec.vae_scaling_factor
        encoded = encoded.expand(n, -1, -1, -1) if len(encoded) == 1 else encoded
        noise = torch.randn(encoded.shape, generator=generator, dtype=torch.float32).to(self.device)
        first = sched.timesteps[start * sched.order:][:1].repeat(n)
        return sched.add_noise(encoded, noise, first)

    def _denoise(self, sched, latents, cond: Conditioning, guidance: float, cfg: bool, step_gen: torch.Generator,
                 callback: StepCallback | None, progress: bool, steps: int | None = None,
                 start: int = 0) -> torch.Tensor:
        # Host copies of the timesteps for the scheduler's arithmetic, device copies for the UNet: no per-step sync.
        # `start`: img2img enters the schedule at that step (its timesteps before it are skipped).
        timesteps = sched.timesteps[start * sched.order:]
        timesteps_host = timesteps.tolist()
        timesteps_dev = timesteps.to(self.device, non_blocking=True)
        evaluations = len(timesteps_host)
        steps = evaluations if steps is None else steps
        unet = self.stages.unet_steps(timesteps_dev, cond.context, cond.text_embeds, cond.time_ids)
        bar = _progress_bar(steps, evaluations, type(sched).__name__) if progress else None
        for i in range(evaluations):
            t = timesteps_host[i]
            model_in = torch.cat([latents, latents]) if cfg and not self.stages.unet_takes_cfg_once else latents
            model_in = sched.scale_model_input(model_in, t)
            pred = unet(i, model_in)
            if cfg:
                uncond, text = pred.chunk(2)
                pred = torch.lerp(uncond, text, guidance)  # uncond + guidance * (text - uncond): one kernel, not 3
            latents = sched.step(pred, t, latents, return_dict=False, **_step_kwargs(sched, step_gen))[0]
            if callback is not None:
                callback(i, t, latents)
            if bar is not None:  # counted in steps: PNDM evaluates the UNet steps + 1 times
                bar.update(round((i + 1) * steps / evaluations) - bar.n)
        if bar is not None:
            bar.close()
        return latents


def _progress_bar(steps: int, evaluations: int, scheduler: str):
    """A bar over the steps asked for; when the scheduler evaluates the UNet a different number of times, one line
    says so before it."""
    import sys

    from tqdm.auto import tqdm

    if evaluations != steps:
        tqdm.write(f"{scheduler}: {evaluations} UNet evaluations for {steps} steps", file=sys.stderr)
    return tqdm(total=steps, desc="denoising", unit="step", leave=False)


def _step_kwargs(sched, generator) -> dict[str, Any]:
    return {"generator": generator} if "generator" in sched.step.__code__.co_varnames else {}


def _to_pil(image: torch.Tensor | None) -> list:
    from PIL import Image

    if image is None:
        return []
    array = image.permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a) for a in array]
