"""What the HTTP app uses of a worker: WorkerBase, the one interface of the in-process Worker (worker.py) and the
pool of worker processes (workers.py), with what both share: their settings' checks, a job's cheap checks before it
is queued, Retry-After's moving average, the job time estimate (estimate.py) that `max_job_seconds` refuses jobs
by, and the events sink (WorkerEvents) each takes at construction.

A job's checks here are the cheap ones, made on the caller's thread (the HTTP layer's event loop): the model's name,
types and ranges, sizes, scheduler, spacing and preset names, and the seeds its images take. Everything else (an init
image's conversion, a mask's blur, the checks against the model) is the pipeline's, on the worker's thread, in the
one resolution of the request that its call makes (sdaccel.pipeline.request.resolve_request): a bad setting found
there fails the job's future with its UsageError, which the HTTP layer answers 400 as it answers one found here.
A job whose estimate is over `max_job_seconds` is refused here too, with a 400 that says both.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any, Mapping

from ..errors import UsageError
from ..models.schedulers import TIMESTEP_SPACINGS, canonical
from ..pipeline.presets import get_preset
from ..pipeline.prompts import parse
from ..pipeline.request import MAX_SEED, random_seed, validate_request, validate_text, variation
from .estimate import ModelShape, Rate, Rates
from .jobs import SETTINGS, Job, QueueFullError


class WorkerEvents:
    """What a worker reports as it runs (metrics.py implements it); every method is optional."""

    def batch_done(self, model: str, jobs: int, images: int, seconds: float, timings: dict[str, float]) -> None: ...

    def job_dropped(self, reason: str) -> None: ...  # "deadline", "cancelled"

    def job_failed(self, model: str, error: BaseException) -> None: ...

    # The rate (seconds per unit of work: estimate.py) of each model, after the start's calibration (with each model's
    # shape then) and after each timed call: a worker process's front estimates jobs with them.
    def job_rates(self, rates: dict[str, Rate], shapes: dict[str, ModelShape]) -> None: ...

    def worker_restarted(self, worker: int) -> None: ...  # a worker process that exited was started again


def check_settings(models: Mapping[str, str], max_batch: int, max_queue: int, batch_window_ms: float) -> None:
    """A worker's (or worker pool's) settings, refused with a UsageError before anything loads."""
    if not models:
        raise UsageError("no model to serve")
    if max_batch < 1 or max_queue < 1 or batch_window_ms < 0:
        raise UsageError("max_batch and max_queue must be >= 1 and batch_window_ms >= 0")


def output_size(spec, settings: Mapping[str, Any]) -> tuple[int, int]:
    """(height, width) a job's settings ask of a model: theirs, else the model's default."""
    return settings.get("height") or spec.height, settings.get("width") or spec.width


def job_seeds(job: Job) -> list[int]:
    """The seeds of a job's images, as A1111 numbers them: seed, seed + 1, ..., each image's noise its own."""
    return list(range(job.seed, job.seed + job.n))


def job_subseeds(job: Job) -> list[int]:
    """The variation seeds of a job's images, numbered as its seeds are (a random first one when unset)."""
    first = random_seed() if job.subseed is None else job.subseed
    job.subseed = first  # drawn once: a retried call varies as the first did
    return list(range(first, first + job.n))


