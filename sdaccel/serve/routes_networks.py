"""The served LoRAs and ControlNets as A1111 and its ControlNet extension list them: GET /sdapi/v1/loras, POST
/sdapi/v1/refresh-loras (the --loras folder read again), GET /controlnet/model_list and /controlnet/module_list (what
webuiapi's controlnet_model_list and controlnet_module_list read), the served IP-Adapters and their preprocessors
among them, as the extension lists them."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from .a1111_controlnet import module_details, preprocessors
from .a1111_ip_adapter import CLIP_MODULES
from .context import served

router = APIRouter()


@router.get("/sdapi/v1/loras")
async def loras(request: Request):
    folder = served(request).loras
    return folder.listing() if folder is not None else []


@router.post("/sdapi/v1/refresh-loras")
async def refresh_loras(request: Request):
    folder = served(request).loras
    if folder is not None:
        await asyncio.to_thread(folder.refresh)
    return None


@router.get("/controlnet/model_list")
async def controlnet_models(request: Request):
    worker = served(request).worker
    names = [name for name in worker.controlnets
             if any(name in nets for nets in worker.model_controlnets.values())]
    names += [name for name in worker.ip_adapters
              if any(name in adapters for adapters in worker.model_ip_adapters.values())]
    return {"model_list": names}


@router.get("/controlnet/module_list")
async def controlnet_modules(request: Request):
    modules, details = preprocessors(), module_details()
    if served(request).worker.ip_adapters:  # the extension's CLIP preprocessors, which have no sliders
        modules += list(CLIP_MODULES)
        details.update({name: {"model_free": False, "sliders": []} for name in CLIP_MODULES})
    return {"module_list": modules, "module_detail": details}
