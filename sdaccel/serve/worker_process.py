"""A worker process of ProcessWorkers (workers.py): a Worker on one device, fed with the front's jobs over a duplex
Pipe, its events, progress and memory sent back (the messages are listed in workers.py)."""

from __future__ import annotations

import functools
import os
import pickle
import signal
import threading
import time
from typing import Any

from ..errors import UsageError
from .jobs import CancelledJobError, Job
from .progress import Progress
from .worker_api import WorkerEvents

PROGRESS_S = 0.2  # a child's step updates at most this often (start and end are always sent)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives a pickle round trip, else a RuntimeError with its text: what crosses the pipe must
    unpickle on the other side."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure to pickle or unpickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def process_memory(device: str) -> dict[str, int]:
    """This process's resident host memory (Linux' /proc; 0 elsewhere) and its GPU memory allocated by torch."""
    rss = 0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    gpu = 0
    if device.startswith("cuda"):
        import torch

        gpu = int(torch.cuda.memory_allocated())
    return {"rss_bytes": rss, "gpu_allocated_bytes": gpu}


class _ForwardEvents(WorkerEvents):
    """A child Worker's events, sent to the front (with the memory figures after each call)."""

    def __init__(self, send, device: str):
        self._send, self._device = send, device

    def batch_done(self, model: str, jobs: int, images: int, seconds: float, timings: dict[str, float]) -> None:
        self._send("event", "batch_done", (model, jobs, images, seconds, timings))
        self._send("memory", process_memory(self._device))

    def job_dropped(self, reason: str) -> None:
        self._send("event", "job_dropped", (reason,))

    def job_failed(self, model: str, error: BaseException) -> None:
        self._send("event", "job_failed", (model, portable(error)))

    def job_rates(self, rates: dict, shapes: dict) -> None:
        self._send("event", "job_rates", (rates, shapes))


class _ForwardProgress(Progress):
    """A child Worker's progress, sent to the front: each call's start and end and a client's stop at once, its
    steps throttled, each new live preview (its uint8 pixels) with the step that follows it."""

    def __init__(self, send, preview_every: int):
        super().__init__(preview_every)
        self._send, self._sent, self._preview_sent = send, 0.0, None

    def start(self, jobs: list[Job], steps: int, spec=None) -> None:
        super().start(jobs, steps, spec)
        self._send("progress", self.snapshot())
        self._sent = time.monotonic()

    def step(self, index: int, timestep: float | None = None, latents=None):
        stop = super().step(index, timestep, latents)
        if time.monotonic() - self._sent >= PROGRESS_S:
            self._send("progress", self.snapshot())
            preview = self.preview()
            if preview is not None and preview is not self._preview_sent:
                self._send("preview", preview)
                self._preview_sent = preview
            self._sent = time.monotonic()
        return stop

    def request_stop(self, skip: bool = False, call: int | None = None) -> bool:
        asked = super().request_stop(skip, call)
        if asked:
            self._send("progress", self.snapshot())
        return asked

    def finish(self) -> None:
        super().finish()
        self._preview_sent = None
        self._send("progress", {})


def child_main(device: str, config: dict[str, Any], threads: int | None, conn) -> None:
    """A worker process: a Worker on `device` fed with the front's jobs until the front says stop or goes away."""
    # Ctrl-C, and a SIGTERM sent to the whole process group or cgroup, reach this process too: the front drains and
    # stops it (a front that dies closes the pipe, which stops it too).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lock = threading.Lock()

    def send(*message) -> None:
        try:
            with lock:
                conn.send(message)
        except (OSError, ValueError):  # the front is gone: the loop below sees it too
            pass

    if threads:
        import torch

        torch.set_num_threads(threads)  # CPU workers share the cores rather than each taking them all
    from .worker import Worker

    try:
        worker = Worker(device=device, events=_ForwardEvents(send, device), **config)
    except Exception as exc:  # noqa: BLE001 - bad settings: reported as a failed start
        send("failed", portable(exc))
        conn.close()
        return
    worker.progress = _ForwardProgress(send, worker.preview_every)
    worker.start()
    threading.Thread(target=_report_ready, args=(worker, device, send), name="sdaccel-ready", daemon=True).start()
    jobs: dict[int, Job] = {}  # submitted here, not answered yet: for ("cancel", id)

    def done(job_id: int, future) -> None:
        jobs.pop(job_id, None)
        if future.cancelled():
            send("error", job_id, CancelledJobError("cancelled before it ran"))
        elif future.exception() is not None:
            send("error", job_id, portable(future.exception()))
        else:
            try:
                send("result", job_id, future.result())
            except Exception as exc:  # noqa: BLE001 - a result that does not pickle fails its job, not the thread
                send("error", job_id, RuntimeError(f"the result could not be sent to the server: {exc}"))

    drain = False
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break  # the front went away: stop without draining
            if message[0] == "job":
                job_id, job = message[1], Job(**message[2])
                jobs[job_id] = job
                try:
                    future = worker.submit(job)
                except Exception as exc:  # noqa: BLE001 - QueueFullError, UsageError, RuntimeError: answered now
                    jobs.pop(job_id, None)
                    send("error", job_id, portable(exc))
                    continue
                future.add_done_callback(functools.partial(done, job_id))
            elif message[0] == "cancel":
                job = jobs.get(message[1])
                if job is not None:
                    job.cancel()
            elif message[0] == "interrupt":  # (skip, the call's number): that call only, if it still runs
                worker.interrupt(message[1], message[2])
            elif message[0] == "abort":  # its jobs fail with the reason; the front stops it later
                worker.abort(message[1])
            elif message[0] == "stop":
                drain = message[1]
                break
    finally:
        worker.stop(drain)
        send("stopped")
        conn.close()


def _report_ready(worker, device: str, send) -> None:
    try:
        worker.wait_ready()
    except BaseException as exc:  # noqa: BLE001 - reported to the front, which refuses jobs from then on
        send("failed", portable(exc))
        return
    send("memory", process_memory(device))
    send("embeddings", worker.loaded_embeddings)
    send("ready")


def child_device(device: str) -> tuple[str, str | None]:
    """The device a child runs on, and the CUDA_VISIBLE_DEVICES it gets: "cuda:N" is ("cuda", GPU N), GPU N counted
    among the front's own visible GPUs; other devices are kept as they are."""
    if not device.startswith("cuda"):
        return device, None
    index = int(device.partition(":")[2] or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return "cuda", str(index)
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if index >= len(entries):
        raise UsageError(f"{device}: CUDA_VISIBLE_DEVICES={visible!r} has no GPU {index}")
    return "cuda", entries[index]
