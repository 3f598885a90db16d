"""The worker: one device's pipelines and the one thread that runs their calls, fed by a bounded queue with dynamic
batching.

The GPU runs one call at a time, so one thread owns it: the HTTP layer submits jobs (submit returns a Future, after
the cheap checks of worker_api.py) and never computes. The thread takes the oldest job, then for up to
`batch_window_ms` gathers queued jobs with the same batch key (jobs.py) until `max_batch` images, and runs them as
one pipeline call: the fast engine's captured graphs for that batch size replay for all of them. Every call passes
one seed per image (each job's seed, seed + 1, ...: job_seeds), so a job gets the same images alone or batched, and
merges the call's LoRA set first where another one is merged (loras.use_loras: no recapture). The call resolves the
request (init image, mask, the checks against the model) once, on this thread; what it refuses fails the call's jobs
with its UsageError. Where shapes were warmed at start (`warm`), a batch keeps to an image count warmed for its size,
so a new count's graphs are not captured while requests wait. A job that waited past its deadline, or whose client
went away, is dropped before it runs; a running call none of whose jobs is wanted any more (each cancelled, or past
its deadline) stops at its next denoising step and its jobs fail with CancelledJobError (progress.py), while a job
cancelled beside others still wanted leaves their call running. A full queue refuses new jobs at once
(QueueFullError, the HTTP layer's 429), with a Retry-After from the recent time per image. After loading, two short
calls per model (1 and 3 steps, at a warmed shape, else the model's default size) seed the rate that
`max_job_seconds` estimates jobs with (estimate.py); each whole call then updates it. begin_shutdown() refuses new
jobs; abort(reason) also fails the queued ones and stops the running call at its next step, its jobs failed too;
stop(drain=True) refuses new jobs and finishes every queued one.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Mapping

from ..models.schedulers import STOCHASTIC_SCHEDULERS, canonical
from ..pipeline.presets import get_preset
from .controlnets import controlnet_plan
from .estimate import ModelShape, calibrate, job_work
from .ip_adapters import ip_adapter_plan
from .jobs import CancelledJobError, DeadlineExceededError, Job, JobResult, batch_key
from .loras import use_loras
from .previews import PREVIEW_EVERY, check_preview_every
from .progress import Progress, why_unwanted
from .worker_api import WorkerBase, WorkerEvents, embeddings_listing, job_seeds, job_subseeds, output_size

log = logging.getLogger("sdaccel.serve")


def _fail(job: Job, error: BaseException) -> None:
    """Fail a job's future unless its waiter cancelled it (setting a cancelled future raises)."""
    if not job.future.done():
        job.future.set_exception(error)


