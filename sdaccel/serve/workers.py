"""A pool of worker processes, one per device, behind one HTTP server: `sdaccel serve --gpus 0,1`.

Each child process runs its own Worker (worker.py): its own models, engines, queue and batching, on one device. One
process per GPU keeps each GPU's CUDA context, captured graphs and allocator to itself, and the Python that launches
its kernels off the other GPUs' GIL. The front process (the HTTP app) never computes and never initialises CUDA: it
dispatches each job to the child with the fewest outstanding images (ready children first, ties in turn) and sets
the job's future from the child's answer. ProcessWorkers and Worker share one interface (worker_api.WorkerBase), so
create_app takes either. The child's side is worker_process.py.

Children start with multiprocessing's "spawn" (a forked CUDA runtime is unusable); a "cuda:N" child sees only GPU N
(CUDA_VISIBLE_DEVICES) and runs on "cuda". As with any spawn, a script that builds a pool must guard its entry point
with `if __name__ == "__main__":`. Each child talks to the front over one duplex Pipe:

    front -> child   ("job", id, fields), ("cancel", id), ("interrupt", skip, call number), ("abort", reason),
                     ("stop", drain)
    child -> front   ("ready",), ("failed", error), ("result", id, JobResult), ("error", id, error),
                     ("event", name, args), ("progress", snapshot), ("memory", figures), ("stopped",),
                     ("embeddings", {model: listing}) before ("ready",), ("preview", previews.Preview)

Queue bound: the front refuses a job (QueueFullError, 429) when every child holds `max_queue` jobs beyond its running
call, so a child's own queue (of the same size) never overflows. Progress: a child reports a call's start and end,
and its step at most every worker_process.PROGRESS_S, with each new live preview (a small uint8 array; the front
encodes a PNG only when /progress asks); interrupt() tells each busy child to stop its running call, abort() each
child to fail its jobs and stop its call (worker.py). Estimates: a child reports its models' rates (a job_rates
event) after its start's calibration and each timed call; the front's submit estimates jobs with them. Memory: a
child reports its resident memory and its GPU's allocated memory when ready and after each call (metrics.py shows them).

A child that exits unexpectedly (killed, out of memory, a crash) fails its outstanding jobs with NoWorkerError (503,
retry) and starts again on its device after a backoff (RESPAWN_FIRST_S, doubled at each exit that follows, at most
RESPAWN_MAX_S; the first wait again once a child served STABLE_S), the others serving meanwhile; worker_restarted
counts each restart. A restarted child that fails to load is stopped and tried again the same way. ready() is true
while one child at least is ready (the first start waits for all); while none runs, submit raises NoWorkerError. At the
first start, a child that fails to load or exits before it is ready fails the pool (a bad model: the server says so).
Children ignore SIGINT and SIGTERM (a terminal's Ctrl-C, or a service manager's SIGTERM to every process, reaches
them too): the front stops them once it has drained, and a child whose front died sees its pipe close and stops.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import logging
import math
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, InvalidStateError
from typing import Any, Mapping, Sequence

from ..errors import UsageError
from .controlnets import controlnet_plan
from .ip_adapters import ip_adapter_plan
from .jobs import CancelledJobError, Job, NoWorkerError
from .previews import PREVIEW_EVERY, check_preview_every
from .worker_api import WorkerBase, WorkerEvents
from .worker_process import child_device, child_main

__all__ = ["ProcessWorkers", "child_device"]

log = logging.getLogger("sdaccel.serve")

# What of a Job crosses to its process. deadline and submitted are time.monotonic() values, which hold in another
# process (Linux' CLOCK_MONOTONIC is system-wide).
JOB_FIELDS = ("model", "prompt", "negative_prompt", "n", "seed", "subseed", "settings", "loras", "deadline",
              "submitted")
_ENV_LOCK = threading.Lock()  # CUDA_VISIBLE_DEVICES is set around each child's start: one start at a time
RESPAWN_FIRST_S = 1.0  # a child that exited starts again after this; each exit that follows doubles the wait
RESPAWN_MAX_S = 30.0  # the longest wait before a restart
STABLE_S = 60.0  # a child ready this long before it exits starts again after RESPAWN_FIRST_S


class _Child:
    """The front's view of one worker process."""

    def __init__(self, index: int, device: str, process, conn):
        self.index, self.device, self.process, self.conn = index, device, process, conn
        self.send_lock = threading.Lock()
        self.jobs: dict[int, Job] = {}  # sent to it and not answered yet
        self.ready = False
        self.gone = False  # exited, or stopped: no more jobs
        self.progress: dict[str, Any] = {}  # its running call (Progress.snapshot()), {} when idle
        self.memory: dict[str, int] = {}  # its latest memory figures
        self.preview = None  # its running call's newest live preview (previews.Preview)
        self.reader: threading.Thread | None = None
        self.generation = 0  # how many processes ran on its device before it
        self.exits = 0  # its device's processes' exits in a row, none of them ready STABLE_S (the backoff's exponent)
        self.ready_at: float | None = None  # time.monotonic() when it reported ready
        self.exit_code: int | None = None
        self.load_error: BaseException | None = None  # why a restarted child failed to load
        self.respawn_at: float | None = None  # time.monotonic() when the next process on its device starts

    def queued(self) -> int:
        """Jobs it holds beyond its running call (an overestimate while answers are on their way: safe)."""
        return max(0, len(self.jobs) - self.progress.get("jobs", 0))

    def images(self) -> int:
        return sum(job.n for job in self.jobs.values())

    def send(self, message: tuple) -> None:
        with self.send_lock:
            self.conn.send(message)


