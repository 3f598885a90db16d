"""`sdaccel serve`: models on one device behind an HTTP server (sdaccel's API, OpenAI's images API, A1111's subset);
with --gpus, one worker process per GPU behind the one server (workers.py).

uvicorn runs the app behind the edge of serve/http_server.py (time limits on request heads and bodies, a concurrency
limit); SIGTERM stops accepting connections, lets in-flight requests finish for up to --shutdown-timeout seconds,
then stops the running jobs between steps (their requests answered 503), stops the worker (or each worker process;
the app's lifespan) and exits 0.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import signal
import sys

from ..errors import SdaccelError
from ..pipeline.limits import SCHEDULE_STEPS, SERVER, GenerationLimits
from .common import ENGINE_NAMES, EXIT_CODES, engine_options, status

API_KEY_ENV = "SDACCEL_API_KEY"
MIN_KEY_CHARS = 16  # a shorter key is guessable
# A CPU server takes the tiny model's default size at 50 steps (a few seconds) but refuses OpenAI's 1024x1024, which
# would run for hours there.
DEFAULT_MAX_JOB_SECONDS = 300.0


def register(sub) -> None:
    p = sub.add_parser("serve", help="an HTTP image server: sdaccel's API, OpenAI's /v1/images/generations, A1111's "
                                     "/sdapi/v1 subset",
                       description="Serve models over HTTP with a bounded queue and dynamic batching: requests with "
                                   "the same settings share one pipeline call. Endpoints: POST /v1/generate, POST "
                                   "/v1/images/generations, POST /sdapi/v1/txt2img and img2img, GET /health, /ready, "
                                   "/metrics (Prometheus).", epilog=EXIT_CODES)
    p.add_argument("--model", action="append", default=[], metavar="[NAME=]MODEL",
                   help="a model to serve (folder, file, repo id or synthetic:<arch>), optionally named; repeatable; "
                        "the first is the default (default: synthetic:sd15 on a GPU, synthetic:sd15-tiny on CPU)")
    p.add_argument("--engine", metavar="|".join(ENGINE_NAMES), help="default: fast on a GPU, eager on CPU")
    p.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the engine (repeatable; `sdaccel engines NAME` lists them)")
    p.add_argument("--embeddings", metavar="DIR",
                   help="a folder of textual-inversion embeddings (.pt, .bin, .safetensors; A1111's or diffusers' "
                        "format) that prompts name by file name; each model takes the files made for it, "
                        "/sdapi/v1/embeddings lists them")
    p.add_argument("--loras", metavar="DIR",
                   help="a folder of LoRA files (.safetensors; .pt/.ckpt/.bin of tensors) that requests name by file "
                        "stem: <lora:name:weight> in a prompt, /v1/generate's loras; /sdapi/v1/loras lists them")
    p.add_argument("--controlnet", action="append", default=[], metavar="[NAME=]REF",
                   help="a ControlNet (folder, file, repo id or synthetic:controlnet-<arch>) loaded beside every "
                        "served model it fits, named NAME or after its file; repeatable; requests use it through "
                        "A1111's alwayson_scripts.controlnet units or /v1/generate's controlnet")
    p.add_argument("--ip-adapter", action="append", default=[], metavar="[NAME=]REF",
                   help="an IP-Adapter (a .safetensors/.bin file in h94's layout, a Hugging Face file as "
                        "owner/repo/path, or synthetic:ip-adapter-<arch>) loaded beside every served model it fits, "
                        "named NAME or after its file; repeatable; requests give image prompts through "
                        "/v1/generate's ip_adapter or A1111's ControlNet units naming it")
    p.add_argument("--ip-image-encoder", metavar="FOLDER",
                   help="the IP-Adapters' CLIP vision encoder (a folder, or a repo id with an optional subfolder; "
                        "default: the image_encoder folder beside each adapter file)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--gpus", metavar="all|0,1,...",
                   help="one worker process per GPU, each with its own engines, behind one server; all: every "
                        "visible GPU (--max-queue is per GPU)")
    p.add_argument("--cpu-workers", type=int, metavar="N",
                   help="N worker processes on the CPU, as --gpus runs them on GPUs (for CPU-only machines)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], help="default: fp16 on GPU, fp32 on CPU")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1); any other than loopback needs an API key")
    p.add_argument("--port", type=int, default=7860, help="default: 7860")
    p.add_argument("--max-batch", type=int, default=8, help="most images per pipeline call (default: 8)")
    p.add_argument("--batch-window-ms", type=float, default=5.0,
                   help="how long the worker gathers same-settings requests into one call (default: 5)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="jobs waiting at most; more are refused with 429 and Retry-After (default: 64); with "
                        "--ray, per replica, and Ray's proxy holds as many more waiting for a replica, then refuses "
                        "with 429 too")
    p.add_argument("--warm", metavar="HxW:N,N,...", action="append", default=[],
                   help="shapes run once at start so the first requests find their kernels ready, e.g. "
                        "512x512:1,2,4 (repeatable); /ready turns 200 after")
    p.add_argument("--preview-every", type=int, default=5, metavar="N",
                   help="a live preview of the running call's first image every N steps, which /sdapi/v1/progress "
                        "returns as current_image (A1111's show_progress_every_n_steps; 0: none; default: 5)")
    p.add_argument("--api-key", help=f"required as 'Authorization: Bearer KEY' or 'X-API-Key', at least "
                                     f"{MIN_KEY_CHARS} characters; prefer ${API_KEY_ENV} (the default): a command "
                                     f"line is visible to other users in ps; /health and /ready stay open, telling "
                                     f"only their status without the key")
    p.add_argument("--max-steps", type=int, default=SERVER.max_steps,
                   help=f"most denoising steps a request may ask (default: {SERVER.max_steps}; at most "
                        f"{SCHEDULE_STEPS}, the library's bound)")
    p.add_argument("--max-side", type=int, default=SERVER.max_side,
                   help=f"largest width or height a request may ask, pixels (default: {SERVER.max_side})")
    p.add_argument("--max-images", type=int, default=SERVER.max_images,
                   help=f"most images one request may ask (default: {SERVER.max_images})")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a request may take, waiting and running: at its deadline it is answered 503 and "
                        "its jobs are dropped, or stopped between steps (default: 600)")
    p.add_argument("--max-job-seconds", type=float, metavar="S",
                   help="refuse (400) a job this server's estimate says would run longer: its images x steps x "
                        "size, at the rate the worker measures (0: no limit; default: %g; not with --ray)"
                        % DEFAULT_MAX_JOB_SECONDS)
    p.add_argument("--header-timeout", type=float, metavar="S",
                   help="seconds a connection has to send a whole request head (kept alive: from the next request's "
                        "first byte); later it is answered 408 and closed (default: 10)")
    p.add_argument("--body-timeout", type=float, metavar="S",
                   help="seconds a request's body has to arrive after its head; later it is answered 408 and closed "
                        "(default: 30)")
    p.add_argument("--limit-concurrency", type=int, metavar="N",
                   help="open connections and running requests at most; a request past them is answered 503 at once "
                        "(0: no limit; default: 512)")
    p.add_argument("--shutdown-timeout", type=float, metavar="S",
                   help="on SIGTERM or Ctrl+C, seconds running requests have to finish; then their jobs stop between "
                        "steps and are answered 503, slow clients are closed, and the server exits (default: 30)")
    p.add_argument("--ray", action="store_true",
                   help="run the server as a Ray Serve application: --replicas copies of the worker and app, one GPU "
                        "each, behind Ray Serve's HTTP proxy at --host:--port (needs 'ray[serve]')")
    p.add_argument("--replicas", type=int, default=1, help="with --ray: how many replicas (default: 1)")
    p.add_argument("--gpus-per-replica", type=float, metavar="G",
                   help="with --ray: GPUs each replica holds (default: 1 with a GPU, 0 on CPU)")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="with --ray: a running Ray cluster to join ('auto' finds the local one; default: start one)")
    p.set_defaults(func=cmd_serve)


def parse_models(items: list[str], default: str) -> dict[str, str]:
    """--model values as {name: model}: NAME=MODEL names one, a bare MODEL is named after itself."""
    models: dict[str, str] = {}
    for item in items or [default]:
        name, sep, ref = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            name, ref = item, item
        if not ref or name in models:
            raise SdaccelError(f"--model {item!r}: " + ("no model given" if not ref else f"{name!r} is served twice"))
        models[name] = ref
    return models


def parse_warm(items: list[str]) -> tuple[tuple[int, int, int], ...]:
    """--warm HxW:N,N,... as (height, width, images) shapes."""
    shapes = []
    for item in items:
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*([\d,\s]+))?", item)
        if not match:
            raise SdaccelError(f"--warm {item!r}: expected HEIGHTxWIDTH[:N,N,...], e.g. 512x512:1,2,4")
        height, width = int(match.group(1)), int(match.group(2))
        counts = [c.strip() for c in (match.group(3) or "1").split(",") if c.strip()]
        if height < 8 or width < 8 or height % 8 or width % 8 or not counts or any(int(c) < 1 for c in counts):
            raise SdaccelError(f"--warm {item!r}: sides must be multiples of 8 and image counts >= 1")
        shapes += [(height, width, int(c)) for c in counts]
    return tuple(shapes)


def worker_devices(gpus: str | None, cpu_workers: int | None, device: str | None, ray: bool) -> list[str] | None:
    """The worker processes' devices that --gpus or --cpu-workers asks for ("cuda:N" or "cpu" each); None: one
    worker in the server's own process. --gpus all counts the GPUs through NVML where it can (no CUDA context)."""
    if gpus is None and cpu_workers is None:
        return None
    flag = "--gpus" if gpus is not None else "--cpu-workers"
    if gpus is not None and cpu_workers is not None:
        raise SdaccelError("--gpus and --cpu-workers exclude each other")
    if ray:
        raise SdaccelError(f"{flag} and --ray exclude each other: Ray places its replicas on GPUs itself")
    if device:
        raise SdaccelError(f"{flag} chooses the workers' devices: drop --device")
    if cpu_workers is not None:
        if cpu_workers < 1:
            raise SdaccelError(f"--cpu-workers must be >= 1, got {cpu_workers}")
        return ["cpu"] * cpu_workers
    text = gpus.strip().lower()
    indices = None
    if text != "all":
        parts = [part.strip() for part in text.split(",")]
        if not all(part.isdigit() for part in parts):
            raise SdaccelError(f"--gpus {gpus!r}: expected all or GPU indices such as 0,1")
        indices = [int(part) for part in parts]
        if len(set(indices)) != len(indices):
            raise SdaccelError(f"--gpus {gpus!r}: a GPU is named twice")
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise SdaccelError("--gpus: no CUDA GPU is visible")
    for index in indices or ():
        if index >= count:
            raise SdaccelError(f"--gpus {gpus!r}: there is no GPU {index} ({count} visible: 0-{count - 1})")
    return [f"cuda:{i}" for i in (range(count) if indices is None else indices)]


