"""One pipeline for every family and workload: encode -> denoise -> decode, calling only the engine's stages.
Text to image, image to image, inpainting and the SDXL refiner's handoff differ only in where the loop enters and
leaves the schedule and what it starts from (image_start.py); the settings are checked in request.py.

The loop never waits for the GPU: the scheduler gets host-side timesteps (computed once), the UNet a device tensor,
through the stages' per-image steps (Stages.unet_steps: an engine may compute what every step shares once), guidance
is one batched call (uncond + cond; a UNet stage that shares the halves' common prefix takes the latents
once), and the only synchronisation is fetching the finished images.

A Pipeline computes; it does not judge its output. `sdaccel.load()` builds it with the output guard's device-side
checks to queue behind the decode (`output_checks`, guard.py) and wraps it in the guard, which reads them and repairs
a non-finite result through the pipeline's and the engine's methods (encode_in_fp32, Engine.upcast_attention).
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..device import dtype_name, resolve_device, resolve_dtype
from ..engines import Engine, get_engine
from ..engines.fp32_encoder import Fp32Encoder, fp32_encode_stage
from ..errors import UsageError
from ..models.components import Components
from ..models.lora import LoraWeights
from ..models.schedulers import canonical, make_scheduler
from .control import Control
from .hires import hires_call
from .image_prompts import check_scales, image_prompts
from .image_start import (ImageEncoder, Start, Window, initial_noise, latent_shape, paste_unmasked, schedule_window,
                          starting_point)
from .memory_estimate import check_fits
from .prompts import apply_weights, batch_chunks, parse
from .request import (AESTHETIC_SCORE, MAX_SEED, MAX_SIDE, MAX_STEPS, NEGATIVE_AESTHETIC_SCORE, Request,
                      from_diffusers_names, resolve_request, validate_request)
from .stopping import STOP
from .timing import StageTimer, StageTimings

__all__ = ["Pipeline", "GenerationResult", "Conditioning", "initial_noise", "latent_shape", "validate_request",
           "MAX_SEED", "MAX_SIDE", "MAX_STEPS"]

# (step index, timestep, latents after the step) -> STOP to end the denoising there (stopping.py), else None
StepCallback = Callable[[int, float, torch.Tensor], Any]
# (final latents, decoded-finite flag or None, uint8 image or None, encoded-finite flag or None) -> flags on the
# device, without a sync
OutputChecks = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None], torch.Tensor]


@dataclass
class GenerationResult:
    images: list  # PIL images ("pil"), or empty
    image_tensor: torch.Tensor | None  # (B, 3, H, W) uint8 on the device ("tensor" and "pil")
    latents: torch.Tensor  # final latents, fp32, before VAE scaling
    timings: StageTimings
    params: dict[str, Any] = field(default_factory=dict)
    decoded_finite: torch.Tensor | None = None  # device-side "decoder output had no NaN/Inf" flag
    checks: torch.Tensor | None = None  # Pipeline.output_checks' flags, queued on the device behind the decode
    guard: Any = None  # the output guard's verdict (pipeline.guard.GuardReport) when the call was guarded
    encoded_finite: torch.Tensor | None = None  # device-side "VAE encoder output finite" flag; None: no image


@dataclass
class Conditioning:
    context: torch.Tensor  # (B', 77 x chunks, D): B' = 2B with guidance (uncond first), else B
    text_embeds: torch.Tensor | None = None  # SDXL pooled embedding
    time_ids: torch.Tensor | None = None  # SDXL size/crop conditioning


def _check_latents(latents: torch.Tensor | None, spec, request: Request) -> None:
    if latents is None:
        return
    shape = latent_shape(spec, request.height, request.width, request.n)
    if tuple(latents.shape) != shape:
        raise UsageError(f"latents must have shape {shape}, got {tuple(latents.shape)}")


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
        # Before the engine fuses anything: LoRA layers are found by their original names.
        self.lora_weights = LoraWeights({"unet": components.unet,
                                         **dict(zip(self.spec.text_encoder_names, components.text_encoders))})
        self.stages = self.engine.prepare(components, self.dtype, self.device)
        self.output_checks = output_checks
        self._fp32_encoder: Fp32Encoder | None = None  # set by encode_in_fp32
        self._schedulers: dict[str, Any] = {}
        self.ip_adapter_scale: float | list[float] = 1.0  # set_ip_adapter_scale's: calls without a scale use it

    # ------------------------------------------------------------------------------------------------ pieces

    @property
    def embeddings(self) -> dict[str, int]:
        """The textual-inversion embeddings loaded (sdaccel.load(..., embeddings=)): name -> the token positions
        (vectors) it takes in a prompt."""
        loaded = self.components.embeddings
        return {} if loaded is None else {name: e.count for name, e in loaded.loaded.items()}

    def set_loras(self, loras: dict[str, float]) -> dict[str, int]:
        """Merge exactly these LoRA files ({path: scale}) into the weights, replacing the ones set before; {}
        returns to the base weights, bit for bit. The engine's graphs and compiled code read the new weights
        without being captured or compiled again (models/lora.py). A bad file or scale raises and changes nothing."""
        if not self.engine.reads_module_weights:
            self.engine.refresh_weights(self.components)  # says why this engine cannot take new weights
        counts = self.lora_weights.apply(loras)
        counts.update(self.engine.refresh_weights(self.components))
        return self._refreshed(counts)

    def set_ip_adapter_scale(self, scale: float | list[float]) -> None:
        """The IP-Adapters' scale (one number, or one per adapter) for calls that give none, as diffusers'."""
        adapters = self.components.ip_adapters
        if adapters is None:
            raise UsageError("set_ip_adapter_scale: this model has no IP-Adapter (load it with ip_adapter=)")
        self.ip_adapter_scale = check_scales(scale, len(adapters))

    def refresh_weights(self) -> dict[str, int]:
        """Call after changing the model's weights (e.g. fusing a LoRA into them) so every engine uses them."""
        return self._refreshed(self.engine.refresh_weights(self.components))

    def _refreshed(self, counts: dict[str, int]) -> dict[str, int]:
        if self._fp32_encoder is not None:
            counts["fp32_encoder"] = self._fp32_encoder.refresh()
        return counts

    def encode_in_fp32(self) -> bool:
        """Encode init images with an fp32 copy of the VAE encoder from now on (the VAE keeps its dtype): the output
        guard's remedy for an encoder that overflowed. False when there is no torch VAE (an ONNX pipeline folder)."""
        if self.components.vae is None:
            return False
        self._fp32_encoder = Fp32Encoder(self.components.vae)
        self.stages = dataclasses.replace(self.stages, encode=fp32_encode_stage(self._fp32_encoder))
        return True

    def scheduler(self, name: str | None = None, timestep_spacing: str | None = None,
                  prediction_type: str | None = None):
        """The scheduler `name` (default: the model's), built once per (name, spacing, prediction type)."""
        key = (canonical(name or self.spec.default_scheduler), timestep_spacing, prediction_type)
        if key not in self._schedulers:
            self._schedulers[key] = make_scheduler(key[0], self.spec.scheduler, timestep_spacing, prediction_type)
        return self._schedulers[key]

    @torch.inference_mode()
    def encode_prompt(self, prompts: list[str], negatives: list[str], guidance: bool, height: int, width: int,
                      aesthetic_scores: tuple[float, float] | None = None,
                      prompt_syntax: str = "a1111", clip_skip: int = 0) -> Conditioning:
        """One batched pass per text encoder over [negatives..., prompts...], every prompt in its 75-token chunks
        with its emphasis (prompts.py; the context is 77 x chunks tokens long). aesthetic_scores: (positive,
        negative), for a model conditioned on them (the SDXL refiner); else the defaults. clip_skip: the hidden
        states that many layers earlier (diffusers' meaning; the text stages' second input)."""
        spec = self.spec
        texts = negatives + prompts if guidance else prompts
        tokenizers = self.components.tokenizers
        laid = [batch_chunks(texts, tokenizer, prompt_syntax) for tokenizer in tokenizers]
        chunks = max(count for _, _, count in laid)
        if any(count != chunks for _, _, count in laid):  # tokenizers that split a prompt differently
            laid = [batch_chunks(texts, tokenizer, prompt_syntax, chunks) for tokenizer in tokenizers]
        hiddens, pooled = [], None
        for (ids, weights, _), encode in zip(laid, self.stages.text_encoders):
            ids = ids.to(self.device, non_blocking=True)
            hidden, pooled = encode(ids, clip_skip) if clip_skip else encode(ids)
            if weights is not None:
                hidden = apply_weights(hidden, weights)
            hiddens.append(hidden.reshape(len(texts), chunks * hidden.shape[1], hidden.shape[2]))
            pooled = pooled.reshape(len(texts), chunks, -1)[:, 0]  # the first chunk's, as A1111 pools
        context = torch.cat(hiddens, dim=-1) if len(hiddens) > 1 else hiddens[0]
        if not spec.is_xl:
            return Conditioning(context)
        n = len(prompts)
        if guidance and spec.zeros_for_empty_negative and all(not neg for neg in negatives):
            # SDXL base was trained to take zeros, not the embedding of "", as the unconditional input.
            context = torch.cat([torch.zeros_like(context[:n]), context[n:]])
            pooled = torch.cat([torch.zeros_like(pooled[:n]), pooled[n:]])
        # (original size, crop top-left, then the target size, or the refiner's aesthetic score): no crop.
        if spec.aesthetic_score:
            good, bad = aesthetic_scores or (AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE)
            rows = [[height, width, 0, 0, bad]] * (n if guidance else 0) + [[height, width, 0, 0, good]] * n
        else:
            rows = [[height, width, 0, 0, height, width]] * context.shape[0]
        time_ids = torch.tensor(rows, dtype=torch.float32).to(self.device, non_blocking=True)
        return Conditioning(context, pooled, time_ids)

    # ------------------------------------------------------------------------------------------------ the call

    def __call__(self, prompt: str | list[str], negative_prompt: str | list[str] | None = None,
                 **kwargs: Any) -> GenerationResult:
        """`generate`. The output is not judged here: sdaccel.load() returns the pipeline inside the output guard,
        whose call checks it once and repairs a non-finite result."""
        return self.generate(prompt, negative_prompt, **kwargs)

    @torch.inference_mode()
    def generate(self, prompt: str | list[str], negative_prompt: str | list[str] | None = None, *,
                 steps: int | None = None, guidance: float | None = None, height: int | None = None,
                 width: int | None = None, batch_size: int = 1, seed: int | None = None,
                 seeds: list[int] | None = None, scheduler: str | None = None,
                 output: str = "pil", callback: StepCallback | None = None, progress: bool = False,
                 latents: torch.Tensor | None = None, timestep_spacing: str | None = None,
                 prediction_type: str | None = None, preset: str | None = None, image=None, mask=None,
                 mask_blur: float = 0, strength: float | None = None, keep_unmasked: bool = False,
                 denoising_start: float | None = None, denoising_end: float | None = None,
                 aesthetic_score: float | None = None, negative_aesthetic_score: float | None = None,
                 control_image=None, controlnet_scale: float | list[float] | None = None,
                 control_start: float | list[float] | None = None,
                 control_end: float | list[float] | None = None, prompt_syntax: str = "a1111", generator=None,
                 clip_skip: int | None = None, subseed: int | list[int] | None = None,
                 subseed_strength: float = 0.0, hires_scale: float | None = None,
                 hires_size: tuple[int, int] | None = None, hires_upscaler: str | None = None,
                 hires_steps: int | None = None, hires_strength: float | None = None,
                 hires_prompt: str | list[str] | None = None, hires_negative_prompt: str | list[str] | None = None,
                 hires_scheduler: str | None = None, ip_adapter_image=None, ip_adapter_image_embeds=None,
                 ip_adapter_scale: float | list[float] | None = None, **diffusers_names: Any) -> GenerationResult:
        """Text to image, and with `image` (PIL image(s) or a tensor, sides multiples of 8):
        seed draws the batch's noise from one generator, as diffusers does; seeds (one per output image,
        instead of seed) draws each image's from its own, so image i is the image a call of its own with seeds[i]
        gives (samplers that draw noise at every step, like euler_a, still share one generator, seeded from seeds[0]).
        - image to image: the image through the VAE encoder, noised to the step `strength` of the way
          (0 < strength <= 1, default 0.8), denoised from there (steps * strength UNet steps);
        - with `mask` (white: repaint), inpainting: a 9-channel inpainting model takes the mask and the masked
          image's latents; a plain model has the unmasked region put back after every step. strength defaults to 1
          (the masked region from pure noise); mask_blur softens the mask's edge (pixels); keep_unmasked pastes
          the init image's pixels back outside the mask after decoding.
        denoising_end (0..1) stops the schedule early (a base model handing over, output="latent");
        denoising_start continues given `latents` (or an image) from that point (the SDXL refiner): see
        refiner.BaseAndRefiner.
        With ControlNets loaded (sdaccel.load(..., controlnet=...)): control_image (one per ControlNet, the output's
        size, which it sets when height and width are unset), controlnet_scale (default 1), control_start and
        control_end (fractions of the denoised steps, default 0 and 1): control.py. Without a control_image the
        call runs the model alone.
        seed None (the default) is a random seed, which params["seed"] reports. diffusers' names work too:
        num_inference_steps, guidance_scale, num_images_per_prompt, output_type ("pil", "latent"), generator (a
        torch.Generator, or one per image, drawing the noise as diffusers' pipelines draw it).
        clip_skip (diffusers' count: 1 conditions on the layer before the usual one; A1111's "Clip skip: 2"). subseed
        and subseed_strength: A1111's variation seeds, each image's starting noise turned by slerp towards its
        subseed's (subseed + i for image i, or one per image), strength 0 (none) to 1 (the subseed's noise).
        Prompts of any length, with A1111's emphasis and BREAK (prompt_syntax "a1111", the default; "none": every
        character is text): prompts.py.
        hires_scale (or hires_size=(width, height), 0 keeping the aspect ratio): A1111's hires fix, this call at its
        size, then upscaled (hires_upscaler: "Latent" (default), "Latent (bicubic)", ..., "Lanczos") and run again
        as image to image there (hires_steps, default the first pass's; hires_strength, default 0.7;
        hires_prompt, hires_negative_prompt, hires_scheduler, default the first pass's): hires.py.
        With IP-Adapters loaded (sdaccel.load(..., ip_adapter=...)): ip_adapter_image (one image prompt per adapter:
        a PIL image, a list of them, or CLIP pixel values), or ip_adapter_image_embeds as diffusers takes them, and
        ip_adapter_scale (a number or one per adapter; default set_ip_adapter_scale's, 1.0): image_prompts.py. A
        new scale or image is a new input of the same computation: nothing is compiled or captured again.
        callback(i, t, latents) runs after each denoising step; returning stopping.STOP ends the denoising there and
        the call decodes the latents reached (params["interrupted_at_step"]: the steps run), as A1111 answers an
        interrupted job.
        All as diffusers' pipelines for these workloads compute them."""
        hires = hires_call(locals())  # None unless hires_scale / hires_size ask for hires fix; read before any name
        spec = self.spec
        if diffusers_names:
            chosen = from_diffusers_names(diffusers_names, dict(steps=steps, guidance=guidance, batch_size=batch_size,
                                                                output=output))
            steps, guidance, batch_size, output = (chosen[k] for k in ("steps", "guidance", "batch_size", "output"))
        request = resolve_request(
            spec, prompt, negative_prompt, steps=steps, guidance=guidance, height=height, width=width,
            batch_size=batch_size, seed=seed, seeds=seeds, scheduler=scheduler, output=output, latents=latents,
            timestep_spacing=timestep_spacing, prediction_type=prediction_type, preset=preset, image=image,
            mask=mask, mask_blur=mask_blur, strength=strength, keep_unmasked=keep_unmasked,
            denoising_start=denoising_start, denoising_end=denoising_end, aesthetic_score=aesthetic_score,
            negative_aesthetic_score=negative_aesthetic_score, controlnets=len(self.components.controlnets),
            control_image=control_image, controlnet_scale=controlnet_scale, control_start=control_start,
            control_end=control_end, prompt_syntax=prompt_syntax, generator=generator, clip_skip=clip_skip,
            subseed=subseed, subseed_strength=subseed_strength)
        _check_latents(latents, spec, request)
        n, cfg = request.n, request.cfg
        check_fits(spec, request.height, request.width, n, self.dtype, cfg, self.device)
        if hires is not None:  # a first pass at this size, then one at the target size: two calls of this method
            return hires.run(self, request)
        sched_name = canonical(request.scheduler or spec.default_scheduler)
        sched = self.scheduler(sched_name, request.timestep_spacing, request.prediction_type)
        # Ancestral samplers' per-step noise: one generator for the batch (its images depend on which share it), or
        # the caller's, as diffusers' pipelines draw it.
        step_gen = generator if generator is not None else torch.Generator(self.device).manual_seed(request.seed + 1)

        timer = StageTimer(self.device)
        with timer.stage("text"):
            cond = self.encode_prompt(request.prompts, request.negatives, cfg, request.height, request.width,
                                      (request.aesthetic_score, request.negative_aesthetic_score),
                                      request.prompt_syntax, request.clip_skip)
            prompts = image_prompts(self.components.ip_adapters, ip_adapter_image, ip_adapter_image_embeds,
                                    self.ip_adapter_scale if ip_adapter_scale is None else ip_adapter_scale,
                                    request.n, cfg, self.device, self.dtype)
            if prompts is not None:
                self.components.ip_adapters.scales.set(prompts.scales)
                cond = dataclasses.replace(cond, context=prompts.context(cond.context))
        sched.set_timesteps(request.steps)  # on the host: the scheduler's arithmetic never waits for the GPU
        window = schedule_window(sched, request)
        encoder = ImageEncoder(self.stages.encode, spec.vae_scaling_factor, self.device, self.engine.name,
                               self.components.vae)
        with timer.stage("encode") if request.image is not None else nullcontext():
            start = starting_point(spec, sched, request, window, encoder, self.device)
        evaluations = window.stop - window.first
        # Steps as asked for, in the window's share: PNDM evaluates the UNet 51 times for 50 steps.
        steps_run = max(1, round(request.steps * evaluations / len(sched.timesteps)))
        with timer.stage("denoise"):
            latents, stopped = self._denoise(sched, start, window, cond, request.guidance, cfg, step_gen, callback,
                                             progress, steps_run, request.control)
        if stopped is not None:  # a callback ended the loop: the timings count the steps that ran
            evaluations, steps_run = stopped, max(1, round(request.steps * stopped / len(sched.timesteps)))
        with timer.stage("decode"):
            image = decoded_finite = None
            if request.output != "latent":
                decoded = self.stages.decode(latents / spec.vae_scaling_factor)
                decoded_finite = torch.isfinite(decoded).all()  # read later, with the image: no sync here
                if request.keep_unmasked:
                    decoded = paste_unmasked(decoded, request)
                image = ((decoded / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
        encoded_finite = torch.stack(encoder.finite).all() if encoder.finite else None
        # Queued before the call's one sync, the checks run back to back behind the decode (a few us).
        checks = None if self.output_checks is None else self.output_checks(latents, decoded_finite, image,
                                                                            encoded_finite)
        timings = timer.result(steps=steps_run, unet_calls=evaluations)
        params = dict(request.params(), scheduler=sched_name, model=self.components.source, engine=self.engine.name,
                      dtype=dtype_name(self.dtype), timestep_spacing=sched.config.timestep_spacing,
                      prediction_type=sched.config.prediction_type)
        if stopped is not None:
            params["interrupted_at_step"] = stopped
        if request.control is not None:
            params["controlnets"] = [getattr(net, "sdaccel_source", type(net).__name__)
                                     for net in self.components.controlnets]
        if prompts is not None:
            params["ip_adapters"] = dict(zip(self.components.ip_adapters.sources, prompts.scales))
        if self.lora_weights.active:
            params["loras"] = dict(self.lora_weights.active)
        if self.components.embeddings is not None:  # the embeddings the prompts name: {name: file hash}
            used = self.components.embeddings.used_in(text for prompt in (*request.prompts, *request.negatives)
                                                      for text, _ in parse(prompt, request.prompt_syntax) if text)
            if used:
                params["embeddings"] = used
        if spec.aesthetic_score:
            params.update(aesthetic_score=request.aesthetic_score,
                          negative_aesthetic_score=request.negative_aesthetic_score)
        images = _to_pil(image) if request.output == "pil" else []
        return GenerationResult(images=images, image_tensor=image, latents=latents, timings=timings, params=params,
                                decoded_finite=decoded_finite, checks=checks, encoded_finite=encoded_finite)

    def _control_steps(self, control: Control | None, steps: int, batch: int, cfg: bool) -> _SteeredSteps | None:
        """The per-step scales and the control images on the device (or the engine's embeddings of them), batched
        as diffusers' ControlNet pipelines batch them (one image repeated per output; the guidance halves get the
        same, doubled unless the engine takes them once), or None without control."""
        if control is None:
            return None
        rows = control.step_scales(steps)
        images = []
        for image in control.images:
            image = image.to(self.device, non_blocking=True)
            images.append(image.repeat_interleave(batch, dim=0) if len(image) == 1 else image)
        if self.stages.embed_controls is not None:  # the same at every step: once per image
            images = list(self.stages.embed_controls(*images))
        twice = cfg and not self.stages.control_takes_cfg_once
        images = [torch.cat([image, image]) if twice else image for image in images]
        scales = torch.tensor(rows, dtype=torch.float32).to(self.device, non_blocking=True)
        return _SteeredSteps([any(row) for row in rows], scales, images, twice)

    def _denoise(self, sched, start: Start, window: Window, cond: Conditioning, guidance: float, cfg: bool,
                 step_gen: torch.Generator, callback: StepCallback | None, progress: bool, steps: int,
                 control: Control | None = None) -> tuple[torch.Tensor, int | None]:
        """The latents after the loop, and the steps run when the callback stopped it early (else None)."""
        # Host copies of the timesteps for the scheduler's arithmetic, device copies for the UNet: no per-step sync.
        timesteps = sched.timesteps[window.first:window.stop]
        timesteps_host = timesteps.tolist()
        timesteps_dev = timesteps.to(self.device, non_blocking=True)
        evaluations = len(timesteps_host)
        unet = self.stages.unet_steps(timesteps_dev, cond.context, cond.text_embeds, cond.time_ids)
        doubled = cfg and not self.stages.unet_takes_cfg_once
        extra = start.unet_extra  # an inpainting UNet's mask and masked-image latents, the same at every step
        steered = self._control_steps(control, evaluations, start.latents.shape[0], cfg)
        if extra is not None:
            # The plain UNet's copy (doubled unless it takes the guidance latents once) and the ControlNet steps'.
            extra = {False: torch.cat([extra, extra]) if doubled else extra,
                     True: torch.cat([extra, extra]) if steered is not None and steered.twice else extra}
        latents = start.latents
        step_kwargs = _step_kwargs(sched, step_gen)
        bar = _progress_bar(steps, evaluations, type(sched).__name__) if progress else None
        for i in range(evaluations):
            t = timesteps_host[i]
            with_control = steered is not None and steered.active[i]
            twice = steered.twice if with_control else doubled
            model_in = sched.scale_model_input(torch.cat([latents, latents]) if twice else latents, t)
            if extra is not None:
                model_in = torch.cat([model_in, extra[with_control]], dim=1)
            if with_control:
                pred = self.stages.controlled_step(i, model_in, timesteps_dev[i], cond.context, cond.text_embeds,
                                                   cond.time_ids, steered.scales[i], *steered.images)
            else:
                pred = unet(i, model_in)
            if cfg:
                uncond, text = pred.chunk(2)
                pred = torch.lerp(uncond, text, guidance)  # uncond + guidance * (text - uncond): one kernel, not 3
            latents = sched.step(pred, t, latents, return_dict=False, **step_kwargs)[0]
            if start.blend is not None:
                latents = start.blend(i, latents)
            if callback is not None and callback(i, t, latents) is STOP:
                if bar is not None:
                    bar.close()
                return latents, i + 1  # decoded as they are, as A1111 answers an interrupted job
            if bar is not None:  # counted in steps: PNDM evaluates the UNet steps + 1 times
                bar.update(round((i + 1) * steps / evaluations) - bar.n)
        if bar is not None:
            bar.close()
        return latents, None


@dataclass
class _SteeredSteps:
    """What the ControlNet steps of one loop read, on the device before the loop starts."""

    active: list[bool]  # per step: does any ControlNet act (else the plain UNet runs)
    scales: torch.Tensor  # (steps, ControlNets)
    # per ControlNet: (batch, 3, H, W) in [0, 1], or the engine's embedding of it (Stages.embed_controls)
    images: list[torch.Tensor]
    twice: bool  # the latents and images doubled for guidance (else the stage takes them once)


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
