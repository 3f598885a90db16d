"""The call a worker runs now, for A1111's /sdapi/v1/progress, /interrupt and /skip: its jobs and step, the stop a
client asked for, and its live preview (previews.py). The worker's thread writes it through the pipeline's step
callback (Progress.step); HTTP handlers read it from other threads.

Interrupt and skip: A1111's Interrupt ends its current job (the remaining n_iter batches too) and answers the images
decoded from the latents reached; its Skip ends the current batch and goes on with the next. sdaccel's unit of work is
the worker's call, the jobs it batched together, so both end the running call at its next step boundary (the
pipeline's stopping.STOP): its images are decoded from the latents reached and returned with their params
(interrupted_at_step), and the jobs still queued run as usual. The state names which one was asked.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from ..pipeline.stopping import STOP
from .previews import PREVIEW_EVERY, LatentPreviews, Preview


class Progress:
    """The running call: {call (its number), jobs, images, step, steps, started, interrupted, skipped}, {} when
    idle. `preview_every`: steps between live previews of image 0 (0: none)."""

    def __init__(self, preview_every: int = PREVIEW_EVERY) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {}
        self._calls = itertools.count(1)
        self.previews = LatentPreviews(preview_every)

    def start(self, jobs: list, steps: int, spec=None) -> None:
        """A call of `jobs` starts, `steps` long, on a model of `spec` (its family picks the preview's factors)."""
        self.previews.start(spec)
        with self._lock:
            self._state = dict(call=next(self._calls), jobs=len(jobs), images=sum(j.n for j in jobs), step=0,
                               steps=steps, started=time.monotonic(), interrupted=False, skipped=False)

    def step(self, index: int, timestep: float | None = None, latents=None):
        """The pipeline's step callback (after step `index`): counts the step, captures a preview every few steps,
        and returns STOP once a client asked the call to stop."""
        self.previews.step(index, latents)
        with self._lock:
            if not self._state:
                return None
            self._state["step"] = index + 1
            stop = self._state["interrupted"] or self._state["skipped"]
        return STOP if stop else None

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
            self._state = {}
        self.previews.finish()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def preview(self) -> Preview | None:
        """The running call's newest live preview (None: none yet, or idle)."""
        return self.previews.latest()
