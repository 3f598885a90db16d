"""Prometheus metrics of `sdaccel serve`: what the worker reports (WorkerEvents) and what the HTTP layer counts.

Each Metrics holds its own CollectorRegistry, not prometheus_client's global one, so several apps (tests, or two
servers in one process) never collide. A worker takes its events at construction: create Metrics first and pass it
to both the worker (Worker or ProcessWorkers, events=metrics) and create_app(metrics=metrics). Queue depth and GPU
memory are read at scrape time: from torch in this process for a Worker, from the latest figures each process
reported for ProcessWorkers (whose front never touches CUDA), which also shows each worker process's resident memory.
The workers live and ready are counted at scrape time too; each restart of a worker process that exited is counted
per worker (ProcessWorkers' worker_restarted event).
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from .worker_api import WorkerEvents

# Seconds: from a tiny model's few-step call on a CPU to an SDXL batch.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
STAGES = ("text", "encode", "denoise", "decode", "total")


class Metrics(WorkerEvents):
    """The server's collectors, and the worker's events recorded into them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("sdaccel_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.request_seconds = Histogram("sdaccel_request_seconds", "HTTP request latency by endpoint", ["endpoint"],
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("sdaccel_queue_depth", "jobs waiting in the worker's queue", registry=r)
        self.busy = Gauge("sdaccel_worker_busy", "1 while the worker runs a pipeline call", registry=r)
        self.batch_images = Histogram("sdaccel_batch_images", "images per pipeline call", ["model"],
                                      buckets=BATCH_BUCKETS, registry=r)
        self.batch_jobs = Histogram("sdaccel_batch_jobs", "jobs (requests) per pipeline call", ["model"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.stage_seconds = Histogram("sdaccel_stage_seconds", "a pipeline call's time per stage", ["model", "stage"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.images = Counter("sdaccel_images", "images generated (rate() gives images per second)", ["model"],
                              registry=r)
        self.dropped = Counter("sdaccel_jobs_dropped", "jobs dropped before they ran, by reason", ["reason"],
                               registry=r)
        self.failed = Counter("sdaccel_jobs_failed", "jobs whose pipeline call failed", ["model", "error"],
                              registry=r)
        self.gpu_memory = Gauge("sdaccel_gpu_memory_allocated_bytes", "torch.cuda.memory_allocated() per device",
                                ["device"], registry=r)
        self.worker_memory = Gauge("sdaccel_worker_resident_memory_bytes",
                                   "resident host memory of each worker process (ProcessWorkers)", ["worker"],
                                   registry=r)
        self.restarts = Counter("sdaccel_worker_restarts", "worker processes started again after they exited",
                                ["worker"], registry=r)
        self.workers_live = Gauge("sdaccel_workers_live", "workers running (loading or ready)", registry=r)
        self.workers_ready = Gauge("sdaccel_workers_ready", "workers ready to serve", registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes and the like: loadtest's memory figures
        self._worker: Any = None

    def bind(self, worker: Any) -> None:
        """Read `worker`'s queue depth and busy flag at every scrape."""
        self._worker = worker
        self.queue_depth.set_function(_reader(lambda: worker.queue_depth()))
        self.busy.set_function(_reader(lambda: 1.0 if worker.busy() else 0.0))
        states = getattr(worker, "worker_states", lambda: {})
        self.workers_live.set_function(_reader(lambda: sum(s in ("loading", "ready") for s in states().values())))
        self.workers_ready.set_function(_reader(lambda: sum(s == "ready" for s in states().values())))

    # ---------------------------------------------------------------------------------------------- WorkerEvents

    def batch_done(self, model: str, jobs: int, images: int, seconds: float, timings: dict[str, float]) -> None:
        self.batch_images.labels(model).observe(images)
        self.batch_jobs.labels(model).observe(jobs)
        self.images.labels(model).inc(images)
        for stage in STAGES:
            value = timings.get(f"{stage}_s", seconds if stage == "total" else None)
            if value is None or (stage == "encode" and not value):
                continue  # text to image has no encode stage: zeros would skew its histogram
            self.stage_seconds.labels(model, stage).observe(value)

    def job_dropped(self, reason: str) -> None:
        self.dropped.labels(reason).inc()

    def job_failed(self, model: str, error: BaseException) -> None:
        self.failed.labels(model, type(error).__name__).inc()

    def worker_restarted(self, worker: int) -> None:
        self.restarts.labels(str(worker)).inc()

    # ------------------------------------------------------------------------------------------------ the HTTP side

    def request_done(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.request_seconds.labels(endpoint).observe(seconds)

    def render(self) -> bytes:
        """The registry in Prometheus' text format, GPU memory read now."""
        memory = getattr(self._worker, "memory", None)
        figures = memory() if callable(memory) else None  # None: a worker in this process
        states = getattr(self._worker, "worker_states", None)
        for index in (states() if callable(states) else {}):
            self.restarts.labels(index)  # shown at 0 before the first restart
        if figures is None:
            self._read_gpu_memory()
        else:
            self._worker_memory(figures)
        return generate_latest(self.registry)

    def _worker_memory(self, figures: dict[str, dict[str, Any]]) -> None:
        """Worker processes' memory as they reported it: {index: {device, rss_bytes, gpu_allocated_bytes}}; a
        process that exited drops out."""
        self.worker_memory.clear()
        self.gpu_memory.clear()
        for index, figure in figures.items():
            self.worker_memory.labels(index).set(figure.get("rss_bytes", 0))
            if str(figure.get("device", "")).startswith("cuda"):
                self.gpu_memory.labels(figure["device"]).set(figure.get("gpu_allocated_bytes", 0))

    def _read_gpu_memory(self) -> None:
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency
            return
        if not torch.cuda.is_available():
            return
        for index in range(torch.cuda.device_count()):
            self.gpu_memory.labels(f"cuda:{index}").set(torch.cuda.memory_allocated(index))


def _reader(read: Callable[[], float]) -> Callable[[], float]:
    """A gauge function that never fails a scrape."""
    def value() -> float:
        try:
            return float(read())
        except Exception:  # noqa: BLE001 - a scrape shows 0 rather than failing
            return 0.0
    return value
