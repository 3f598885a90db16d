"""A1111's read-only endpoints that clients call before or beside a generation: the samplers and schedule types a
request may name, memory, the parameters written into a PNG, and the (empty) lists of styles and VAEs this server
offers. webuiapi's get_samplers(), get_schedulers(), get_memory(), png_info() and friends read these."""

from __future__ import annotations

import asyncio
import re

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from .a1111_fields import SAMPLERS, SCHEDULE_TYPES
from .context import served
from .encoding import decode_image

router = APIRouter(prefix="/sdapi/v1")


class PngInfoRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # strict: false is not 0, "64" is not 64

    image: str  # base64, with or without a data: URL prefix


@router.get("/samplers")
async def samplers():
    return [{"name": label, "aliases": aliases, "options": {"scheduler": "karras"} if name.endswith("karras") else {}}
            for label, (name, aliases) in SAMPLERS.items()]


@router.get("/schedulers")
async def schedulers():
    return [{"name": name, "label": label, "aliases": None, "default_rho": -1.0, "need_inner_model": False}
            for name, label in SCHEDULE_TYPES.items()]


@router.get("/prompt-styles")
async def prompt_styles():
    return []  # no styles are stored: a request naming one is refused (a1111_fields)


@router.get("/sd-vae")
async def sd_vae():
    return []  # each model runs its own VAE ("Automatic")


@router.get("/memory")
async def memory(request: Request):
    """A1111's shape: this host's RAM, and per worker process its memory (sdaccel's own figures), or this
    process's CUDA device's, or an error where there is none."""
    import psutil

    ram = psutil.virtual_memory()
    answer = {"ram": {"free": ram.available, "used": ram.total - ram.available, "total": ram.total}}
    workers = served(request).worker.memory()
    if workers is not None:
        answer["workers"] = workers
    answer["cuda"] = _cuda_memory()
    return answer


def _cuda_memory() -> dict:
    try:
        import torch

        if not torch.cuda.is_available():
            return {"error": "no CUDA device in the server process"}
        free, total = torch.cuda.mem_get_info()
        stats = torch.cuda.memory_stats()
        return {"system": {"free": free, "used": total - free, "total": total},
                "active": {"current": stats.get("active_bytes.all.current", 0),
                           "peak": stats.get("active_bytes.all.peak", 0)},
                "allocated": {"current": stats.get("allocated_bytes.all.current", 0),
                              "peak": stats.get("allocated_bytes.all.peak", 0)},
                "reserved": {"current": stats.get("reserved_bytes.all.current", 0),
                             "peak": stats.get("reserved_bytes.all.peak", 0)}}
    except Exception as exc:  # noqa: BLE001 - A1111 answers the error as the figure
        return {"error": str(exc)}


@router.post("/png-info")
async def png_info(body: PngInfoRequest, request: Request):
    """The image's text chunks: 'parameters' as info and parsed (A1111's infotext), the others as items."""
    image = await asyncio.to_thread(decode_image, body.image, "image", served(request).limits)
    items = {k: v for k, v in image.info.items() if isinstance(v, str)}
    info = items.pop("parameters", "")
    return {"info": info, "items": items, "parameters": parse_infotext(info)}


_PAIR = re.compile(r'\s*([\w][\w \-/]*):\s*("(?:\\.|[^\\"])*"|[^,]*)(?:,|$)')


def parse_infotext(text: str) -> dict:
    """A1111's infotext: the prompt, 'Negative prompt: ...', then one line of 'Key: value, ...' pairs, numbers read
    as numbers and "quoted" values unquoted."""
    if not text:
        return {}
    lines = text.strip().split("\n")
    settings = lines.pop() if len(_PAIR.findall(lines[-1])) >= 3 else ""
    prompt, negative, in_negative = [], [], False
    for line in lines:
        if line.startswith("Negative prompt:"):
            in_negative, line = True, line[len("Negative prompt:"):].strip()
        (negative if in_negative else prompt).append(line)
    out: dict = {"Prompt": "\n".join(prompt), "Negative prompt": "\n".join(negative)}
    for key, value in _PAIR.findall(settings):
        value = value.strip()
        if value.startswith('"') and value.endswith('"') and len(value) > 1:
            value = value[1:-1].replace('\\"', '"')
        out[key.strip()] = _number(value)
    return out


def _number(value: str):
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value
