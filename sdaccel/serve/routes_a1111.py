"""The subset of AUTOMATIC1111's web UI API that sdaccel runs (/sdapi/v1/*: what webuiapi and A1111 clients call):
txt2img, img2img with inpainting, the models, the checkpoint option and progress. Seeds as A1111 numbers them: a
request's images take seed, seed + 1, ..., each one its own job, reproducible alone by its seed."""

from __future__ import annotations

import asyncio
import json
import re
import time

from fastapi import APIRouter, Request

from ..models.schedulers import canonical
from ..pipeline.request import MAX_SEED, validate_request
from .context import Served, check_limits, request_seed, served
from .encoding import b64, decode_image, json_answer, jsonable, pngs
from .jobs import Job
from .middleware import ApiError
from .schemas import A1111Img2Img, A1111Options, A1111Txt2Img, Limits

router = APIRouter(prefix="/sdapi/v1")


@router.post("/txt2img")
async def txt2img(body: A1111Txt2Img, request: Request):
    return await _generate(served(request), body, request)


@router.post("/img2img")
async def img2img(body: A1111Img2Img, request: Request):
    s = served(request)
    if len(body.init_images) != 1:
        raise ApiError(400, f"init_images: give one image, got {len(body.init_images)}")
    image, mask = await asyncio.to_thread(_inputs, body, s.limits)
    return await _generate(s, body, request, image=image, mask=mask)


@router.get("/sd-models")
async def sd_models(request: Request):
    return [{"title": name, "model_name": name, "hash": None, "sha256": None, "filename": str(ref),
             "config": None} for name, ref in served(request).worker.models.items()]


@router.get("/options")
async def get_options(request: Request):
    return {"sd_model_checkpoint": served(request).checkpoint}


@router.post("/options")
async def set_options(body: A1111Options, request: Request):
    s = served(request)
    if body.sd_model_checkpoint is not None:
        s.checkpoint = s.model_name(_checkpoint(body.sd_model_checkpoint, s.worker.models))
    return None


@router.get("/progress")
async def progress(request: Request):
    worker = served(request).worker
    snap = worker.progress.snapshot()
    steps, step = snap.get("steps") or 0, snap.get("step") or 0
    fraction = step / steps if steps else 0.0
    elapsed = time.monotonic() - snap["started"] if snap else 0.0
    eta = elapsed / fraction - elapsed if fraction > 0 else 0.0
    queued = worker.queue_depth()
    return {"progress": fraction, "eta_relative": eta,
            "state": {"skipped": False, "interrupted": False, "job": "txt2img" if snap else "",
                      "job_count": queued + (1 if snap else 0), "job_timestamp": "0", "job_no": 0,
                      "sampling_step": step, "sampling_steps": steps},
            "current_image": None, "textinfo": f"{snap.get('images', 0)} image(s), {queued} job(s) queued"
            if snap else None}


