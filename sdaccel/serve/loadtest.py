"""`sdaccel loadtest`: concurrent clients against an sdaccel server, and what they got: images/min, latency
percentiles, errors by status, memory before and after, and how fast an overloaded server says 429.

    sdaccel loadtest --url http://127.0.0.1:7860 --clients 32 --requests 320 --steps 50
    sdaccel loadtest --serve "--model synthetic:sd15 --engine fast --max-batch 8" --clients 32 --bench

With --serve the command starts `sdaccel serve` with those arguments on a free loopback port, waits for /ready, and
stops it (SIGTERM, drained) at the end; with --bench it first runs `sdaccel bench` on the same model and engine
(batch 1 and the server's max batch), so the served figures sit beside the engine's own in one run.

Each client sends POST /v1/generate requests one after another (the prompt differs per request, the settings do
not, so the server can batch them) until --requests have been sent or --duration has passed. Memory is read from the
server's /metrics (process resident memory, GPU memory allocated) after the warm-up requests and at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError


@dataclass
class LoadResult:
    clients: int
    requests: int
    ok: int
    errors: dict[str, int]  # HTTP status (or exception type) -> count
    images: int
    seconds: float
    images_per_min: float
    latency_p50_s: float | None
    latency_p90_s: float | None
    latency_p99_s: float | None
    mean_batch_images: float | None  # what the server batched, as it reported per response
    # Medians of what the server reported per response: its pipeline call and the wait before it. The rest of a
    # request's latency is the batching window, PNG encoding and HTTP.
    pipeline_p50_s: float | None = None
    queued_p50_s: float | None = None
    memory_start: dict[str, float] = field(default_factory=dict)  # after warm-up, from /metrics
    memory_end: dict[str, float] = field(default_factory=dict)
    overload_429: int = 0  # of the --overload burst
    overload_429_p50_ms: float | None = None
    overload_probe_429: int = 0  # of the probes sent one at a time while the server is full
    overload_probe_429_p50_ms: float | None = None
    overload_probe_429_max_ms: float | None = None

    def memory_growth(self) -> dict[str, float]:
        """Relative growth of each memory figure from the warm-up to the end (0.01 = 1%)."""
        return {k: self.memory_end[k] / v - 1 for k, v in self.memory_start.items() if v and k in self.memory_end}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def memory_from_metrics(text: str) -> dict[str, float]:
    """The memory figures of a Prometheus exposition (the server's /metrics): host_rss_bytes (the server process),
    gpu_allocated_bytes (all its devices together), and for a server with worker processes (--gpus) each one's
    worker{N}_rss_bytes and, with several GPUs, each one's gpu_allocated_bytes_{device}."""
    found: dict[str, float] = {}
    gpus: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$", line.strip())
        if not match:
            continue
        name, value = match.group(1), float(match.group(3))
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if name == "process_resident_memory_bytes":
            found["host_rss_bytes"] = value
        elif name == "sdaccel_worker_resident_memory_bytes":
            found[f"worker{labels.get('worker', '')}_rss_bytes"] = value
        elif name == "sdaccel_gpu_memory_allocated_bytes":
            gpus[labels.get("device", "")] = value
    if gpus:
        found["gpu_allocated_bytes"] = sum(gpus.values())
        if len(gpus) > 1:
            found.update({f"gpu_allocated_bytes_{device}": value for device, value in gpus.items()})
    return found


async def run_load(url: str, *, clients: int, requests: int, duration_s: float, payload: dict[str, Any],
                   api_key: str | None = None, warmup: int = 2, timeout_s: float = 600) -> LoadResult:
    """`clients` concurrent clients sending `requests` requests in all (or until `duration_s`), after `warmup`
    requests sent one at a time and then one round of `clients` at once: the server has then run every batch size
    the load will give it (a first call at a new size captures its graphs), and the memory figures start there."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s) as client:
        async def warm(i: int) -> None:
            response = await client.post("/v1/generate", json=dict(payload, prompt=f"warm-up {i}", seed=i))
            if response.status_code != 200:
                raise UsageError(f"warm-up request failed: {response.status_code} {response.text[:200]}")

        for i in range(warmup):
            await warm(i)
        if clients > 1:
            await asyncio.gather(*(warm(warmup + i) for i in range(clients)))
        memory_start = memory_from_metrics((await client.get("/metrics")).text)
        latencies: list[float] = []
        batches: list[int] = []
        pipeline: list[float] = []
        queued: list[float] = []
        errors: dict[str, int] = {}
        counter = iter(range(requests))
        images = 0
        start = time.perf_counter()
        stop_at = start + duration_s

        async def one_client() -> None:
            nonlocal images
            for index in counter:
                if time.perf_counter() > stop_at:
                    return
                sent = time.perf_counter()
                try:
                    response = await client.post("/v1/generate", json=dict(payload, prompt=f"request {index}",
                                                                             seed=index))
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - sent)
                    body = response.json()
                    images += len(body.get("images", []))
                    if "batch_images" in body:
                        batches.append(int(body["batch_images"]))
                    if "total_s" in (body.get("timings") or {}):
                        pipeline.append(float(body["timings"]["total_s"]))
                    if body.get("queued_s") is not None:
                        queued.append(float(body["queued_s"]))
                else:
                    errors[str(response.status_code)] = errors.get(str(response.status_code), 0) + 1

        await asyncio.gather(*(one_client() for _ in range(clients)))
        seconds = time.perf_counter() - start
        memory_end = memory_from_metrics((await client.get("/metrics")).text)
    return LoadResult(clients=clients, requests=len(latencies) + sum(errors.values()), ok=len(latencies),
                      errors=errors, images=images, seconds=seconds, images_per_min=images / seconds * 60,
                      latency_p50_s=percentile(latencies, 0.5), latency_p90_s=percentile(latencies, 0.9),
                      latency_p99_s=percentile(latencies, 0.99),
                      mean_batch_images=statistics.fmean(batches) if batches else None,
                      pipeline_p50_s=percentile(pipeline, 0.5), queued_p50_s=percentile(queued, 0.5),
                      memory_start=memory_start, memory_end=memory_end)


PROBE_WAIT_S = 1.0  # a probe not answered within this long was accepted: the next one goes


@dataclass
class Overload:
    """What --overload measured: a burst of requests at once, then probes one at a time while the queue it filled
    is still full."""

    burst_429_s: list[float]  # per refusal of the burst: how fast it came (the event loop answers the herd in turn)
    probe_429_s: list[float]  # per refused probe: how fast a client of a full server hears 429

    @property
    def burst_429(self) -> int:
        return len(self.burst_429_s)

    @property
    def probe_429(self) -> int:
        return len(self.probe_429_s)


async def overload(url: str, payload: dict[str, Any], burst: int, api_key: str | None = None,
                   probes: int = 20) -> Overload:
    """Send `burst` requests at once; once the server refuses (its queue is full) and the burst's refusals have all
    arrived, send `probes` requests one at a time. How many of each were refused with 429, and how fast."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    refused: list[float] = []
    answered = 0
    full = asyncio.Event()
    # A connection each: httpx's default pool (100) would make the client itself hold requests back.
    limits = httpx.Limits(max_connections=burst + 1, max_keepalive_connections=burst + 1)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
        async def one(i: int, times: list[float]) -> None:
            nonlocal answered
            sent = time.perf_counter()
            response = await client.post("/v1/generate", json=dict(payload, prompt=f"overload {i}", seed=i))
            answered += 1
            if response.status_code == 429:
                times.append(time.perf_counter() - sent)
                full.set()

        herd = asyncio.ensure_future(asyncio.gather(*(one(i, refused) for i in range(burst))))
        probed: list[float] = []
        await asyncio.wait([herd, asyncio.ensure_future(full.wait())], return_when=asyncio.FIRST_COMPLETED)
        if full.is_set():
            while True:  # the refusals come at once; the accepted requests wait for their images
                seen = answered
                await asyncio.sleep(0.2)
                if answered == seen:
                    break
            pending = []
            for i in range(probes):  # one at a time: each answered, or accepted (then it waits for its image)
                pending.append(asyncio.ensure_future(one(burst + i, probed)))
                await asyncio.wait([pending[-1]], timeout=PROBE_WAIT_S)
            await asyncio.gather(*pending)
        await herd
    return Overload(refused, probed)


# ------------------------------------------------------------------------------------------------- the command


def register(sub) -> None:
    p = sub.add_parser("loadtest", help="concurrent clients against an sdaccel server: images/min, latency, errors",
                       description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server (http://HOST:PORT)")
    where.add_argument("--serve", metavar="ARGS",
                       help="start `sdaccel serve ARGS` on a free loopback port for the test, stop it after")
    p.add_argument("--clients", type=int, default=32, help="concurrent clients (default: 32)")
    p.add_argument("--requests", type=int, default=320, help="requests in all (default: 320)")
    p.add_argument("--duration", type=float, default=600, help="stop sending after this many seconds (default: 600)")
    p.add_argument("--steps", type=int, help="denoising steps of each request (default: the model's)")
    p.add_argument("--size", metavar="WxH", help="image size (default: the model's)")
    p.add_argument("--model", help="the served model's name to request (default: the server's first)")
    p.add_argument("--output-format", choices=("png", "jpeg", "webp"),
                   help="the image format each request asks for (default: the server's, png)")
    p.add_argument("--output-compression", type=int, metavar="Q",
                   help="with --output-format jpeg or webp: the quality asked for, 0-100 (default: the server's, 100)")
    p.add_argument("--overload", type=int, default=0, metavar="N",
                   help="after the load, send N requests at once, then 20 one at a time while the server is "
                        "still full, and time the 429 answers (default: off)")
    p.add_argument("--bench", action="store_true",
                   help="with --serve: first run `sdaccel bench` on the same model and engine (batch 1 and the "
                        "server's --max-batch) for comparison")
    p.add_argument("--api-key", default=os.environ.get("SDACCEL_API_KEY"), help="the server's API key")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.set_defaults(func=cmd_loadtest)


def _payload(args) -> dict[str, Any]:
    payload: dict[str, Any] = {"n": 1}
    if args.steps is not None:
        payload["steps"] = args.steps
    if args.size:
        match = re.fullmatch(r"(\d+)x(\d+)", args.size)
        if not match:
            raise UsageError(f"--size must be WxH, got {args.size!r}")
        payload["width"], payload["height"] = int(match.group(1)), int(match.group(2))
    if args.model:
        payload["model"] = args.model
    if args.output_format:
        payload["output_format"] = args.output_format
    if args.output_compression is not None:
        if not 0 <= args.output_compression <= 100 or args.output_format in (None, "png"):
            raise UsageError("--output-compression takes 0-100, with --output-format jpeg or webp")
        payload["output_compression"] = args.output_compression
    return payload


def free_port() -> int:
    """A free loopback port (free when asked: the caller binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_option(serve_args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(serve_args):
        if arg == flag and i + 1 < len(serve_args):
            return serve_args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _bench(serve_args: list[str], payload: dict[str, Any]) -> dict[str, Any]:
    """`sdaccel bench` on the served model and engine: batch 1 and the server's max batch."""
    import tempfile

    model = _serve_option(serve_args, "--model")
    model = model.split("=", 1)[1] if model and "=" in model and not model.startswith("synthetic:") else model
    engine = _serve_option(serve_args, "--engine")
    batches = sorted({1, int(_serve_option(serve_args, "--max-batch") or 8)})
    out = Path(tempfile.mkdtemp(prefix="sdaccel-loadtest-bench-"))
    cmd = [sys.executable, "-m", "sdaccel", "bench", "--batch-sizes", ",".join(map(str, batches)), "--out", str(out)]
    cmd += ["--model", model] if model else []
    cmd += ["--engines", engine] if engine else []
    cmd += ["--steps", str(payload["steps"])] if "steps" in payload else []
    if "width" in payload:
        cmd += ["--width", str(payload["width"]), "--height", str(payload["height"])]
    subprocess.run(cmd, check=True)
    rows = json.loads(next(out.glob("bench-*.json")).read_text())["rows"]
    ok = [r for r in rows if r.get("status") == "ok"]
    return {f"batch_{r['batch_size']}": dict(median_s=r["latency_median_s"], images_per_min=r["images_per_min"])
            for r in ok}


def cmd_loadtest(args) -> int:
    import shlex
    import urllib.request

    if args.clients < 1 or args.requests < 1:
        raise UsageError("--clients and --requests must be >= 1")
    if args.bench and not args.serve:
        raise UsageError("--bench needs --serve (it benchmarks the model and engine the test serves)")
    payload = _payload(args)
    server = None
    url = args.url
    report: dict[str, Any] = {"payload": payload}
    serve_args = shlex.split(args.serve) if args.serve else []
    if args.bench:
        report["bench"] = _bench(serve_args, payload)
    if args.serve:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        server = subprocess.Popen([sys.executable, "-m", "sdaccel", "serve", *serve_args, "--host", "127.0.0.1",
                                   "--port", str(port)])
        deadline = time.monotonic() + 1800
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ready", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise UsageError(f"the server did not become ready (exit code {server.poll()})")
            time.sleep(0.25)
        report["server_ready_s"] = time.monotonic() - started  # its cold start: load, warm, workers' too
    try:
        result = asyncio.run(run_load(url, clients=args.clients, requests=args.requests, duration_s=args.duration,
                                      payload=payload, api_key=args.api_key))
        if args.overload:
            found = asyncio.run(overload(url, payload, args.overload, args.api_key))
            result.overload_429 = found.burst_429
            result.overload_429_p50_ms = None if not found.burst_429_s else percentile(found.burst_429_s, 0.5) * 1000
            result.overload_probe_429 = found.probe_429
            if found.probe_429_s:
                result.overload_probe_429_p50_ms = percentile(found.probe_429_s, 0.5) * 1000
                result.overload_probe_429_max_ms = max(found.probe_429_s) * 1000
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=600)
    report["load"] = asdict(result)
    report["memory_growth"] = result.memory_growth()
    print(_table(result, report.get("bench")))
    if args.out:
        from ..atomic import write_text

        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text(args.out, json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0 if not result.errors else 1


def _table(result: LoadResult, bench: dict[str, Any] | None) -> str:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.0f}"

    lines = ["| clients | requests | ok | errors | images/min | p50 ms | p90 ms | p99 ms | mean batch |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| {result.clients} | {result.requests} | {result.ok} | "
             f"{', '.join(f'{k}: {v}' for k, v in result.errors.items()) or 0} | {result.images_per_min:.1f} | "
             f"{ms(result.latency_p50_s)} | {ms(result.latency_p90_s)} | {ms(result.latency_p99_s)} | "
             f"{'—' if result.mean_batch_images is None else f'{result.mean_batch_images:.1f}'} |"]
    if result.pipeline_p50_s is not None:
        lines.append(f"server, medians: pipeline call {ms(result.pipeline_p50_s)} ms, queued "
                     f"{ms(result.queued_p50_s)} ms (the rest of p50: batching window, PNG encoding, HTTP)")
    growth = result.memory_growth()
    if growth:
        lines.append("memory growth after warm-up: " + ", ".join(f"{k} {v:+.1%}" for k, v in growth.items()))
    if result.overload_429:
        lines.append(f"overload: {result.overload_429} of the burst answered 429, "
                     f"median {result.overload_429_p50_ms:.1f} ms")
    if result.overload_probe_429:
        lines.append(f"while full: {result.overload_probe_429} probes one at a time answered 429, median "
                     f"{result.overload_probe_429_p50_ms:.1f} ms, max {result.overload_probe_429_max_ms:.1f} ms")
    if bench:
        lines.append("sdaccel bench, same model and engine: " + ", ".join(
            f"{k.replace('_', ' ')} {v['median_s']:.3f} s, {v['images_per_min']:.1f} images/min"
            for k, v in bench.items()))
    return "\n".join(lines)
