"""The HTTP layer of `sdaccel serve`: sdaccel's own API, the OpenAI images API and a subset of A1111's, on a Worker.

Handlers only validate, submit jobs and answer: the worker's thread runs every pipeline call, and the images are
encoded and the JSON rendered on other threads, so the event loop never waits on the GPU or on zlib. A handler awaits
its jobs while watching its connection: a client that goes away has its jobs cancelled (a queued job is dropped). Every
bad request is a 4xx JSON {error: {message, type}} (middleware.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import math
import random
import re
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..request import MAX_SEED, validate_request
from ..schedulers import canonical
from .jobs import Job, JobResult
from .metrics import Metrics
from .middleware import ApiError, ClientGone, Gate, error_response, install_error_handlers
from .png import encode_image
from .schemas import A1111Img2Img, A1111Options, A1111Txt2Img, GenerateRequest, Limits, OpenAIImageRequest
from .worker import WorkerEvents

POLL_S = 0.2  # how often a waiting handler checks that its client is still there
# zlib level of the PNGs served: latency first, as it is added to every request. For a 512x512 RGB image of noise
# (synthetic weights) Pillow took 37 ms at its default (6) and 29 ms at 1 on one CPU core, the files within 0.1%;
# png.py's writer takes 12 ms at 1 on two cores.
PNG_COMPRESS_LEVEL = 1


def create_app(worker, *, api_key: str | None = None, limits: Limits = Limits(), request_timeout_s: float = 600.0,
               metrics: Metrics | None = None, stop_worker_on_shutdown: bool = True) -> FastAPI:
    """The FastAPI app serving `worker` (started by the caller). `metrics`: the Metrics the worker was built with
    (events=metrics); without one the app makes its own, which a worker built without events reports to.
    Shutting down (SIGTERM under uvicorn) finishes in-flight requests, then stops the worker after its queued jobs."""
    if metrics is None:
        metrics = Metrics()
    if type(worker.events) is WorkerEvents:  # a worker built without events= reports to the app's metrics
        worker.events = metrics
    metrics.bind(worker)
    state = {"checkpoint": next(iter(worker.models))}  # A1111's sd_model_checkpoint: txt2img's default model

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if stop_worker_on_shutdown:
            await asyncio.to_thread(worker.stop, True)

    app = FastAPI(title="sdaccel", lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.limits = worker, metrics, limits
    install_error_handlers(app)
    app.add_middleware(Gate, api_key=api_key, limits=limits, metrics=metrics)

    def model_name(name: str | None) -> str:
        if name is None or name == "":
            return next(iter(worker.models))
        if name not in worker.models:
            raise ApiError(404, f"unknown model {name!r}; served: {', '.join(worker.models)}", "not_found_error")
        return name

    async def run(request: Request, jobs: list[Job]) -> list[JobResult]:
        deadline = time.monotonic() + request_timeout_s
        for job in jobs:
            job.deadline = deadline
        return await _await_jobs(request, worker, jobs)

    # --------------------------------------------------------------------------------------------- sdaccel's own

    @app.post("/v1/generate")
    async def generate(body: GenerateRequest, request: Request):
        _check(limits, body.prompt, body.negative_prompt, body.n, body.steps, body.width, body.height,
               body.guidance, body.strength)
        _check_names(body.scheduler, body.timestep_spacing, body.preset)
        if body.response_format == "png" and body.n != 1:
            raise ApiError(400, "response_format png returns one image: use n = 1, or b64_json")
        if body.response_format == "png" and body.output_format != "png":
            raise ApiError(400, f"response_format png returns a PNG: use b64_json for output_format "
                                f"{body.output_format}")
        image = _decode_image(body.image, "image", limits) if body.image else None
        mask = _decode_image(body.mask, "mask", limits) if body.mask else None
        settings = dict(steps=body.steps, guidance=body.guidance, height=body.height, width=body.width,
                        scheduler=body.scheduler, timestep_spacing=body.timestep_spacing, preset=body.preset,
                        image=image, mask=mask, strength=body.strength,
                        mask_blur=body.mask_blur if mask is not None else None,
                        keep_unmasked=body.keep_unmasked if mask is not None else None)
        job = Job(model=model_name(body.model), prompt=body.prompt, negative_prompt=body.negative_prompt, n=body.n,
                  seed=_seed(body.seed), settings=settings)
        (result,) = await run(request, [job])
        request.state.images = len(result.images)
        if body.response_format == "png":
            return Response(await asyncio.to_thread(lambda: _encoded(result)[0]), media_type="image/png")
        return await _json_answer(lambda: {
            "images": [_b64(p) for p in _encoded(result, body.output_format, body.output_compression)],
            "output_format": body.output_format,
            "parameters": [_jsonable(dict(p, batch_index=i)) for i, p in enumerate(result.params)],
            "timings": result.timings, "batch_images": result.batch_images, "queued_s": result.queued_s})

    # ------------------------------------------------------------------------------------------------- OpenAI

    @app.post("/v1/images/generations")
    async def openai_generations(body: OpenAIImageRequest, request: Request):
        if body.response_format not in (None, "b64_json"):
            raise ApiError(400, f"response_format {body.response_format!r} is not supported: this server returns "
                                f"images inline only, use response_format='b64_json'")
        width, height = _size(body.size)
        _check(limits, body.prompt, body.negative_prompt, body.n, body.steps, width, height, body.guidance)
        _check_names(body.scheduler)
        job = Job(model=model_name(body.model), prompt=body.prompt, negative_prompt=body.negative_prompt, n=body.n,
                  seed=_seed(body.seed), settings=dict(steps=body.steps, guidance=body.guidance, height=height,
                                                       width=width, scheduler=body.scheduler))
        (result,) = await run(request, [job])
        request.state.images = len(result.images)
        return await _json_answer(lambda: {
            "created": int(time.time()), "output_format": body.output_format,
            "data": [{"b64_json": _b64(p), "revised_prompt": body.prompt}
                     for p in _encoded(result, body.output_format, body.output_compression)]})

    # --------------------------------------------------------------------------------------------------- A1111

    async def a1111(body: A1111Txt2Img, request: Request, image=None, mask=None) -> dict:
        if body.enable_hr:
            raise ApiError(400, "enable_hr (hires fix) is not supported")
        count = body.batch_size * body.n_iter
        strength = body.denoising_strength if image is not None else None
        _check(limits, body.prompt, body.negative_prompt, count, body.steps, body.width, body.height, body.cfg_scale,
               strength)
        if body.batch_size < 1 or body.n_iter < 1:
            raise ApiError(400, "batch_size and n_iter must be >= 1")
        checkpoint = body.override_settings.get("sd_model_checkpoint") or state["checkpoint"]
        model = model_name(_checkpoint(checkpoint, worker.models))
        scheduler = _a1111_scheduler(body.sampler_name or body.sampler_index, body.scheduler)
        seed = _seed(None if body.seed == -1 else body.seed)
        if seed + count - 1 > MAX_SEED:
            raise ApiError(400, f"seed must be from 0 to {MAX_SEED - count + 1} for {count} images")
        settings = dict(steps=body.steps, guidance=body.cfg_scale, scheduler=scheduler)
        if image is not None:
            settings.update(image=image, mask=mask, strength=strength,
                            mask_blur=body.mask_blur if mask is not None else None)
        else:
            settings.update(height=body.height, width=body.width)
        # One job per image, seeded seed, seed+1, ... as A1111 seeds them: each image is reproducible alone by its
        # seed, and the worker batches the jobs into calls.
        jobs = [Job(model=model, prompt=body.prompt, negative_prompt=body.negative_prompt, n=1, seed=seed + i,
                    settings=settings) for i in range(count)]
        results = await run(request, jobs)
        request.state.images = count
        params = [r.params[0] for r in results]
        from ..generate_cli import png_parameters

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
        return await _json_answer(lambda: {"images": [_b64(p) for r in results for p in _pngs(r)],
                                           "parameters": body.model_dump(mode="json"),
                                           "info": json.dumps(_jsonable(info))})

    @app.post("/sdapi/v1/txt2img")
    async def txt2img(body: A1111Txt2Img, request: Request):
        return await a1111(body, request)

    @app.post("/sdapi/v1/img2img")
    async def img2img(body: A1111Img2Img, request: Request):
        if len(body.init_images) != 1:
            raise ApiError(400, f"init_images: give one image, got {len(body.init_images)}")
        image = _decode_image(body.init_images[0], "init_images[0]", limits)
        mask = _decode_image(body.mask, "mask", limits).convert("L") if body.mask else None
        if body.width and body.height and image.size != (body.width, body.height):
            _check(limits, "", "", 1, None, body.width, body.height)
            image = image.resize((body.width, body.height), _lanczos())  # A1111's resize mode 0: just resize
        if mask is not None:
            if body.inpainting_mask_invert:
                from PIL import ImageOps

                mask = ImageOps.invert(mask)
            mask = mask.resize(image.size, _lanczos()) if mask.size != image.size else mask
        return await a1111(body, request, image=image.convert("RGB"), mask=mask)

    @app.get("/sdapi/v1/sd-models")
    async def sd_models():
        return [{"title": name, "model_name": name, "hash": None, "sha256": None, "filename": str(ref),
                 "config": None} for name, ref in worker.models.items()]

    @app.get("/sdapi/v1/options")
    async def get_options():
        return {"sd_model_checkpoint": state["checkpoint"]}

    @app.post("/sdapi/v1/options")
    async def set_options(body: A1111Options):
        if body.sd_model_checkpoint is not None:
            state["checkpoint"] = model_name(_checkpoint(body.sd_model_checkpoint, worker.models))
        return None

    @app.get("/sdapi/v1/progress")
    async def progress():
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

    # ------------------------------------------------------------------------------------------ health, metrics

    @app.get("/", include_in_schema=False)
    async def page():
        """The web page: a prompt form, the images as they finish, the queue and throughput from /metrics."""
        from importlib.resources import files

        return HTMLResponse(files("sdaccel.serve").joinpath("static/index.html").read_text(encoding="utf-8"))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if worker.ready():
            return {"status": "ready", "models": list(worker.models)}
        why = f"the worker failed to start: {worker.failure}" if worker.failure else "loading and warming the models"
        return error_response(503, why, "not_ready")

    @app.get("/metrics")
    async def metrics_route():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


# ---------------------------------------------------------------------------------------------------- jobs


async def _await_jobs(request: Request, worker, jobs: list[Job]) -> list[JobResult]:
    """Submit `jobs` and wait for all of them, cancelling them all when one fails or the client goes away. The
    asyncio wrappers are never cancelled: that would cancel the worker's futures under it."""
    futures = []
    try:
        for job in jobs:
            futures.append(asyncio.wrap_future(worker.submit(job)))
    except BaseException:
        for job in jobs:
            job.cancel()
        raise
    for future in futures:  # a dropped job's error is read here, not reported as "never retrieved"
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
    pending = set(futures)
    while pending:
        done, pending = await asyncio.wait(pending, timeout=POLL_S, return_when=asyncio.FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            for job in jobs:
                job.cancel()
            raise failed[0].exception()
        if pending and await request.is_disconnected():
            for job in jobs:
                job.cancel()
            raise ClientGone()
    return [f.result() for f in futures]


def _check(limits: Limits, prompt: str, negative: str, n: int, steps: int | None, width: int | None,
           height: int | None, guidance: float | None = None, strength: float | None = None) -> None:
    """The request against the server's limits and the pipeline's own checks, before anything is queued."""
    for name, text in (("prompt", prompt), ("negative_prompt", negative)):
        if len(text) > limits.max_prompt_chars:
            raise ApiError(400, f"{name} is {len(text)} characters; the limit is {limits.max_prompt_chars}")
    if not 1 <= n <= limits.max_n:
        raise ApiError(400, f"n must be from 1 to {limits.max_n} images per request, got {n}")
    if steps is not None and steps > limits.max_steps:
        raise ApiError(400, f"steps must be at most {limits.max_steps}, got {steps}")
    for name, side in (("width", width), ("height", height)):
        if side is not None and side > limits.max_side:
            raise ApiError(400, f"{name} must be at most {limits.max_side} pixels, got {side}")
    validate_request(1 if steps is None else steps, height, width, n, guidance, 0, strength)


def _check_names(scheduler: str | None, timestep_spacing: str | None = None, preset: str | None = None) -> None:
    """Scheduler, timestep spacing and preset names checked now: the worker reads them to batch jobs."""
    from ..presets import get_preset
    from ..schedulers import TIMESTEP_SPACINGS

    if scheduler is not None:
        canonical(scheduler)
    if timestep_spacing is not None and timestep_spacing not in TIMESTEP_SPACINGS:
        raise ApiError(400, f"timestep_spacing must be one of {', '.join(TIMESTEP_SPACINGS)}, got {timestep_spacing!r}")
    if preset is not None:
        get_preset(preset)


def _seed(seed: int | None) -> int:
    """The request's seed, or a random one (as OpenAI's API and A1111's -1 draw one per request)."""
    if seed is None:
        return random.SystemRandom().randrange(2**32)
    if not 0 <= seed <= MAX_SEED:
        raise ApiError(400, f"seed must be from 0 to {MAX_SEED}, got {seed}")
    return seed


def _size(size: str | None) -> tuple[int | None, int | None]:
    """OpenAI's size "WxH" as (width, height); None or "auto": the model's own."""
    if size is None or size == "auto":
        return None, None
    match = re.fullmatch(r"\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*", size)
    if not match:
        raise ApiError(400, f"size must be 'WIDTHxHEIGHT' (e.g. '512x512') or 'auto', got {size!r}")
    return int(match.group(1)), int(match.group(2))


def _checkpoint(name: str, models) -> str:
    """A1111's checkpoint title ('name [hash]' or a file name) as a served model's name."""
    if name in models:
        return name
    stem = re.sub(r"\s*\[[0-9a-fA-F]+\]$", "", name)
    for served, ref in models.items():
        if stem in (served, str(ref)):
            return served
    return stem


def _a1111_scheduler(sampler: str | None, schedule: str | None) -> str | None:
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


def _decode_image(data: str, what: str, limits: Limits):
    """A base64 image (a data: URL's prefix allowed) as a PIL image, its size checked before its pixels load."""
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


def _lanczos():
    from PIL import Image

    return Image.Resampling.LANCZOS


def _encoded(result: JobResult, output_format: str = "png", quality: int = 100) -> list[bytes]:
    """The result's images as files: PNG with its 'parameters' text (_pngs), or JPEG or WebP at `quality`, whose
    parameters travel in the JSON answer. For a 512x512 image of noise: JPEG at quality 90 3.6 ms, at 100 18.6 ms,
    WebP 130-180 ms (the smallest files on photographs, not the fastest) on one CPU core; PNG 12 ms on two."""
    if output_format == "png":
        return _pngs(result)
    out = []
    for image in result.images:
        buffer = io.BytesIO()
        image.save(buffer, format=output_format.upper(), quality=quality)
        out.append(buffer.getvalue())
    return out


def _pngs(result: JobResult) -> list[bytes]:
    """The result's images as PNG bytes with their 'parameters' text."""
    from ..generate_cli import png_parameters

    return [encode_image(image, {"parameters": png_parameters(params, i)}, PNG_COMPRESS_LEVEL)
            for i, (image, params) in enumerate(zip(result.images, result.params))]


async def _json_answer(build: Callable[[], dict]) -> Response:
    """A JSON response built and rendered off the event loop: base64 and JSON text of a 512x512 PNG take about
    7 ms on one core, and the loop would answer nothing else (a 429, a health check) meanwhile."""
    def render() -> bytes:
        return json.dumps(build(), allow_nan=False, separators=(",", ":")).encode("ascii")

    return Response(await asyncio.to_thread(render), media_type="application/json")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _jsonable(value: Any) -> Any:
    """Parameters as JSON: numbers, strings, lists and dicts kept, anything else as its text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)
