"""sdaccel's own API: POST /v1/generate, Pipeline.generate's settings as JSON (schemas.GenerateRequest), answered
with the images as base64 (PNG, JPEG or WebP) and each image's parameters, or with one PNG itself."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .context import check_limits, request_seed, served
from .encoding import b64, decode_image, encoded, json_answer, jsonable
from .jobs import Job
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
    image = mask = None
    if body.image or body.mask:
        image, mask = await asyncio.to_thread(_inputs, body, s.limits)
    settings = dict(steps=body.steps, guidance=body.guidance, height=body.height, width=body.width,
                    scheduler=body.scheduler, timestep_spacing=body.timestep_spacing, preset=body.preset,
                    image=image, mask=mask, strength=body.strength,
                    mask_blur=body.mask_blur if mask is not None else None,
                    keep_unmasked=body.keep_unmasked if mask is not None else None,
                    prompt_syntax=body.prompt_syntax if body.prompt_syntax != "a1111" else None)
    job = Job(model=s.model_name(body.model), prompt=body.prompt, negative_prompt=body.negative_prompt, n=body.n,
              seed=request_seed(body.seed), settings=settings)
    (result,) = await s.run(request, [job])
    if body.response_format == "png":
        return Response(await asyncio.to_thread(lambda: encoded(result)[0]), media_type="image/png")
    return await json_answer(lambda: {
        "images": [b64(p) for p in encoded(result, body.output_format, body.output_compression)],
        "output_format": body.output_format,
        "parameters": [jsonable(dict(p, batch_index=i)) for i, p in enumerate(result.params)],
        "timings": result.timings, "batch_images": result.batch_images, "queued_s": result.queued_s})


def _inputs(body: GenerateRequest, limits: Limits) -> tuple:
    """The request's init image and mask, decoded (on a thread: not the event loop)."""
    image = decode_image(body.image, "image", limits) if body.image else None
    mask = decode_image(body.mask, "mask", limits) if body.mask else None
    return image, mask
