"""What a server request asks the worker for (Job), what it gets back (JobResult), and which jobs may share one
pipeline call (batch_key).

Jobs of the same model, LoRA set, size, steps, scheduler and guidance run as one batched call, each with its own
prompt, negative prompt, seed and image count: its images take seeds seed, seed + 1, ... (A1111's numbering), the call
drawing each image's initial noise from its own seed exactly as a call of its own would draw it, so a batched job
gets the images it would get alone. Schedulers that draw fresh noise at every step
(euler_a, LCM, TCD...) draw it from one generator per call; their jobs run alone, as do jobs with an init image,
mask or control image. Image prompts (IP-Adapter) are one per adapter for the whole call: a job's ip_adapter_image
is keyed by a digest of its pixels (ip_adapters.PromptImages), so only jobs with the same image prompts and scales
share a call.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

# Pipeline.generate keywords a job may set, besides prompt, negative_prompt, seed and n (batch_size).
SETTINGS = ("steps", "guidance", "height", "width", "scheduler", "timestep_spacing", "prediction_type", "preset",
            "image", "mask", "mask_blur", "strength", "keep_unmasked", "control_image", "controlnet_scale",
            "control_start", "control_end", "prompt_syntax", "clip_skip", "subseed_strength",
            # hires fix (pipeline/hires.py): in the batch key like every setting, so only jobs with the same hires
            # settings share a call
            "hires_scale", "hires_size", "hires_upscaler", "hires_steps", "hires_strength", "hires_prompt",
            "hires_negative_prompt", "hires_scheduler",
            # image prompts (ip_adapters.py): one per loaded IP-Adapter, the same for every image of the call
            "ip_adapter_image", "ip_adapter_scale")
# Settings that never let a job share a call with others (they are per-request inputs).
ALONE = ("image", "mask", "control_image")


class QueueFullError(Exception):
    """The worker's queue holds its limit of jobs: answer 429 with Retry-After."""

    def __init__(self, retry_after_s: float):
        super().__init__(f"the server is busy: retry in {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s

    def __reduce__(self):  # pickled as its own argument (it crosses to the server from a worker process)
        return (QueueFullError, (self.retry_after_s,))


class DeadlineExceededError(Exception):
    """The request's deadline (`sdaccel serve --timeout`) passed while its jobs waited or ran: answer 503."""


class CancelledJobError(Exception):
    """The job was cancelled before it ran or stopped while it ran (its client went away, its deadline passed, or
    the server aborted its jobs): no images."""


class NoWorkerError(RuntimeError):
    """No worker process can take the job: every one has exited and is being restarted, or the one that held the
    job exited before it answered. Answered 503 with Retry-After: the same request may succeed later."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self):
        return (NoWorkerError, (str(self), self.retry_after_s))


@dataclass
class Job:
    """One request: `n` images of one prompt on one model."""

    model: str
    prompt: str
    negative_prompt: str = ""
    n: int = 1
    seed: int = 0  # the first image's; image i takes seed + i
    subseed: int | None = None  # with settings' subseed_strength: the first image's variation seed, image i's + i
    settings: dict[str, Any] = field(default_factory=dict)  # Pipeline.generate keywords (SETTINGS)
    loras: tuple[tuple[str, float], ...] = ()  # LoRA files merged for its call: (path, weight), sorted (loras.py)
    deadline: float | None = None  # time.monotonic() after which it must not start, nor go on running
    submitted: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)  # set by the worker: a JobResult or an exception
    cancelled: threading.Event = field(default_factory=threading.Event)
    on_cancel: Callable[[], None] | None = None  # called by cancel(): a worker process pool tells the job's process

    def cancel(self) -> None:
        """Nobody wants the job any more: not started yet, it is dropped; running, its call stops at its next step
        once no job of the call is wanted (it fails with CancelledJobError), else the call runs on for the others."""
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel()


@dataclass
class JobResult:
    images: list  # PIL images, `n` of them
    params: list[dict[str, Any]]  # per image: its settings (its own prompt and seed), as PNGs record them
    timings: dict[str, float]  # the batched call's stage times, seconds
    batch_images: int  # how many images the call that made these computed
    queued_s: float  # from submission to the start of the call
    worker: int | None = None  # the worker process that made it (ProcessWorkers' index); None in process


def batch_key(job: Job, stochastic_scheduler: bool) -> tuple | None:
    """The key jobs must share to run in one call; None when the job must run alone."""
    if stochastic_scheduler or any(job.settings.get(name) is not None for name in ALONE):
        return None
    settings = {k: v for k, v in job.settings.items() if v is not None}
    return (job.model, job.loras, tuple(sorted((k, repr(v)) for k, v in settings.items())))
