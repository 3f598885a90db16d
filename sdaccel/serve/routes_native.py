"""sdaccel's own API: POST /v1/generate, Pipeline.generate's settings as JSON (schemas.GenerateRequest), with the
served LoRAs by name (`loras`, `<lora:name:w>` tags), ControlNet units (`controlnet`: controlnets.py) and image
prompts (`ip_adapter`: ip_adapters.py), answered with the images as base64 (PNG, JPEG or WebP) and each image's
parameters, or with one PNG itself."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..pipeline.hires import HIRES_KEYWORDS, check_hires_settings
from .a1111_hires import check_hires_limits
from .context import check_limits, request_seed, served
from .encoding import b64, decode_image, encoded, json_answer, jsonable
from .controlnets import ControlUnit, control_settings
from .ip_adapters import ImagePromptUnit, image_prompt_settings
from .jobs import Job
from .loras import keep_request_prompt, request_loras
from .middleware import ApiError
from .schemas import GenerateRequest, Limits

router = APIRouter()


@router.post("/v1/generate")
async def generate(body: GenerateRequest, request: Request):
    s = served(request)
    check_limits(s.limits, body.prompt, body.negative_prompt, body.n, body.steps, body.width, body.height)
    if body.response_format == "png" and body.n != 1:
        raise ApiError(400, "response_format png returns one image: use n = 1, or b64_json")
    if body.response_format == "png" and body.output_format != "png":
        raise ApiError(400, f"response_format png returns a PNG: use b64_json for output_format {body.output_format}")
    model = s.model_name(body.model)
    # <lora:name:w> tags come out of the prompt (with prompt_syntax "none" they are text), joining the loras field
    prompt, loras = request_loras(s.loras, body.prompt, body.loras, tags=body.prompt_syntax != "none")
    image = mask = None
    if body.image or body.mask:
        image, mask = await asyncio.to_thread(_inputs, body, s.limits)
    settings = dict(steps=body.steps, guidance=body.guidance, height=body.height, width=body.width,
                    scheduler=body.scheduler, timestep_spacing=body.timestep_spacing, preset=body.preset,
                    image=image, mask=mask, strength=body.strength,
                    mask_blur=body.mask_blur if mask is not None else None,
                    keep_unmasked=body.keep_unmasked if mask is not None else None,
                    prompt_syntax=body.prompt_syntax if body.prompt_syntax != "a1111" else None,
                    clip_skip=body.clip_skip or None, subseed_strength=body.subseed_strength or None)
    hires = {name: getattr(body, name) for name in HIRES_KEYWORDS if getattr(body, name) is not None}
    if "hires_size" in hires:
        hires["hires_size"] = tuple(hires["hires_size"])  # JSON's list as the (width, height) the pipeline takes
    if hires:  # hires fix: checked here against the server's limits, before it is queued
        check_hires_settings(*(hires.get(k) for k in ("hires_scale", "hires_size", "hires_upscaler", "hires_steps",
                                                       "hires_strength")))
        check_hires_limits(s.limits, hires, body.width, body.height, s.worker.models[model])
        settings.update(hires)
    if body.controlnet:
        settings.update(await asyncio.to_thread(_control, body, s, model))
    if body.ip_adapter:
        settings.update(await asyncio.to_thread(_image_prompts, body, s, model))
    job = Job(model=model, prompt=prompt, negative_prompt=body.negative_prompt, n=body.n,
              seed=request_seed(body.seed), settings=settings, loras=loras,
              subseed=request_seed(body.subseed) if body.subseed_strength else None)
    (result,) = await s.run(request, [job])
    keep_request_prompt([result], body.prompt)
    if body.response_format == "png":
        return Response(await asyncio.to_thread(lambda: encoded(result)[0]), media_type="image/png")
    return await json_answer(lambda: {
        "images": [b64(p) for p in encoded(result, body.output_format, body.output_compression)],
        "output_format": body.output_format,
        "parameters": [jsonable(dict(p, batch_index=i)) for i, p in enumerate(result.params)],
        "timings": result.timings, "batch_images": result.batch_images, "queued_s": result.queued_s})


def _control(body: GenerateRequest, s, model: str) -> dict:
    """The ControlNet keywords of the request's units, their images decoded (on a thread: not the event loop)."""
    units = [ControlUnit(unit.model, decode_image(unit.image, f"controlnet[{k}].image", s.limits), unit.scale,
                         unit.start, unit.end) for k, unit in enumerate(body.controlnet)]
    return control_settings(units, s.worker.model_controlnets.get(model, []), model)


def _image_prompts(body: GenerateRequest, s, model: str) -> dict:
    """The IP-Adapter keywords of the request's image prompts, their images decoded (on a thread)."""
    units = [ImagePromptUnit(unit.name, decode_image(unit.image, f"ip_adapter[{k}].image", s.limits), unit.scale,
                             where=f"ip_adapter[{k}]") for k, unit in enumerate(body.ip_adapter)]
    return image_prompt_settings(units, s.worker.model_ip_adapters.get(model, []), model)


def _inputs(body: GenerateRequest, limits: Limits) -> tuple:
    """The request's init image and mask, decoded (on a thread: not the event loop)."""
    image = decode_image(body.image, "image", limits) if body.image else None
    mask = decode_image(body.mask, "mask", limits) if body.mask else None
    return image, mask