class Worker(WorkerBase):
    """Models on one device behind a queue. `models`: {name: model reference (as sdaccel.load takes)}; each is loaded
    on `engine` with `engine_options`. `warm`: (height, width, images) shapes each model runs once at start, so
    their kernels and graphs are ready before the first request (ready() turns true after). `events`: where the
    calls are reported (a Metrics; default: nowhere). `embeddings`: a folder of textual-inversion embeddings every
    model loads (sdaccel.load's embeddings=), each taking the files made for it. `controlnets`: {name: reference},
    each loaded beside every model it fits (controlnets.controlnet_plan); `ip_adapters` likewise (ip_adapters.py),
    with `ip_image_encoder` their CLIP vision encoder (sdaccel.load's). `preview_every`: steps between the live
    previews /sdapi/v1/progress shows (previews.py; 0: none). interrupt() ends the running call early (progress.py).
    `max_job_seconds`: a job estimated to run longer is refused at submit (0: no limit; worker_api.WorkerBase)."""

    def __init__(self, models: Mapping[str, str], engine: str = "eager",
                 engine_options: Mapping[str, Any] | None = None, device: str | None = None,
                 dtype: str | None = None, max_batch: int = 8, batch_window_ms: float = 5.0, max_queue: int = 64,
                 warm: tuple[tuple[int, int, int], ...] = (),
                 events: WorkerEvents | None = None, loader: Callable[..., Any] | None = None,
                 embeddings: str | None = None, controlnets: Mapping[str, str] | None = None,
                 preview_every: int = PREVIEW_EVERY, max_job_seconds: float = 0,
                 ip_adapters: Mapping[str, str] | None = None, ip_image_encoder: str | None = None):
        super().__init__(models, max_batch=max_batch, batch_window_ms=batch_window_ms, max_queue=max_queue,
                         events=events)
        self.max_job_seconds = max_job_seconds
        self.controlnets = dict(controlnets or {})
        self.model_controlnets = controlnet_plan(self.models, self.controlnets)
        self.ip_adapters, self.ip_image_encoder = dict(ip_adapters or {}), ip_image_encoder
        self.model_ip_adapters = ip_adapter_plan(self.models, self.ip_adapters)
        self.preview_every = check_preview_every(preview_every)
        self.engine, self.engine_options = engine, dict(engine_options or {})
        self.device, self.dtype = device, dtype
        self.warm = tuple(warm)
        self._loader = loader
        self.embeddings_source = embeddings
        self.pipes: dict[str, Any] = {}
        self.progress = Progress(preview_every)
        self._queue: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._accepting = True
        self._stopping = False
        self._busy = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Load the models and warm their shapes on the worker's thread; ready() says when that is done."""
        self._thread = threading.Thread(target=self._main, name="sdaccel-worker", daemon=True)
        self._thread.start()

    def ready(self) -> bool:
        return self._settled.is_set() and self._failed is None

    def unhealthy_reason(self) -> str | None:
        if self._thread is not None and not self._thread.is_alive() and not self._stopping and not self._failed:
            return "the worker's thread exited"  # nothing would run the queued jobs
        return super().unhealthy_reason()

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Refuse new jobs; with `drain` finish the queued and running ones first, else fail the queued ones."""
        with self._cv:
            self._accepting = False
            if not drain:
                while self._queue:
                    _fail(self._queue.popleft(), CancelledJobError("the server is shutting down"))
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def begin_shutdown(self) -> None:
        with self._cv:
            self._accepting = False

    def abort(self, reason: str = "the server is shutting down") -> None:
        with self._cv:
            self._accepting = False
            self.progress.abort(reason)  # before the queue empties: a batch being gathered is stopped too
            while self._queue:
                _fail(self._queue.popleft(), CancelledJobError(reason))
            self._cv.notify_all()

    # ----------------------------------------------------------------------------------------------- jobs

    def queue_depth(self) -> int:
        with self._cv:
            return len(self._queue)

    def busy(self) -> bool:
        return self._busy

    def interrupt(self, skip: bool = False, call: int | None = None) -> bool:
        """Stop the running call (the call numbered `call`, if given) at its next step boundary (progress.py)."""
        return self.progress.request_stop(skip, call)

    def _enqueue(self, job: Job) -> Future:
        with self._cv:
            if not self._accepting:
                raise RuntimeError("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise self._queue_full(sum(j.n for j in self._queue))
            self._queue.append(job)
            self._cv.notify_all()
        return job.future

    # ------------------------------------------------------------------------------------------ the thread

    def _main(self) -> None:
        try:
            self._load()
        except BaseException as exc:  # noqa: BLE001 - reported by ready()/submit(); the thread must not die silently
            log.exception("loading the models failed")
            self._failed = exc
            self._settled.set()
            with self._cv:
                while self._queue:
                    _fail(self._queue.popleft(), RuntimeError(f"the worker failed to start: {exc}"))
            return
        self._settled.set()
        while True:
            jobs = self._next_batch()
            if jobs is None:
                return
            if jobs:
                self._run(jobs)

    def _load(self) -> None:
        from ..pipeline.load import load

        load = self._loader or load
        for name, ref in self.models.items():
            log.info("loading %s (%s) on the %s engine", name, ref, self.engine)
            extra = {} if self.embeddings_source is None else {"embeddings": self.embeddings_source}
            if self.model_controlnets[name]:
                extra["controlnet"] = [self.controlnets[net] for net in self.model_controlnets[name]]
            if self.model_ip_adapters[name]:  # in order: a request's image prompts are placed by it
                extra["ip_adapter"] = [self.ip_adapters[a] for a in self.model_ip_adapters[name]]
                if self.ip_image_encoder is not None:
                    extra["ip_image_encoder"] = self.ip_image_encoder
            self.pipes[name] = load(ref, engine=self.engine, device=self.device, dtype=self.dtype,
                                    **extra, **self.engine_options)
            self.loaded_embeddings[name] = embeddings_listing(self.pipes[name])
        for name, pipe in self.pipes.items():
            for height, width, images in self.warm:
                log.info("warming %s at %dx%d x%d", name, width, height, images)
                # Decoded too (the image stays on the device): the decoder's graph for this batch is captured
                # now, not by the first request, whose memory would then grow after the warm-up.
                pipe("warm-up", height=height, width=width, batch_size=images, output="tensor")
        for name, pipe in self.pipes.items():
            self._calibrate(name, pipe)
        self.events.job_rates(self.rates.snapshot(), dict(self.rates.shapes))

    def _calibrate(self, name: str, pipe) -> None:
        """Seed the model's rate (estimate.calibrate) with two short calls at a shape its graphs exist for: its first
        warmed one, else its default size, batch 1. Where that fails, its jobs are estimated once a call of theirs
        is timed (never without a spec)."""

        def run(steps: int) -> float:
            started = time.monotonic()
            pipe("calibration", height=height, width=width, batch_size=images, steps=steps, seed=0,
                 output="tensor", callback=lambda i, t, latents: None)
            return time.monotonic() - started

        try:
            shape = ModelShape.of(pipe.spec)
            self.rates.shapes[name] = shape
            height, width, images = self.warm[0] if self.warm else (shape.height, shape.width, 1)
            rate = calibrate(run, shape, height, width, images, warmed=bool(self.warm))
            self.rates.calibrated(name, shape, rate)
            log.info("%s: %.2g s per call + %.3g s per unit of work: jobs are estimated from it", name,
                     rate.per_call, rate.per_work)
        except Exception as exc:  # noqa: BLE001 - an estimate is a guard, not a reason to refuse to serve
            log.warning("%s: could not time a calibration call (%s): its jobs are not estimated yet", name, exc)

    def _next_batch(self) -> list[Job] | None:
        """The next call's jobs (oldest first, then same-key jobs for up to the batching window); None to stop."""
        with self._cv:
            while True:
                while not self._queue:
                    if self._stopping:
                        return None
                    self._cv.wait()
                first = self._queue.popleft()
                if self._usable(first):
                    break
            key = self._key(first)
            batch, images = [first], first.n
            if key is None:
                return batch
            until = time.monotonic() + self.window_s
            while images < self.max_batch:
                for job in list(self._queue):
                    if images + job.n <= self.max_batch and self._key(job) == key:
                        self._queue.remove(job)
                        if self._usable(job):
                            batch.append(job)
                            images += job.n
                left = until - time.monotonic()
                if images >= self.max_batch or left <= 0 or self._stopping:
                    break
                self._cv.wait(left)
            return self._warmed_part(batch)

    def _warmed_part(self, batch: list[Job]) -> list[Job]:
        """The batch cut to an image count warmed at start for its size, the jobs cut off put back at the head of
        the queue for the next call: a count never run before would capture its graphs (about a second, and the
        memory of a new shape) on the request path. Unchanged when its size has no warmed counts or the first job
        alone is not one."""
        counts = self._warmed_counts(batch[0])
        images = sum(job.n for job in batch)
        kept = list(batch)
        while len(kept) > 1 and counts and images not in counts:
            images -= kept.pop().n
        if images not in counts:
            return batch
        for job in reversed(batch[len(kept):]):
            self._queue.appendleft(job)  # already marked running: _usable lets it through again
        return kept

    def _warmed_counts(self, job: Job) -> set[int]:
        size = output_size(self.pipes[job.model].spec, job.settings)
        return {n for h, w, n in self.warm if (h, w) == size}

    def _usable(self, job: Job) -> bool:
        """False (and the job's future failed) for a job whose client left or whose deadline passed. True marks its
        future running: from then on its waiter cannot cancel it, and the worker sets its result."""
        # The deadline first: the HTTP layer cancels a request's jobs at its deadline, a drop still counted as one.
        if job.deadline is not None and time.monotonic() > job.deadline:
            _fail(job, DeadlineExceededError("the request's deadline passed before it could run"))
            self.events.job_dropped("deadline")
            return False
        if job.cancelled.is_set() or job.future.cancelled():
            _fail(job, CancelledJobError("cancelled before it ran"))
            self.events.job_dropped("cancelled")
            return False
        # A job put back by _warmed_part is running already: its waiter could not cancel it since.
        return job.future.running() or job.future.set_running_or_notify_cancel()

    def _key(self, job: Job) -> tuple | None:
        """The job's batch key; None (it runs alone, where the pipeline reports a bad setting as its own error)
        when it must run alone or its settings cannot be read."""
        try:
            return self._batch_key(job)
        except Exception:  # noqa: BLE001 - a bad scheduler or preset name fails this job's call, not the thread
            return None

    def _batch_key(self, job: Job) -> tuple | None:
        pipe = self.pipes[job.model]
        base = getattr(pipe, "base", pipe)
        if pipe is not base:
            return None  # a refiner pair: one call each (control images make a job run alone: jobs.ALONE)
        name = job.settings.get("scheduler")
        if name is None and job.settings.get("preset"):
            name = get_preset(job.settings["preset"]).settings().get("scheduler")
        return batch_key(job, canonical(name or base.spec.default_scheduler) in STOCHASTIC_SCHEDULERS)

    def _run(self, jobs: list[Job]) -> None:
        """One pipeline call for `jobs` (same settings): their prompts side by side, one seed per image."""
        aborted = self.progress.aborted()
        if aborted is not None:  # gathered while abort() emptied the queue
            for job in jobs:
                _fail(job, CancelledJobError(aborted))
            return
        pipe = self.pipes[jobs[0].model]
        settings = {k: v for k, v in jobs[0].settings.items() if v is not None}
        started = time.monotonic()
        self._busy = True
        self.progress.start(jobs, settings.get("steps") or getattr(pipe, "spec").steps, pipe.spec)
        try:
            use_loras(pipe, jobs[0].loras)  # the call's LoRA set (one per batch key), unless merged already
            result = pipe([job.prompt for job in jobs for _ in range(job.n)],
                          [job.negative_prompt for job in jobs for _ in range(job.n)],
                          seeds=[seed for job in jobs for seed in job_seeds(job)],
                          **({"subseed": [s for job in jobs for s in job_subseeds(job)]}
                             if settings.get("subseed_strength") else {}),
                          callback=self.progress.step, **settings)  # steps, previews, and a client's stop
            cancelled = self.progress.cancelled()
        except BaseException as exc:  # noqa: BLE001 - each job gets the error; the worker goes on
            if len(jobs) > 1 and isinstance(exc, Exception):
                # One job's input may fail the whole call: each runs alone, so only the culprit fails.
                log.warning("a call of %d jobs failed (%s): running them one at a time", len(jobs), exc)
                for job in jobs:
                    self._run([job])
                return
            log.warning("a call of %d job(s) failed: %s", len(jobs), exc)
            for job in jobs:
                _fail(job, exc)
                self.events.job_failed(job.model, exc)
            return
        finally:
            self._busy = False
            self.progress.finish()
        seconds = time.monotonic() - started
        images = sum(job.n for job in jobs)
        if cancelled is not None:  # stopped between steps: nobody wants its images (not an interrupt's answer)
            log.info("a call of %d job(s) stopped after %.1f s: %s", len(jobs), seconds, cancelled)
            for job in jobs:
                _fail(job, CancelledJobError(self.progress.aborted() or why_unwanted(job) or cancelled))
            return
        self._call_done(seconds, images)
        if "interrupted_at_step" not in result.params:  # a whole call: its time measures the model's rate
            self._timed(jobs[0].model, seconds, sum(self._work(job) for job in jobs))
        timings = result.timings.as_dict()
        self.events.batch_done(jobs[0].model, len(jobs), images, seconds, timings)
        # Each image's params name its own seed, not the call's list of them.
        shared = {k: v for k, v in result.params.items() if k not in ("seeds", "subseeds")}
        at = 0
        for job in jobs:
            variation = job_subseeds(job) if "subseeds" in result.params else [None] * job.n
            params = [dict(shared, prompt=job.prompt, negative_prompt=job.negative_prompt, seed=seed,
                           batch_size=job.n, **({"subseed": sub} if sub is not None else {}))
                      for seed, sub in zip(job_seeds(job), variation)]
            if job.cancelled.is_set():  # its client left while the call ran for the others
                _fail(job, CancelledJobError("cancelled while it ran"))
            else:
                job.future.set_result(JobResult(images=result.images[at:at + job.n], params=params,
                                                timings=timings, batch_images=images,
                                                queued_s=started - job.submitted))
            at += job.n

    def _work(self, job: Job) -> float:
        """The job's work (estimate.py), 0 where its model's shape is unknown or its settings cannot be read."""
        shape = self.rates.shapes.get(job.model)
        try:
            return 0.0 if shape is None else job_work(job.settings, job.n, shape)
        except Exception:  # noqa: BLE001 - settings the call took but the estimate cannot read: not timed
            return 0.0

    def _timed(self, model: str, seconds: float, work: float) -> None:
        """A call's time into the model's rate, reported to the events (a worker process's front estimates too)."""
        if work > 0:
            self.rates.measured(model, seconds, work)
            self.events.job_rates(self.rates.snapshot(), {})