def check_api_key(key: str | None, source: str) -> None:
    """A usable API key: long enough not to be guessed, and without the surrounding blanks no header keeps."""
    if key is None:
        return
    if len(key) < MIN_KEY_CHARS:
        raise SdaccelError(f"{source}: an API key must be at least {MIN_KEY_CHARS} characters, got {len(key)}")
    if key != key.strip():
        raise SdaccelError(f"{source}: the API key starts or ends with whitespace, which no request header keeps")


EDGE_DEFAULTS = {"header_timeout": 10.0, "body_timeout": 30.0, "limit_concurrency": 512, "shutdown_timeout": 30.0}


def edge_settings(args) -> dict:
    """The HTTP edge's flags (http_server.py) with their defaults, checked; refused by name with --ray, whose own
    HTTP proxy serves the requests."""
    if args.ray:
        given = [name for name in EDGE_DEFAULTS if getattr(args, name) is not None]
        if given:
            raise SdaccelError(f"--{given[0].replace('_', '-')} does not apply to --ray: Ray Serve's HTTP proxy "
                               f"serves the requests")
        return {}
    settings = {name: default if getattr(args, name) is None else getattr(args, name)
                for name, default in EDGE_DEFAULTS.items()}
    from ..serve.http_server import check_edge_settings

    check_edge_settings(settings["header_timeout"], settings["body_timeout"], settings["shutdown_timeout"],
                        settings["limit_concurrency"])
    return settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args) -> int:
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_api_key(api_key, "--api-key" if args.api_key else f"${API_KEY_ENV}")
    if not is_loopback(args.host) and not api_key:
        raise SdaccelError(f"listening on {args.host} (not loopback) needs an API key: --api-key or ${API_KEY_ENV}")
    if not 0 <= args.port <= 65535:
        raise SdaccelError(f"--port must be from 0 to 65535, got {args.port}")
    if args.timeout <= 0:
        raise SdaccelError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.max_job_seconds is not None and (args.ray or not args.max_job_seconds >= 0):
        raise SdaccelError("--max-job-seconds does not apply to --ray" if args.ray else
                           f"--max-job-seconds must be >= 0 (0: no limit), got {args.max_job_seconds}")
    try:  # the one steps/size/images rule, with this server's bounds (pipeline/limits.py)
        generation = GenerationLimits(max_steps=args.max_steps, max_side=args.max_side, max_images=args.max_images,
                                      flags=SERVER.flags)
    except SdaccelError as exc:
        raise SdaccelError(f"--max-steps/--max-side/--max-images: {exc}") from None
    if args.ray and generation != SERVER:
        raise SdaccelError("--max-steps, --max-side and --max-images do not apply to --ray (its replicas keep the "
                           "defaults)")
    warm = parse_warm(args.warm)
    if args.preview_every < 0:
        raise SdaccelError(f"--preview-every must be >= 0 steps (0: no previews), got {args.preview_every}")
    devices = worker_devices(args.gpus, args.cpu_workers, args.device, args.ray)
    try:
        from ..serve.app import create_app
        from ..serve.http_server import EdgeConfig, EdgeServer
        from ..serve.metrics import Metrics
    except ModuleNotFoundError as exc:
        raise SdaccelError(f"sdaccel serve needs {exc.name}: pip install 'sdaccel[serve]'") from None
    edge = edge_settings(args)
    from ..device import resolve_device
    from ..models.registry import default_model
    from ..serve.worker import Worker
    from ..serve.workers import ProcessWorkers

    # With worker processes the front never touches CUDA: their device type is known from the flag.
    device = resolve_device(args.device) if devices is None else None
    device_type = device.type if device is not None else devices[0].partition(":")[0]
    models = parse_models(args.model, default_model(device_type))
    engine = (args.engine or ("fast" if device_type == "cuda" else "eager")).strip().lower()
    options = engine_options(engine, args)
    if args.embeddings:
        from ..pipeline.load import read_embeddings

        if not os.path.isdir(args.embeddings):
            raise SdaccelError(f"--embeddings {args.embeddings}: not a folder")
        read_embeddings(engine, args.embeddings)  # a bad file: one line now, not a worker that fails to start
    from ..serve.controlnets import controlnet_plan, parse_controlnets
    from ..serve.loras import LoraFolder

    loras = LoraFolder(args.loras) if args.loras else None
    controlnets = parse_controlnets(args.controlnet)
    controlnet_plan(models, controlnets)  # a ControlNet that fits no served model: one line now
    from ..serve.ip_adapters import ip_adapter_plan, parse_ip_adapters

    ip_adapters = parse_ip_adapters(args.ip_adapter)
    if args.ip_image_encoder is not None and not ip_adapters:
        raise SdaccelError("--ip-image-encoder is the image encoder of an IP-Adapter: give --ip-adapter too")
    ip_adapter_plan(models, ip_adapters)  # an IP-Adapter that fits no served model: one line now
    adapters = dict(ip_adapters=ip_adapters, ip_image_encoder=_image_encoder(args.ip_image_encoder))
    _log_to_stderr()
    if args.ray:
        return _serve_on_ray(args, models, engine, options, device, warm, api_key, controlnets, adapters)
    metrics = Metrics()
    settings = dict(engine=engine, engine_options=options, dtype=args.dtype, max_batch=args.max_batch,
                    batch_window_ms=args.batch_window_ms, max_queue=args.max_queue, warm=warm, events=metrics,
                    embeddings=args.embeddings, controlnets=controlnets, preview_every=args.preview_every,
                    **adapters)
    if devices is None:
        worker = Worker(models, device=str(device), **settings)
        where = str(device)
    else:
        worker = ProcessWorkers(models, devices=devices, **settings)
        where = f"{len(devices)} worker processes: {', '.join(devices)}"
    worker.max_job_seconds = DEFAULT_MAX_JOB_SECONDS if args.max_job_seconds is None else args.max_job_seconds
    worker.start()  # loads and warms on its thread(s) while the server starts: /ready says when it is done
    from ..serve.schemas import Limits

    limits = Limits(max_n=generation.max_images, max_steps=generation.max_steps, max_side=generation.max_side)
    app = create_app(worker, api_key=api_key, request_timeout_s=args.timeout, metrics=metrics, loras=loras,
                     limits=limits)
    config = EdgeConfig(app, host=args.host, port=args.port, access_log=False, log_level="info", lifespan="on",
                        header_timeout_s=edge["header_timeout"], body_timeout_s=edge["body_timeout"],
                        shutdown_timeout_s=edge["shutdown_timeout"], limit_concurrency=edge["limit_concurrency"])
    server = EdgeServer(config, worker)
    status(f"serving {', '.join(f'{n} ({r})' if n != r else n for n, r in models.items())} on the {engine} engine "
           f"({where}) at http://{args.host}:{args.port}")
    # uvicorn re-raises the signal it shut down on once done: a SIGTERM that drained cleanly then exits 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    except SystemExit:  # uvicorn's exit when it cannot bind, after logging why
        if not server.started:
            raise SdaccelError(f"could not listen on {args.host}:{args.port} (in use?)") from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _serve_on_ray(args, models: dict[str, str], engine: str, options: dict, device, warm, api_key,
                  controlnets: dict[str, str], adapters: dict) -> int:
    if args.replicas < 1:
        raise SdaccelError(f"--replicas must be >= 1, got {args.replicas}")
    try:
        import ray.serve  # noqa: F401

        from ..serve.ray_app import ReplicaSettings, run
    except ModuleNotFoundError as exc:
        raise SdaccelError(f"--ray needs {exc.name}: pip install 'ray[serve]'") from None
    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else (1.0 if device.type == "cuda" else 0.0)
    settings = ReplicaSettings(models=models, engine=engine, engine_options=options,
                               device="cuda" if device.type == "cuda" else str(device), dtype=args.dtype,
                               max_batch=args.max_batch, batch_window_ms=args.batch_window_ms,
                               max_queue=args.max_queue, warm=warm, api_key=api_key,
                               request_timeout_s=args.timeout, embeddings=args.embeddings,
                               loras=os.path.abspath(args.loras) if args.loras else None, controlnets=controlnets,
                               preview_every=args.preview_every, **adapters)
    status(f"serving {', '.join(models)} on Ray Serve: {args.replicas} replica(s) of the {engine} engine, "
           f"{gpus:g} GPU each, at http://{args.host}:{args.port}")
    run(settings, replicas=args.replicas, gpus_per_replica=gpus, host=args.host, port=args.port,
        address=args.ray_address)
    return 0


def _image_encoder(ref: str | None) -> str | None:
    """--ip-image-encoder as the worker processes and replicas read it: a folder as an absolute path, or a repo id."""
    if ref is None:
        return None
    from ..models.configs import is_repo_id

    if os.path.isdir(os.path.expanduser(ref)):
        return os.path.abspath(os.path.expanduser(ref))
    if not is_repo_id("/".join(ref.split("/")[:2])):
        raise SdaccelError(f"--ip-image-encoder {ref}: no such folder (expected a CLIP vision encoder folder or a "
                           f"Hugging Face repo id)")
    return ref


def _log_to_stderr() -> None:
    """The server's own logs (one JSON line per request, the worker's loading lines) on stderr."""
    logger = logging.getLogger("sdaccel.serve")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
