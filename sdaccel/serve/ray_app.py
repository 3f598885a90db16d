"""Scale-out on Ray Serve: `sdaccel serve --ray --replicas N` runs N replicas of the same worker and HTTP app, one
GPU each (`num_gpus=1`: Ray sets each replica's CUDA_VISIBLE_DEVICES), behind Ray Serve's HTTP proxy, which spreads
requests over them. Each replica batches its own requests as a single server does; nothing here schedules or
places work itself: that is Ray's. Needs `pip install 'ray[serve]'`; runs locally (a Ray instance started for it) or
on a cluster (`--ray-address auto`, or a Serve config file: see docs).

Ray hands a replica each request as a Starlette Request; the replica passes it through its app as ASGI (the same
routes, limits, API key and errors as `sdaccel serve`) and returns the app's response.

Overload is refused at two places, both with 429 and Retry-After. Ray's proxy sends a replica at most max_queue +
max_batch requests at once (a full queue and a full running call), so a replica's worker refuses one itself (with the
app's JSON error) only when its running call holds fewer. Requests beyond what the replicas hold wait in Ray's proxy,
at most max_queue of them (Serve's max_queued_requests, counted per proxy); beyond, the proxy refuses at once. Ray
Serve answers that refusal (a BackPressureError) 503 by default; its backpressure_config (in Ray 2.60) makes it 429
with a Retry-After of PROXY_RETRY_AFTER_S, its body Ray's plain text "Request dropped due to backpressure (...)". A
Ray without backpressure_config keeps the 503.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ReplicaSettings:
    """What every replica builds its worker and app from (plain values: Ray sends them to each replica)."""

    models: dict[str, str]
    engine: str = "fast"
    engine_options: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    dtype: str | None = None
    max_batch: int = 8
    batch_window_ms: float = 5.0
    max_queue: int = 64
    warm: tuple[tuple[int, int, int], ...] = ()
    api_key: str | None = None
    request_timeout_s: float = 600.0
    embeddings: str | None = None  # a folder of textual-inversion embeddings every model loads
    loras: str | None = None  # the folder of LoRA files requests may name
    controlnets: dict[str, str] = field(default_factory=dict)  # {name: reference}, beside each model they fit
    preview_every: int = 5  # steps between the live previews of /sdapi/v1/progress (0: none)
    ip_adapters: dict[str, str] = field(default_factory=dict)  # {name: reference}, beside each model they fit
    ip_image_encoder: str | None = None  # the IP-Adapters' CLIP vision encoder (default: the one beside each file)


class Replica:
    """One replica: a Worker on its device and the HTTP app in front of it (the class Ray Serve deploys)."""

    def __init__(self, settings: dict[str, Any]):
        from .app import create_app
        from .loras import LoraFolder
        from .metrics import Metrics
        from .worker import Worker

        s = ReplicaSettings(**settings)
        metrics = Metrics()
        self.worker = Worker(s.models, engine=s.engine, engine_options=s.engine_options, device=s.device,
                             dtype=s.dtype, max_batch=s.max_batch, batch_window_ms=s.batch_window_ms,
                             max_queue=s.max_queue, warm=tuple(map(tuple, s.warm)), events=metrics,
                             embeddings=s.embeddings, controlnets=s.controlnets, preview_every=s.preview_every,
                             ip_adapters=s.ip_adapters, ip_image_encoder=s.ip_image_encoder)
        self.worker.start()
        self.worker.wait_ready()  # a replica is healthy once its models are loaded and warm
        self.app = create_app(self.worker, api_key=s.api_key, request_timeout_s=s.request_timeout_s,
                              metrics=metrics, stop_worker_on_shutdown=False,
                              loras=LoraFolder(s.loras) if s.loras else None)
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    async def __call__(self, request):
        from starlette.responses import Response

        start: dict[str, Any] = {}
        body: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))

        await self.app(request.scope, request.receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.get("headers", [])}
        headers.pop("content-length", None)  # set again for the joined body
        headers["x-sdaccel-replica"] = self.name  # which replica answered (Ray spreads requests over them)
        return Response(b"".join(body), status_code=start.get("status", 500), headers=headers)

    def check_health(self) -> None:
        """Ray's periodic health check: a replica whose worker failed to load, or whose thread died, is restarted."""
        why = self.worker.unhealthy_reason()
        if why is not None:
            raise RuntimeError(why)

    def __del__(self) -> None:
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.stop(drain=True, timeout=600)


# The Retry-After of Ray's proxy when its queue is full: a fixed figure, as the proxy knows no job's duration (a
# replica's own 429 says one from its recent time per image).
PROXY_RETRY_AFTER_S = 5


def deployment(settings: ReplicaSettings, replicas: int, gpus_per_replica: float):
    """The Ray Serve application: `replicas` copies of Replica, each holding `gpus_per_replica` GPUs; Ray's proxy
    holds at most max_queue requests waiting for a replica and refuses more with 429 (the module's docstring)."""
    from ray import serve

    from .worker_api import check_settings

    check_settings(settings.models, settings.max_batch, settings.max_queue, settings.batch_window_ms)
    deployed = serve.deployment(
        Replica, name="sdaccel", num_replicas=replicas,
        ray_actor_options={"num_gpus": gpus_per_replica},
        # Ray may hand a replica as many requests as its queue and a running batch hold; beyond, Ray queues them.
        max_ongoing_requests=settings.max_queue + settings.max_batch,
        max_queued_requests=settings.max_queue,
        health_check_period_s=10, **_backpressure_429())
    return deployed.bind(asdict(settings))


def _backpressure_429() -> dict[str, Any]:
    """serve.deployment's argument that answers a full proxy queue 429 with Retry-After (Ray's default: 503)."""
    try:
        from ray.serve.config import BackpressureConfig
    except ImportError:  # an older Ray: its proxy answers 503
        return {}
    return {"backpressure_config": BackpressureConfig(status_code=429, retry_after_s=PROXY_RETRY_AFTER_S)}


def build_app(args: dict[str, Any]):
    """The application builder a Ray Serve config file names (`import_path: sdaccel.serve.ray_app:build_app`):
    `args` holds ReplicaSettings' fields plus `replicas` (default 1) and `gpus_per_replica` (default 1)."""
    args = dict(args)
    replicas, gpus = int(args.pop("replicas", 1)), float(args.pop("gpus_per_replica", 1))
    return deployment(ReplicaSettings(**args), replicas, gpus)


def run(settings: ReplicaSettings, *, replicas: int, gpus_per_replica: float, host: str, port: int,
        address: str | None = None, blocking: bool = True) -> None:
    """Start (or join, with `address`) Ray, deploy the replicas behind Ray Serve's HTTP proxy on host:port, and with
    `blocking` serve until SIGTERM or Ctrl-C, then shut Serve down (each replica drains its queue)."""
    import signal
    import threading

    import ray
    from ray import serve

    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(settings, replicas, gpus_per_replica), name="sdaccel", route_prefix="/")
    if not blocking:
        return
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        while not stop.wait(1):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        serve.shutdown()
        ray.shutdown()