class _PoolProgress:
    """The pool's progress for /sdapi/v1/progress: the call of a busy worker process, if any."""

    def __init__(self, children: list[_Child]):
        self._children = children

    def _running(self) -> _Child | None:
        return next((c for c in self._children if c.progress and not c.gone), None)

    def snapshot(self) -> dict[str, Any]:
        child = self._running()
        return {} if child is None else dict(child.progress)

    def preview(self):
        """The live preview of the call snapshot() shows (None: none yet, or idle)."""
        child = self._running()
        return None if child is None else child.preview


class ProcessWorkers(WorkerBase):
    """Workers in child processes, one per device in `devices` ("cuda:0", "cuda:1", or "cpu" several times), each
    loading `models` on `engine` as Worker does; the other settings are Worker's, `max_queue` per process. `events`
    gets the events every process reports."""

    def __init__(self, models: Mapping[str, str], engine: str = "eager",
                 engine_options: Mapping[str, Any] | None = None, devices: Sequence[str] = ("cpu",),
                 dtype: str | None = None, max_batch: int = 8, batch_window_ms: float = 5.0, max_queue: int = 64,
                 warm: tuple[tuple[int, int, int], ...] = (), events: WorkerEvents | None = None,
                 embeddings: str | None = None, controlnets: Mapping[str, str] | None = None,
                 preview_every: int = PREVIEW_EVERY, ip_adapters: Mapping[str, str] | None = None,
                 ip_image_encoder: str | None = None):
        super().__init__(models, max_batch=max_batch, batch_window_ms=batch_window_ms, max_queue=max_queue,
                         events=events)
        self.controlnets = dict(controlnets or {})
        self.model_controlnets = controlnet_plan(self.models, self.controlnets)  # what every child loads
        self.ip_adapters = dict(ip_adapters or {})
        self.model_ip_adapters = ip_adapter_plan(self.models, self.ip_adapters)
        self.preview_every = check_preview_every(preview_every)
        if not devices:
            raise UsageError("no device to run workers on")
        self.devices = [str(d) for d in devices]
        self.engine, self.dtype = engine, dtype
        # Each child builds its Worker with these keywords (and its own device and events).
        self._config = dict(models=self.models, engine=engine, engine_options=dict(engine_options or {}), dtype=dtype,
                            max_batch=max_batch, batch_window_ms=batch_window_ms, max_queue=max_queue,
                            warm=tuple(warm), embeddings=embeddings, controlnets=self.controlnets,
                            preview_every=preview_every, ip_adapters=self.ip_adapters,
                            ip_image_encoder=ip_image_encoder)
        self._children: list[_Child] = []
        self.progress = _PoolProgress(self._children)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._turn = 0
        self._stopping = False
        self._plan: list[tuple[str, str | None, int | None]] = []  # each child's (device, visible GPUs, threads)
        self._timers: list[threading.Timer] = []  # restarts waiting for their backoff

    # ------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start one process per device; each loads and warms its models, and ready() says when all have."""
        cpus = sum(1 for d in self.devices if d == "cpu")
        plan = [child_device(device) for device in self.devices]  # every device checked before any process starts
        self._plan = [(local, visible, max(1, (os.cpu_count() or 1) // cpus) if local == "cpu" else None)
                      for local, visible in plan]
        for index in range(len(self.devices)):
            child = self._spawn(index)
            with self._lock:
                self._children.append(child)
            self._listen(child)
        atexit.register(self._at_exit)  # runs before multiprocessing's own exit handler, which joins children

    def _spawn(self, index: int) -> _Child:
        """Start the process of device `index` (not yet read from)."""
        local, visible, threads = self._plan[index]
        ctx = multiprocessing.get_context("spawn")
        front, back = ctx.Pipe()
        process = ctx.Process(target=child_main, args=(local, self._config, threads, back),
                              name=f"sdaccel-worker-{index}")
        with _ENV_LOCK:
            previous = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible
            try:
                process.start()
            except BaseException:
                front.close()
                raise
            finally:
                back.close()
                if previous is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = previous
        return _Child(index, self.devices[index], process, front)

    def _listen(self, child: _Child) -> None:
        child.reader = threading.Thread(target=self._read, args=(child,), name=f"sdaccel-worker-{child.index}-reader",
                                        daemon=True)
        child.reader.start()

    def ready(self) -> bool:
        """Every process loaded and warmed its models once, and one at least is ready now."""
        with self._lock:
            return self._failed is None and self._settled.is_set() and any(c.ready and not c.gone
                                                                           for c in self._children)

    def unhealthy_reason(self) -> str | None:
        why = super().unhealthy_reason()
        if why is not None:
            return why
        with self._lock:
            if self._stopping or not self._children or any(not c.gone for c in self._children):
                return None
            return "no worker process is running: " + "; ".join(self._describe(c) for c in self._children)

    def not_ready_reason(self) -> str | None:
        why = self.unhealthy_reason()
        if why is not None or self.ready():
            return why
        with self._lock:
            waiting = [self._describe(c) for c in self._children if c.gone or not c.ready]
        return "; ".join(waiting) or "the worker processes are not started"

    def worker_states(self) -> dict[str, str]:
        with self._lock:
            return {str(c.index): self._state(c) for c in self._children}

    def _state(self, child: _Child) -> str:
        if not child.gone:
            return "ready" if child.ready else "failed" if child.load_error is not None else "loading"
        if self._stopping:
            return "stopped"
        return "restarting" if child.respawn_at is not None else "failed"

    def _describe(self, child: _Child) -> str:
        """A child's state in words, for the probes."""
        state, name = self._state(child), f"worker process {child.index}"
        if state != "restarting":
            return f"{name}: {state}" + (f" (exited, code {child.exit_code})" if child.gone else "")
        why = (f"failed to load ({child.load_error})" if child.load_error is not None
               else f"exited (code {child.exit_code})")
        wait = math.ceil(child.respawn_at - time.monotonic())
        return f"{name}: restarting after it {why}, " + (f"next try in {wait} s" if wait > 0 else "starting now")

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Refuse new jobs; each process finishes its queued jobs with `drain` (else fails them) and exits. A process
        still running after `timeout` is killed (it ignores SIGTERM). Jobs left unanswered fail with
        CancelledJobError."""
        with self._lock:
            self._stopping = True
            children = list(self._children)
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()  # a restart that has not begun; one under way sees _stopping
        for child in children:
            if not child.gone:
                try:
                    child.send(("stop", drain))
                except (OSError, ValueError):
                    pass  # already gone
        until = None if timeout is None else time.monotonic() + timeout
        for child in children:
            child.process.join(None if until is None else max(0.0, until - time.monotonic()))
            if child.process.is_alive():
                log.warning("worker process %d did not stop in time: killing it", child.index)
                child.process.kill()
                child.process.join(10)
        for child in children:
            if child.reader is not None:
                child.reader.join(10)
            self._gone(child)  # whatever is left unanswered
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        self.stop(drain=False, timeout=10)  # a pool never stopped: its processes must not outlive the front

    def begin_shutdown(self) -> None:
        """Refuse new jobs (and restart no process); the processes go on with the jobs they hold."""
        with self._lock:
            self._stopping = True

    def abort(self, reason: str = "the server is shutting down") -> None:
        """Refuse new jobs and tell each process to fail its queued jobs and stop its running call (worker.py's
        abort); their answers come back as errors."""
        self.begin_shutdown()
        for child in [c for c in self._children if not c.gone]:
            try:
                child.send(("abort", reason))
            except (OSError, ValueError):
                pass  # gone meanwhile: its jobs fail as it goes

    # ----------------------------------------------------------------------------------------------- jobs

    def queue_depth(self) -> int:
        with self._lock:
            return sum(c.queued() for c in self._children if not c.gone)

    def busy(self) -> bool:
        return any(c.progress for c in self._children if not c.gone)

    def interrupt(self, skip: bool = False) -> bool:
        """Stop every process's running call at its next step boundary. Each is named by its number, so a call
        that ended while the message was on its way is not followed by its process's next one being stopped."""
        asked = False
        for child in [c for c in self._children if c.progress and not c.gone]:
            try:
                child.send(("interrupt", skip, child.progress.get("call")))
                asked = True
            except (OSError, ValueError):
                pass  # gone meanwhile
        return asked

    def memory(self) -> dict[str, dict[str, Any]]:
        """Each running process's latest memory figures by its index: {device, rss_bytes, gpu_allocated_bytes}."""
        with self._lock:
            return {str(c.index): dict(c.memory, device=c.device) for c in self._children
                    if c.memory and not c.gone}

    def _enqueue(self, job: Job) -> Future:
        """Hand `job` to the process with the fewest outstanding images; QueueFullError when every process's queue
        is full."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            if not self._children:
                raise RuntimeError("the worker processes are not started (start())")
            live = [c for c in self._children if not c.gone]
            if not live:
                raise NoWorkerError("no worker process is running: " + "; ".join(
                    self._describe(c) for c in self._children), self._retry_after_s())
            open_ = [c for c in live if c.queued() < self.max_queue]
            if not open_:
                raise self._queue_full(sum(c.images() for c in live), len(live))
            self._turn += 1
            turn = self._turn % len(open_)
            child = min(open_[turn:] + open_[:turn], key=lambda c: (not c.ready, c.images()))
            job_id = next(self._ids)
            child.jobs[job_id] = job
        try:
            child.send(("job", job_id, {name: getattr(job, name) for name in JOB_FIELDS}))
        except (OSError, EOFError):  # the process exited just now (its reader has not seen it yet)
            with self._lock:
                child.jobs.pop(job_id, None)
            raise NoWorkerError(f"worker process {child.index} exited: retry") from None
        except Exception as exc:  # noqa: BLE001 - settings that do not pickle
            with self._lock:
                child.jobs.pop(job_id, None)
            raise RuntimeError(f"could not hand the job to worker process {child.index}: {exc}") from None
        job.on_cancel = functools.partial(self._cancel, child, job_id)
        job.future.add_done_callback(lambda future: future.cancelled() and self._cancel(child, job_id))
        if job.cancelled.is_set():
            self._cancel(child, job_id)
        return job.future

    def _cancel(self, child: _Child, job_id: int) -> None:
        """Tell the job's process it is cancelled: dropped if queued; a running call stops once none of its jobs is
        wanted."""
        if job_id in child.jobs and not child.gone:
            try:
                child.send(("cancel", job_id))
            except (OSError, ValueError):
                pass

    # ------------------------------------------------------------------------------------------ the readers

    def _read(self, child: _Child) -> None:
        """One child's messages until it exits."""
        while True:
            try:
                message = child.conn.recv()
            except (EOFError, OSError):
                break
            try:
                self._handle(child, message)
            except Exception:  # noqa: BLE001 - a failing event handler must not stop the answers
                log.exception("handling worker process %d's %r failed", child.index, message[0])
        self._gone(child)

    def _handle(self, child: _Child, message: tuple) -> None:
        kind = message[0]
        if kind in ("result", "error"):
            with self._lock:
                job = child.jobs.pop(message[1], None)
            if job is None or job.future.done():
                return  # its waiter cancelled it meanwhile
            try:
                if kind == "result":
                    message[2].worker = child.index
                    job.future.set_result(message[2])
                else:
                    job.future.set_exception(message[2])
            except InvalidStateError:
                pass
        elif kind == "event":
            name, args = message[1], message[2]
            if name == "batch_done":
                self._call_done(seconds=args[3], images=args[2])
            elif name == "job_rates":  # the process's timed rates: the front estimates jobs with them (estimate.py)
                self.rates.reported(*args)
            getattr(self.events, name)(*args)
        elif kind == "progress":
            child.progress = message[1]
            if not message[1]:  # the call ended: so did its previews
                child.preview = None
        elif kind == "preview":
            child.preview = message[1]
        elif kind == "memory":
            child.memory = message[1]
        elif kind == "embeddings":  # every process loads the same models and embeddings
            self.loaded_embeddings = message[1]
        elif kind == "ready":
            child.ready, child.ready_at = True, time.monotonic()
            if child.generation:
                log.warning("worker process %d (%s) is ready again", child.index, child.device)
            with self._lock:
                if len(self._children) == len(self.devices) and all(c.ready for c in self._children):
                    self._settled.set()
        elif kind == "failed" and child.generation:  # a restarted child: stopped, and tried again after a backoff
            log.error("worker process %d (%s) failed to load after its restart: %s", child.index, child.device,
                      message[1])
            child.load_error = message[1]
            try:
                child.send(("stop", False))
            except (OSError, ValueError):
                pass  # exited already
        elif kind == "failed":
            log.error("worker process %d (%s) failed to start: %s", child.index, child.device, message[1])
            child.load_error = message[1]
            with self._lock:
                self._failed = self._failed or message[1]
            self._settled.set()

    def _gone(self, child: _Child) -> None:
        """The child exited (or stopped): fail what it had not answered, send it nothing more, and unless the pool
        stops or never started, start another in its place after a backoff."""
        child.process.join(5)
        code = child.process.exitcode
        with self._lock:
            expected = self._stopping
            first = not child.gone
            child.gone, child.progress, child.exit_code = True, {}, code
            jobs = list(child.jobs.values())
            child.jobs.clear()
            if not expected and not child.ready and not child.generation and self._failed is None:
                self._failed = RuntimeError(f"worker process {child.index} exited (code {code}) before it was ready")
                self._settled.set()
            restart = first and not expected and self._failed is None
            delay = self._plan_restart(child) if restart else None
            retry_after = self._retry_after_s()
        if first and not expected:
            log.error("worker process %d (%s) exited (code %s): %d job(s) failed%s", child.index, child.device, code,
                      len(jobs), "" if delay is None else f"; starting it again in {delay:g} s")
        if first:
            child.conn.close()
        for job in jobs:
            error = (CancelledJobError("the server is shutting down") if expected
                     else NoWorkerError(f"worker process {child.index} exited (code {code}) before it answered: retry",
                                        retry_after))
            if not job.future.done():
                try:
                    job.future.set_exception(error)
                except InvalidStateError:
                    pass

    # ------------------------------------------------------------------------------------------- restarts

    def _plan_restart(self, child: _Child) -> float:
        """Start a process in the place of `child` (gone) after its backoff; the wait in seconds. Under the lock."""
        now = time.monotonic()
        stable = child.ready_at is not None and now - child.ready_at >= STABLE_S
        child.exits = 1 if stable else child.exits + 1
        delay = min(RESPAWN_MAX_S, RESPAWN_FIRST_S * 2 ** min(child.exits - 1, 16))
        child.respawn_at = now + delay
        timer = threading.Timer(delay, self._restart, args=(child,))
        timer.daemon = True
        self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()
        return delay

    def _restart(self, old: _Child) -> None:
        """A new process on the device of `old`, which exited (on a timer's thread, after the backoff)."""
        with self._lock:
            if self._stopping or self._children[old.index] is not old:
                return
        try:
            child = self._spawn(old.index)
        except Exception as exc:  # noqa: BLE001 - no process could start (out of memory, too many): later again
            with self._lock:
                if not self._stopping:
                    old.ready_at = None
                    delay = self._plan_restart(old)
                    log.error("worker process %d could not start again (%s): next try in %g s", old.index, exc,
                              delay)
            return
        child.generation, child.exits = old.generation + 1, old.exits
        with self._lock:
            stopping = self._stopping
            if not stopping:
                self._children[old.index] = child
        if stopping:  # stop() began meanwhile and did not see this process
            child.process.kill()
            child.process.join(10)
            child.conn.close()
            return
        log.warning("worker process %d (%s) started again (restart %d)", child.index, child.device, child.generation)
        self.events.worker_restarted(child.index)
        self._listen(child)

    def _retry_after_s(self) -> float:
        """Seconds until a process may take jobs again: 1 while one runs, else until the next restart (its loading
        comes on top)."""
        if any(not c.gone for c in self._children):
            return 1.0
        planned = [c.respawn_at for c in self._children if c.respawn_at is not None]
        return max(1.0, min(planned) - time.monotonic()) if planned else 1.0