async def _generate(s: Served, body: A1111Txt2Img, request: Request, image=None, mask=None):
    """txt2img's and img2img's call: one job per image, the answer in A1111's shape (info as a JSON string)."""
    if body.enable_hr:
        raise ApiError(400, "enable_hr (hires fix) is not supported")
    count = body.batch_size * body.n_iter
    strength = body.denoising_strength if image is not None else None
    check_limits(s.limits, body.prompt, body.negative_prompt, count, body.steps, body.width, body.height)
    if image is not None:  # img2img's width and height sized the image, and are not the job's: checked here
        validate_request(1, body.height, body.width)
    if body.batch_size < 1 or body.n_iter < 1:
        raise ApiError(400, "batch_size and n_iter must be >= 1")
    checkpoint = body.override_settings.get("sd_model_checkpoint") or s.checkpoint
    model = s.model_name(_checkpoint(checkpoint, s.worker.models))
    scheduler = _scheduler(body.sampler_name or body.sampler_index, body.scheduler)
    seed = request_seed(None if body.seed == -1 else body.seed)
    if seed + count - 1 > MAX_SEED:
        raise ApiError(400, f"seed must be from 0 to {MAX_SEED - count + 1} for {count} images")
    settings = dict(steps=body.steps, guidance=body.cfg_scale, scheduler=scheduler)
    if image is not None:
        settings.update(image=image, mask=mask, strength=strength,
                        mask_blur=body.mask_blur if mask is not None else None)
    else:
        settings.update(height=body.height, width=body.width)
    # One job per image, seeded seed, seed+1, ... as A1111 seeds them: each image is reproducible alone by its
    # seed (ancestral samplers too, whose jobs run alone), and the worker batches the jobs into calls.
    jobs = [Job(model=model, prompt=body.prompt, negative_prompt=body.negative_prompt, n=1, seed=seed + i,
                settings=settings) for i in range(count)]
    results = await s.run(request, jobs)
    params = [r.params[0] for r in results]
    from ..outputs import png_parameters

    first = params[0]
    info = {"prompt": body.prompt, "all_prompts": [body.prompt] * count, "negative_prompt": body.negative_prompt,
            "all_negative_prompts": [body.negative_prompt] * count, "seed": seed,
            "all_seeds": [p["seed"] for p in params], "subseed": -1, "all_subseeds": [-1] * count,
            "steps": first["steps"], "cfg_scale": first["guidance"], "width": first["width"],
            "height": first["height"], "sampler_name": first["scheduler"], "batch_size": body.batch_size,
            "n_iter": body.n_iter, "sd_model_name": model, "sd_model_hash": None, "seed_resize_from_w": -1,
            "seed_resize_from_h": -1, "denoising_strength": first.get("strength"),
            "infotexts": [png_parameters(p, 0) for p in params], "job_timestamp": time.strftime("%Y%m%d%H%M%S"),
            "clip_skip": 1, "is_using_inpainting_conditioning": False}
    return await json_answer(lambda: {"images": [b64(p) for r in results for p in pngs(r)],
                                      "parameters": body.model_dump(mode="json"),
                                      "info": json.dumps(jsonable(info))})


def _inputs(body: A1111Img2Img, limits: Limits) -> tuple:
    """img2img's init image and mask decoded, the image resized to the asked size (A1111's resize mode 0: just
    resize), the mask inverted where asked and fitted to the image (on a thread: not the event loop)."""
    from PIL import Image, ImageOps

    image = decode_image(body.init_images[0], "init_images[0]", limits)
    mask = decode_image(body.mask, "mask", limits).convert("L") if body.mask else None
    if body.width and body.height and image.size != (body.width, body.height):
        check_limits(limits, "", "", 1, None, body.width, body.height)
        validate_request(1, body.height, body.width)  # the size it is resized to
        image = image.resize((body.width, body.height), Image.Resampling.LANCZOS)
    if mask is not None:
        if body.inpainting_mask_invert:
            mask = ImageOps.invert(mask)
        mask = mask.resize(image.size, Image.Resampling.LANCZOS) if mask.size != image.size else mask
    return image.convert("RGB"), mask


def _checkpoint(name: str, models) -> str:
    """A1111's checkpoint title ('name [hash]' or a file name) as a served model's name."""
    if name in models:
        return name
    stem = re.sub(r"\s*\[[0-9a-fA-F]+\]$", "", name)
    for served_name, ref in models.items():
        if stem in (served_name, str(ref)):
            return served_name
    return stem


def _scheduler(sampler: str | None, schedule: str | None) -> str | None:
    """A1111's sampler name ("Euler a", "DPM++ 2M Karras") and schedule type ("Automatic", "Karras") as one of
    sdaccel's schedulers; None: the model's own."""
    if not sampler:
        return None
    if schedule and schedule.strip().lower() not in ("automatic", "", "default"):
        if schedule.strip().lower() != "karras":
            raise ApiError(400, f"schedule type {schedule!r} is not supported (Automatic or Karras)")
        if "karras" not in sampler.lower():
            sampler = f"{sampler} Karras"
    return canonical(sampler)
