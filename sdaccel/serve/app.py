"""The HTTP layer of `sdaccel serve`: sdaccel's own API (routes_native.py), the OpenAI images API (routes_openai.py)
and a subset of A1111's (routes_a1111.py; progress, interrupt and skip: routes_progress.py) on a worker
(worker_api.WorkerBase: a Worker, or ProcessWorkers), with the page, health, readiness and metrics routes here.

Handlers only check the server's limits, submit jobs and answer: the worker's thread runs every pipeline call (and
resolves its request), request images are decoded and answer images encoded and the JSON rendered on other threads,
so the event loop never waits on the GPU, PIL or zlib. A handler awaits its jobs while watching its connection: a
client that goes away has its jobs cancelled (a queued job is dropped). Every bad request is a 4xx JSON
{error: {message, type}} (middleware.py). /health is 503 when no worker can serve (all worker processes down, or
loading failed), /ready 503 until one is ready, each with the reason; where an API key is set, a client without it
gets only their status (no model names, no failure text).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from . import routes_a1111, routes_a1111_info, routes_native, routes_networks, routes_openai, routes_progress
from .context import Served, served
from .loras import LoraFolder
from .metrics import Metrics
from .middleware import Gate, has_key, install_error_handlers
from .openapi import install_openapi
from .schemas import Limits
from .worker_api import WorkerBase


def create_app(worker: WorkerBase, *, api_key: str | None = None, limits: Limits = Limits(),
               request_timeout_s: float = 600.0, metrics: Metrics | None = None,
               stop_worker_on_shutdown: bool = True, loras: LoraFolder | None = None) -> FastAPI:
    """The FastAPI app serving `worker` (started by the caller). `metrics`: the Metrics the worker was built with
    (events=metrics), which /metrics shows; without one the app counts its requests and the queue in its own, and
    the worker's calls are not shown. `loras`: the LoRA files requests may name (--loras). Shutting down (SIGTERM
    under http_server.EdgeServer) gives in-flight requests --shutdown-timeout to finish, then aborts what is left
    (503s); the lifespan then stops the worker."""
    if metrics is None:
        metrics = Metrics()
    metrics.bind(worker)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if stop_worker_on_shutdown:
            await asyncio.to_thread(worker.stop, True)

    app = FastAPI(title="sdaccel", lifespan=lifespan)
    app.state.served = Served(worker=worker, limits=limits, request_timeout_s=request_timeout_s,
                              checkpoint=next(iter(worker.models)), loras=loras)
    app.state.worker, app.state.metrics, app.state.limits = worker, metrics, limits
    app.state.api_key = api_key.encode() if api_key else None  # the probes' detail needs it
    install_error_handlers(app)
    install_openapi(app)  # every route's statuses and error body in /openapi.json
    app.add_middleware(Gate, api_key=api_key, limits=limits, metrics=metrics)
    for router in (routes_native.router, routes_openai.router, routes_a1111.router, routes_a1111_info.router,
                   routes_progress.router, routes_networks.router, _probes):
        app.include_router(router)
    return app


_probes = APIRouter()


@_probes.get("/", include_in_schema=False)
async def page():
    """The web page: a prompt form, the images as they finish, the queue and throughput from /metrics."""
    from importlib.resources import files

    return HTMLResponse(files("sdaccel.serve").joinpath("static/index.html").read_text(encoding="utf-8"))


def _probe(request: Request, status: str, why: str | None, detail: dict) -> JSONResponse:
    """A probe's answer: 200 without `why`, else 503 with it as the error; `why` and `detail` (model names, each
    worker's state) only for a client with the API key, or for every client where none is set."""
    key = request.app.state.api_key
    shown = key is None or has_key({k.decode("latin-1").lower(): v for k, v in request.scope["headers"]}, key)
    body: dict = {"status": status}
    if shown:
        if why is not None:
            body["error"] = {"message": why, "type": status}
        body.update(detail)
    return JSONResponse(body, status_code=200 if why is None else 503)


@_probes.get("/health")
async def health(request: Request):
    """200 while a worker serves or will once loaded; 503 when none can (every worker process down, the worker's
    thread gone, loading failed)."""
    worker = served(request).worker
    why = worker.unhealthy_reason()
    return _probe(request, "ok" if why is None else "unhealthy", why, {"workers": worker.worker_states()})


@_probes.get("/ready")
async def ready(request: Request):
    """200 while a worker is ready to take jobs; 503 with the reason (loading, restarting, failed) otherwise."""
    worker = served(request).worker
    why = worker.not_ready_reason()
    return _probe(request, "ready" if why is None else "not_ready", why,
                  {"models": list(worker.models), "workers": worker.worker_states()})


@_probes.get("/metrics")
async def metrics_route(request: Request):
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