def check_job(job: Job, models: Mapping[str, Any]) -> None:
    """UsageError for a job no call could run, found without the model or its images: nothing here decodes,
    converts or tokenizes (the pipeline's call resolves the rest)."""
    if job.model not in models:
        raise UsageError(f"unknown model {job.model!r}; served: {', '.join(models)}")
    for name in ("prompt", "negative_prompt"):
        if not isinstance(getattr(job, name), str):
            raise UsageError(f"{name} must be a string, got {type(getattr(job, name)).__name__}")
        validate_text(name, getattr(job, name))  # a lone surrogate fails here, not inside a batch's tokenizer
        parse(getattr(job, name), job.settings.get("prompt_syntax") or "a1111")  # its emphasis reads
    unknown = sorted(set(job.settings) - set(SETTINGS))
    if unknown:
        raise UsageError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    s = job.settings
    steps = s.get("steps")
    validate_request(1 if steps is None else steps, s.get("height"), s.get("width"), job.n, s.get("guidance"),
                     job.seed, s.get("strength"))
    if job.seed + job.n - 1 > MAX_SEED:  # its images take seed .. seed + n - 1
        raise UsageError(f"seed must be from 0 to {MAX_SEED - job.n + 1} for {job.n} images, got {job.seed}")
    variation(job.subseed, s.get("subseed_strength"), job.n)
    if job.subseed is not None and job.subseed + job.n - 1 > MAX_SEED:
        raise UsageError(f"subseed must be from 0 to {MAX_SEED - job.n + 1} for {job.n} images, got {job.subseed}")
    if s.get("scheduler") is not None:
        canonical(s["scheduler"])
    spacing = s.get("timestep_spacing")
    if spacing is not None and spacing not in TIMESTEP_SPACINGS:
        raise UsageError(f"timestep_spacing must be one of {', '.join(TIMESTEP_SPACINGS)}, got {spacing!r}")
    if s.get("preset") is not None:
        get_preset(s["preset"])


def embeddings_listing(pipe) -> dict[str, dict[str, Any]]:
    """A loaded pipeline's textual-inversion embeddings in A1111's shape ({"loaded": {name: {step, sd_checkpoint,
    sd_checkpoint_name, shape, vectors}}, "skipped": {...}: those made for another model}); a base + refiner pair's
    are the base's."""
    loaded = getattr(getattr(pipe, "base", pipe), "components", None)
    loaded = getattr(loaded, "embeddings", None)
    return {"loaded": {}, "skipped": {}} if loaded is None else loaded.describe()


