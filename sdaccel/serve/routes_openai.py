"""OpenAI's images API: POST /v1/images/generations (the openai client's images.generate), with sdaccel's settings
(steps, seed, scheduler, ...) at the top level of the body (the client's extra_body). Images come back inline only
(b64_json), each PNG's 'parameters' naming its own seed."""

from __future__ import annotations

import re
import time

from fastapi import APIRouter, Request

from .context import check_limits, request_seed, served
from .encoding import b64, encoded, json_answer
from .jobs import Job
from .loras import keep_request_prompt, request_loras
from .middleware import ApiError
from .schemas import OpenAIImageRequest, is_neutral

router = APIRouter()

# OpenAI's fields sdaccel does not honour: accepted only at the values that change nothing.
NEUTRAL = {"quality": (None, "auto", "standard"), "style": (None,), "background": (None, "auto", "opaque"),
           "stream": (None, False), "partial_images": (None, 0)}


def check_fields(body: OpenAIImageRequest) -> None:
    unknown = sorted(body.model_extra or {})
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(unknown)}: not an images API field sdaccel knows")
    for name, neutral in NEUTRAL.items():
        value = getattr(body, name)
        if not is_neutral(value, neutral):
            raise ApiError(400, f"{name}={value!r} is not supported here (accepted: "
                                f"{', '.join(repr(v) for v in neutral if v is not None)})")


@router.post("/v1/images/generations")
async def generations(body: OpenAIImageRequest, request: Request):
    s = served(request)
    check_fields(body)
    if body.response_format not in (None, "b64_json"):
        raise ApiError(400, f"response_format {body.response_format!r} is not supported: this server returns "
                            f"images inline only, use response_format='b64_json'")
    width, height = _size(body.size)
    check_limits(s.limits, body.prompt, body.negative_prompt, body.n, body.steps, width, height)
    prompt, loras = request_loras(s.loras, body.prompt)  # <lora:name:w> tags, as every API reads them
    job = Job(model=s.model_name(body.model), prompt=prompt, negative_prompt=body.negative_prompt, n=body.n,
              seed=request_seed(body.seed), settings=dict(steps=body.steps, guidance=body.guidance, height=height,
                                                          width=width, scheduler=body.scheduler), loras=loras)
    (result,) = await s.run(request, [job])
    keep_request_prompt([result], body.prompt)
    return await json_answer(lambda: {
        "created": int(time.time()), "output_format": body.output_format,
        "data": [{"b64_json": b64(p), "revised_prompt": body.prompt}
                 for p in encoded(result, body.output_format, body.output_compression)]})


def _size(size: str | None) -> tuple[int | None, int | None]:
    """OpenAI's size "WxH" as (width, height); None or "auto": the model's own."""
    if size is None or size == "auto":
        return None, None
    match = re.fullmatch(r"\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*", size)
    if not match:
        raise ApiError(400, f"size must be 'WIDTHxHEIGHT' (e.g. '512x512') or 'auto', got {size!r}")
    return int(match.group(1)), int(match.group(2))
