"""The subset of AUTOMATIC1111's web UI API that sdaccel runs (/sdapi/v1/*: what webuiapi and A1111 clients call):
txt2img (with hires fix), img2img with inpainting as A1111 runs it (a1111_img2img.py), the models, the options
(checkpoint, clip skip), the embeddings, the upscalers; every field honoured or refused by name (a1111_fields.py).
Progress, interrupt and skip: routes_progress.py; samplers, memory, png-info: routes_a1111_info.py. Seeds as A1111
numbers them: a request's images take seed, seed + 1, ... (subseeds likewise, the last within range before any job
is queued), each one its own job, reproducible alone by its seed."""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import replace

from fastapi import APIRouter, Request

from ..errors import UsageError
from ..models.configs import peek_spec
from ..pipeline.request import MAX_SEED, validate_clip_skip, validate_request
from .context import Served, check_limits, request_seed, served
from .encoding import b64, decode_image, json_answer, jsonable, pngs
from .a1111_fields import check_eta, check_fields, read_options, sampler
from .a1111_hires import a1111_hires, check_hires_limits, latent_upscale_modes, upscalers
from .a1111_img2img import prepare_inpainting, resize_image
from .a1111_scripts import request_scripts
from .jobs import Job
from .loras import keep_request_prompt, request_loras
from .middleware import ApiError
from .schemas import A1111Img2Img, A1111Options, A1111Txt2Img, Limits

router = APIRouter(prefix="/sdapi/v1")


@router.post("/txt2img")
async def txt2img(body: A1111Txt2Img, request: Request):
    check_fields(body)
    return await _generate(served(request), body, request)


@router.post("/img2img")
async def img2img(body: A1111Img2Img, request: Request):
    s = served(request)
    if len(body.init_images) != 1:
        raise ApiError(400, f"init_images: give one image, got {len(body.init_images)}")
    check_fields(body)
    image, mask, inpainting = await asyncio.to_thread(_inputs, body, s.limits)
    return await _generate(s, body, request, image=image, mask=mask, inpainting=inpainting)


@router.get("/sd-models")
async def sd_models(request: Request):
    return [{"title": name, "model_name": name, "hash": None, "sha256": None, "filename": str(ref),
             "config": None} for name, ref in served(request).worker.models.items()]


@router.get("/options")
async def get_options(request: Request):
    s = served(request)
    return {"sd_model_checkpoint": s.checkpoint, "CLIP_stop_at_last_layers": s.clip_skip + 1, "sd_vae": "Automatic"}


@router.post("/options")
async def set_options(body: A1111Options, request: Request):
    s = served(request)
    _keep_options(s, read_options(body.model_dump(exclude_none=True), s.worker.models, "options"))
    return None


def _keep_options(s: Served, options: dict) -> None:
    """Options (a1111_fields.read_options) as the server's own, checked before any is kept: the clip skip against
    the checkpoint's text encoders where they are known without loading it (else its requests check it)."""
    checkpoint = options.get("sd_model_checkpoint")
    model = s.model_name(_checkpoint(checkpoint, s.worker.models)) if checkpoint is not None else s.checkpoint
    clip_skip = options.get("clip_skip", s.clip_skip)
    spec = peek_spec(s.worker.models[model]) if clip_skip else None
    if spec is not None:
        try:
            validate_clip_skip(spec, clip_skip)
        except UsageError as exc:
            raise UsageError(f"CLIP_stop_at_last_layers {clip_skip + 1} does not fit {model!r}: {exc}") from None
    s.checkpoint, s.clip_skip = model, clip_skip


@router.get("/embeddings")
async def embeddings(request: Request):
    """The current checkpoint's textual-inversion embeddings (`sdaccel serve --embeddings DIR`), in A1111's shape:
    loaded, and skipped (the folder's files made for another model)."""
    s = served(request)
    if not s.worker.ready():
        raise ApiError(503, "the models are still loading", "not_ready")
    return s.worker.loaded_embeddings.get(s.checkpoint, {"loaded": {}, "skipped": {}})


@router.get("/upscalers")
async def list_upscalers():
    """The pixel upscalers hr_upscaler takes (hires fix), in A1111's shape."""
    return upscalers()


@router.get("/latent-upscale-modes")
async def list_latent_upscale_modes():
    """The latent upscalers hr_upscaler takes (A1111's latent_upscale_modes)."""
    return latent_upscale_modes()