class WorkerBase(ABC):
    """Models behind a bounded queue: what the HTTP app, the metrics and `sdaccel serve` use of a worker.

    `models`: {name: model reference}; `events`: where it reports its calls, drops and failures (a Metrics, or
    the silent WorkerEvents), fixed at construction. `progress.snapshot()`: the call running now ({} when idle);
    `progress.preview()`: its newest live preview (previews.Preview), or None.
    `loaded_embeddings`: {name: embeddings_listing of its pipeline}, filled as the models load. `controlnets` and
    `model_controlnets`: the served ControlNets and those loaded beside each model, in order (controlnets.py);
    `ip_adapters` and `model_ip_adapters` the same of the IP-Adapters (ip_adapters.py).
    `max_job_seconds`: submit refuses a job estimated (`rates`, estimate.py) to run longer (0: no limit; a model
    not timed yet is not estimated)."""

    progress: Any
    max_job_seconds: float = 0.0

    def __init__(self, models: Mapping[str, str], *, max_batch: int, batch_window_ms: float, max_queue: int,
                 events: WorkerEvents | None):
        check_settings(models, max_batch, max_queue, batch_window_ms)
        self.models = dict(models)
        self.max_batch, self.window_s, self.max_queue = max_batch, batch_window_ms / 1000, max_queue
        self.events = events if events is not None else WorkerEvents()
        self._failed: BaseException | None = None
        self._settled = threading.Event()  # loaded and warmed, or failed
        self._seconds_per_image = 1.0  # recent time per image, for Retry-After
        self.rates = Rates()  # each model's seconds per unit of work, for the job time estimate
        self.loaded_embeddings: dict[str, dict[str, dict[str, Any]]] = {}
        self.controlnets: dict[str, str] = {}  # {name: reference} served (--controlnet)
        self.model_controlnets: dict[str, list[str]] = {name: [] for name in self.models}  # loaded beside each model
        self.ip_adapters: dict[str, str] = {}  # {name: reference} served (--ip-adapter)
        self.model_ip_adapters: dict[str, list[str]] = {name: [] for name in self.models}

    # ------------------------------------------------------------------------------------------- lifecycle

    @abstractmethod
    def start(self) -> None:
        """Load and warm the models in the background; ready() says when that is done."""

    @abstractmethod
    def ready(self) -> bool:
        """The models are loaded and warm, and jobs are taken."""

    @abstractmethod
    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Refuse new jobs; with `drain` finish the queued ones first, else fail them."""

    @abstractmethod
    def begin_shutdown(self) -> None:
        """Refuse new jobs from now on (submit raises RuntimeError "the server is shutting down"); queued and
        running jobs go on."""

    @abstractmethod
    def abort(self, reason: str = "the server is shutting down") -> None:
        """Refuse new jobs, fail every queued job with CancelledJobError(reason) and stop the running call at its
        next denoising step, its jobs failed with CancelledJobError(reason) (no partial images). Idempotent; any
        thread."""

    @property
    def failure(self) -> BaseException | None:
        """Why loading or warming failed (the worker then refuses every job)."""
        return self._failed

    def unhealthy_reason(self) -> str | None:
        """Why no job can be served now, loading aside: loading failed (a pool: also every worker process down, while
        they restart; in process: the worker's thread died). None while it serves or will once loaded: /health."""
        if self._failed is not None:
            return f"the worker failed to start: {self._failed}"
        return None

    def not_ready_reason(self) -> str | None:
        """Why ready() is false, in words (None when ready): /ready's 503."""
        why = self.unhealthy_reason()
        if why is None and not self.ready():
            why = "loading and warming the models"
        return why

    def worker_states(self) -> dict[str, str]:
        """Each worker's state by index: "ready", "loading", "restarting" (a pool's process that exited) or
        "failed": the probes' detail and the metrics' live and ready counts."""
        state = "failed" if self.unhealthy_reason() else "ready" if self.ready() else "loading"
        return {"0": state}

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until loading settled: True when ready, False on timeout; the failure is raised."""
        self._settled.wait(timeout)
        if self._failed is not None:
            raise self._failed
        return self.ready()

    # ----------------------------------------------------------------------------------------------- jobs

    @abstractmethod
    def queue_depth(self) -> int:
        """Jobs waiting, beyond the running call."""

    @abstractmethod
    def busy(self) -> bool:
        """A pipeline call is running."""

    @abstractmethod
    def interrupt(self, skip: bool = False) -> bool:
        """Stop the running call at its next step boundary, its images decoded from the latents reached (A1111's
        /interrupt, or with `skip` its /skip: progress.py); queued jobs run as usual. False when none runs."""

    def memory(self) -> dict[str, dict[str, Any]] | None:
        """Worker processes' memory figures by index ({device, rss_bytes, gpu_allocated_bytes}); None: the worker
        runs in this process, whose memory the metrics read themselves."""
        return None

    def submit(self, job: Job) -> Future:
        """Queue `job` after its cheap checks; returns its Future (a JobResult, or the job's error, such as the
        UsageError of a setting the pipeline refuses). Raises UsageError for an unknown model or settings no call
        could run or estimated to run longer than max_job_seconds, QueueFullError when the queue is full, and
        RuntimeError when the worker is stopping or failed."""
        check_job(job, self.models)
        if self._failed is not None:
            raise RuntimeError(f"the worker failed to start: {self._failed}")
        self._check_time(job)
        return self._enqueue(job)

    def estimate_seconds(self, job: Job) -> float | None:
        """How long the job would run here (estimate.py); None while its model's rate is unknown."""
        try:
            return self.rates.seconds(job.model, job.settings, job.n)
        except Exception:  # noqa: BLE001 - settings the estimate cannot read: the pipeline's call refuses them
            return None

    def _check_time(self, job: Job) -> None:
        if not self.max_job_seconds:
            return
        seconds = self.estimate_seconds(job)
        if seconds is not None and seconds > self.max_job_seconds:
            raise UsageError(f"this request would take about {seconds:.0f} s on this server (estimate); the limit "
                             f"is {self.max_job_seconds:g} s (--max-job-seconds)")

    @abstractmethod
    def _enqueue(self, job: Job) -> Future:
        """Queue a checked job (QueueFullError, RuntimeError as submit says)."""

    def _queue_full(self, waiting_images: int, lanes: int = 1) -> QueueFullError:
        """The refusal of a full queue, its Retry-After from the recent time per image over `lanes` workers."""
        return QueueFullError(max(1.0, waiting_images * self._seconds_per_image / (self.max_batch * lanes)))

    def _call_done(self, seconds: float, images: int) -> None:
        """Record a call of `images` in `seconds` in the recent time per image (a moving average)."""
        self._seconds_per_image = 0.8 * self._seconds_per_image + 0.2 * seconds / max(1, images)
