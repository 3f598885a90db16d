"""The bytes of `sdaccel serve`'s answers and the images its requests carry: images as PNG (with their 'parameters'
text), JPEG or WebP files, base64, JSON rendered off the event loop; and base64 images decoded, their size checked
before their pixels load."""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import math
from typing import Any, Callable

from fastapi.responses import Response

from .jobs import JobResult
from .middleware import ApiError
from .png import encode_image
from .schemas import Limits

# zlib level of the PNGs served: latency first, as it is added to every request. For a 512x512 RGB image of noise
# (synthetic weights) Pillow took 37 ms at its default (6) and 29 ms at 1 on one CPU core, the files within 0.1%;
# png.py's writer takes 12 ms at 1 on two cores.
PNG_COMPRESS_LEVEL = 1


def encoded(result: JobResult, output_format: str = "png", quality: int = 100) -> list[bytes]:
    """The result's images as files: PNG with its 'parameters' text (pngs), or JPEG or WebP at `quality`, whose
    parameters travel in the JSON answer. For a 512x512 image of noise: JPEG at quality 90 3.6 ms, at 100 18.6 ms,
    WebP 130-180 ms (the smallest files on photographs, not the fastest) on one CPU core; PNG 12 ms on two."""
    if output_format == "png":
        return pngs(result)
    out = []
    for image in result.images:
        buffer = io.BytesIO()
        image.save(buffer, format=output_format.upper(), quality=quality)
        out.append(buffer.getvalue())
    return out


def pngs(result: JobResult) -> list[bytes]:
    """The result's images as PNG bytes, each with its own 'parameters' text (its seed among them)."""
    from ..outputs import png_parameters

    return [encode_image(image, {"parameters": png_parameters(params, i)}, PNG_COMPRESS_LEVEL)
            for i, (image, params) in enumerate(zip(result.images, result.params))]


async def json_answer(build: Callable[[], dict]) -> Response:
    """A JSON response built and rendered off the event loop: base64 and JSON text of a 512x512 PNG take about
    7 ms on one core, and the loop would answer nothing else (a 429, a health check) meanwhile."""
    def render() -> bytes:
        return json.dumps(build(), allow_nan=False, separators=(",", ":")).encode("ascii")

    return Response(await asyncio.to_thread(render), media_type="application/json")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def jsonable(value: Any) -> Any:
    """Parameters as JSON: numbers, strings, lists and dicts kept, anything else as its text."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def decode_image(data: str, what: str, limits: Limits):
    """A base64 image (a data: URL's prefix allowed) as a PIL image, its size checked before its pixels load.
    Decoding takes tens of ms for a large image: handlers call it off the event loop."""
    from PIL import Image

    text = data.split(",", 1)[1] if data.startswith("data:") else data
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{what}: not valid base64") from None
    try:
        image = Image.open(io.BytesIO(raw))
        if max(image.size) > limits.max_side:
            raise ApiError(400, f"{what}: {image.size[0]}x{image.size[1]} is larger than {limits.max_side} pixels")
        image.load()
    except ApiError:
        raise
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds for a bad file
        raise ApiError(400, f"{what}: not an image PIL can read ({exc.__class__.__name__})") from None
    return image
