"""The call a worker runs now, for A1111's /sdapi/v1/progress, /interrupt and /skip: its jobs and step, the stop a
client asked for, and its live preview (previews.py). The worker's thread writes it through the pipeline's step
callback (Progress.step); HTTP handlers read it from other threads.

Interrupt and skip: A1111's Interrupt ends its current job (the remaining n_iter batches too) and answers the images
decoded from the latents reached; its Skip ends the current batch and goes on with the next. sdaccel's unit of work is
the worker's call, the jobs it batched together, so both end the running call at its next step boundary (the
pipeline's stopping.STOP): its images are decoded from the latents reached and returned with their params
(interrupted_at_step), and the jobs still queued run as usual. The state names which one was asked.

Cancellation is not an interrupt: when every job of the running call is no longer wanted (Job.cancel(): its client
went away, or its request's deadline passed) or the worker aborts (abort(), the server shutting down), the call stops
at its next step boundary too, but its jobs fail with CancelledJobError: no partial image is answered. The state's
"cancelled" says why; a job cancelled while others of its call are still wanted leaves the call running.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from ..pipeline.stopping import STOP
from .previews import PREVIEW_EVERY, LatentPreviews, Preview


class Progress:
    """The running call: {call (its number), jobs, images, step, steps, started, interrupted, skipped, and once it
    is stopped for cancellation cancelled: why}, {} when idle. `preview_every`: steps between live previews of image
    0 (0: none)."""

    def __init__(self, preview_every: int = PREVIEW_EVERY) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {}
        self._jobs: list = []
        self._aborted: str | None = None  # abort()'s reason: every call from then on stops at its first step
        self._calls = itertools.count(1)
        self.previews = LatentPreviews(preview_every)

    def start(self, jobs: list, steps: int, spec=None) -> None:
        """A call of `jobs` starts, `steps` long, on a model of `spec` (its family picks the preview's factors)."""
        self.previews.start(spec)
        with self._lock:
            self._jobs = list(jobs)
            self._state = dict(call=next(self._calls), jobs=len(jobs), images=sum(j.n for j in jobs), step=0,
                               steps=steps, started=time.monotonic(), interrupted=False, skipped=False)

    def step(self, index: int, timestep: float | None = None, latents=None):
        """The pipeline's step callback (after step `index`): counts the step, captures a preview every few steps,
        and returns STOP once a client asked the call to stop or none of its jobs is wanted any more."""
        self.previews.step(index, latents)
        with self._lock:
            if not self._state:
                return None
            self._state["step"] = index + 1
            if "cancelled" not in self._state:
                why = self._aborted or unwanted(self._jobs)
                if why is not None:
                    self._state["cancelled"] = why
            stop = self._state["interrupted"] or self._state["skipped"] or "cancelled" in self._state
        return STOP if stop else None

    def cancelled(self) -> str | None:
        """Why the running call was stopped for cancellation (its jobs then fail); None: it was not."""
        with self._lock:
            return self._state.get("cancelled")

    def abort(self, reason: str) -> None:
        """Stop the running call at its next step boundary, and every later one at its first, for `reason`."""
        with self._lock:
            self._aborted = self._aborted or reason

    def aborted(self) -> str | None:
        """abort()'s reason, once it was called."""
        with self._lock:
            return self._aborted

    def request_stop(self, skip: bool = False, call: int | None = None) -> bool:
        """Ask the running call (the call numbered `call`, if given) to stop at its next step boundary: A1111's
        interrupt, or its skip. False when no such call runs."""
        with self._lock:
            if not self._state or (call is not None and self._state["call"] != call):
                return False
            self._state["skipped" if skip else "interrupted"] = True
        return True

    def finish(self) -> None:
        with self._lock:
            self._state, self._jobs = {}, []
        self.previews.finish()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def preview(self) -> Preview | None:
        """The running call's newest live preview (None: none yet, or idle)."""
        return self.previews.latest()


def why_unwanted(job) -> str | None:
    """Why `job` is no longer wanted (cancelled, or past its request's deadline); None while it is."""
    if job.cancelled.is_set():
        return "cancelled while it ran"
    if job.deadline is not None and time.monotonic() > job.deadline:
        return "the request's deadline passed while it ran"
    return None


def unwanted(jobs: list) -> str | None:
    """Why no job of `jobs` is wanted any more; None while one is."""
    reasons = [why_unwanted(job) for job in jobs]
    if not reasons or None in reasons:
        return None
    return reasons[0] if len(set(reasons)) == 1 else "no job of the call is wanted any more"