async def _generate(s: Served, body: A1111Txt2Img, request: Request, image=None, mask=None, inpainting=None):
    """txt2img's and img2img's call: one job per image, the answer in A1111's shape (info as a JSON string);
    `inpainting` (a1111_img2img.Inpainting) makes each output A1111's inpainting answer."""
    count = body.batch_size * body.n_iter
    strength = body.denoising_strength if image is not None else None
    check_limits(s.limits, body.prompt, body.negative_prompt, count, body.steps, body.width, body.height)
    if image is not None:  # img2img's width and height sized the image, and are not the job's: checked here
        validate_request(1, body.height, body.width)
    if body.batch_size < 1 or body.n_iter < 1:
        raise ApiError(400, "batch_size and n_iter must be >= 1")
    overrides = read_options(body.override_settings, s.worker.models, "override_settings")
    model = s.model_name(_checkpoint(overrides.get("sd_model_checkpoint") or s.checkpoint, s.worker.models))
    scheduler = sampler(body.sampler_name or body.sampler_index, body.scheduler)
    check_eta(body.eta, scheduler)
    seed = request_seed(None if body.seed == -1 else body.seed)
    if seed + count - 1 > MAX_SEED:
        raise ApiError(400, f"seed must be from 0 to {MAX_SEED - count + 1} for {count} images")
    varied = bool(body.subseed_strength)
    subseed = request_seed(None if body.subseed == -1 else body.subseed) if varied else -1
    if varied and subseed + count - 1 > MAX_SEED:  # refused before any of the request's jobs is queued
        raise ApiError(400, f"subseed must be from 0 to {MAX_SEED - count + 1} for {count} images")
    clip_skip = overrides.get("clip_skip", s.clip_skip)
    if body.clip_skip is not None:
        given = read_options({"CLIP_stop_at_last_layers": body.clip_skip}, s.worker.models, "clip_skip")["clip_skip"]
        if "clip_skip" in overrides and overrides["clip_skip"] != given:
            raise ApiError(400, "clip_skip and override_settings.CLIP_stop_at_last_layers disagree: give one")
        clip_skip = given
    settings = dict(steps=body.steps, guidance=body.cfg_scale, scheduler=scheduler, clip_skip=clip_skip or None,
                    subseed_strength=body.subseed_strength or None)
    if image is not None:
        settings.update(image=image, mask=mask, strength=strength)  # the mask comes blurred (a1111_img2img)
    else:
        settings.update(height=body.height, width=body.width)
    settings.update(a1111_hires(body, scheduler, model, img2img=image is not None))  # enable_hr's hires fix
    check_hires_limits(s.limits, settings, body.width, body.height, s.worker.models[model])
    prompt, loras = request_loras(s.loras, body.prompt)  # <lora:name:w> tags out of the prompt, as A1111 takes them
    if body.alwayson_scripts:  # ControlNet units (a1111_scripts.py)
        settings.update(await asyncio.to_thread(request_scripts, s, body, model, image))
    # One job per image, seeded seed, seed+1, ... as A1111 seeds them: each image is reproducible alone by its
    # seed (ancestral samplers too, whose jobs run alone), and the worker batches the jobs into calls.
    jobs = [Job(model=model, prompt=prompt, negative_prompt=body.negative_prompt, n=1, seed=seed + i,
                subseed=subseed + i if varied else None, settings=settings, loras=loras) for i in range(count)]
    results = await s.run(request, jobs)
    if inpainting is not None:
        results = await asyncio.to_thread(lambda: [replace(r, images=[inpainting.finish(im) for im in r.images])
                                                   for r in results])
    if not body.override_settings_restore_afterwards:  # A1111: the overrides stay as the server's options
        _keep_options(s, overrides)
    keep_request_prompt(results, body.prompt)
    params = [r.params[0] for r in results]
    from ..outputs import png_parameters

    first = params[0]
    info = {"prompt": body.prompt, "all_prompts": [body.prompt] * count, "negative_prompt": body.negative_prompt,
            "all_negative_prompts": [body.negative_prompt] * count, "seed": seed,
            "all_seeds": [p["seed"] for p in params], "subseed": subseed,
            "all_subseeds": [p.get("subseed", -1) for p in params], "subseed_strength": body.subseed_strength,
            "steps": first["steps"], "cfg_scale": first["guidance"], "width": first["width"],
            "height": first["height"], "sampler_name": first["scheduler"], "batch_size": body.batch_size,
            "n_iter": body.n_iter, "sd_model_name": model, "sd_model_hash": None, "seed_resize_from_w": -1,
            "seed_resize_from_h": -1, "denoising_strength": first.get("strength"),
            "infotexts": [png_parameters(p, 0) for p in params], "job_timestamp": time.strftime("%Y%m%d%H%M%S"),
            "clip_skip": clip_skip + 1, "is_using_inpainting_conditioning": False}
    images = (lambda: [b64(p) for r in results for p in pngs(r)]) if body.send_images else list
    return await json_answer(lambda: {"images": images(),
                                      "parameters": body.model_dump(mode="json"),
                                      "info": json.dumps(jsonable(info))})


def _inputs(body: A1111Img2Img, limits: Limits) -> tuple:
    """img2img's (image, mask, Inpainting or None) as the call takes them: the init image resized to width x
    height by resize_mode; with a mask (inverted where asked), A1111's inpainting inputs (a1111_img2img.py).
    On a thread: not the event loop."""
    from PIL import ImageOps

    image = decode_image(body.init_images[0], "init_images[0]", limits).convert("RGB")
    mask = decode_image(body.mask, "mask", limits).convert("L") if body.mask else None
    width, height = body.width or image.width, body.height or image.height
    if (width, height) != image.size:
        check_limits(limits, "", "", 1, None, width, height)
        validate_request(1, height, width)  # the size it is resized to
    if mask is None:
        return resize_image(image, width, height, body.resize_mode), None, None
    if body.inpainting_mask_invert:
        mask = ImageOps.invert(mask)
    inpainting = prepare_inpainting(image, mask, width, height, blur=body.mask_blur, fill=body.inpainting_fill,
                                    only_masked=body.inpaint_full_res, padding=body.inpaint_full_res_padding,
                                    resize_mode=body.resize_mode)
    return inpainting.image, inpainting.mask, inpainting


def _checkpoint(name: str, models) -> str:
    """A1111's checkpoint title ('name [hash]' or a file name) as a served model's name."""
    if name in models:
        return name
    stem = re.sub(r"\s*\[[0-9a-fA-F]+\]$", "", name)
    for served_name, ref in models.items():
        if stem in (served_name, str(ref)):
            return served_name
    return stem or name  # a bare "[hash]" names no model: unknown, not the default one
