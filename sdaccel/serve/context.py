"""What every route of `sdaccel serve` shares: the served worker and settings (Served, on app.state.served), and the
steps each generation handler takes: the model's name, the server's limits, the seed, and awaiting its jobs while
watching its client."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from fastapi import Request

from ..pipeline.request import MAX_SEED
from .jobs import DeadlineExceededError, Job, JobResult
from .loras import LoraFolder
from .middleware import ApiError, ClientGone
from .schemas import Limits
from .worker_api import WorkerBase

POLL_S = 0.2  # how often a waiting handler checks that its client is still there (and its deadline)


@dataclass
class Served:
    """The app's worker and settings, read by every route."""

    worker: WorkerBase
    limits: Limits
    request_timeout_s: float  # a request's whole time, waiting and running (--timeout)
    checkpoint: str  # A1111's sd_model_checkpoint: txt2img's default model (set by POST /sdapi/v1/options)
    loras: LoraFolder | None = None  # the LoRA files requests may name (--loras DIR)
    clip_skip: int = 0  # A1111's CLIP_stop_at_last_layers less one (POST /sdapi/v1/options): its requests' default

    def model_name(self, name: str | None) -> str:
        """A request's model: a served one's name (404 otherwise), or the first served one."""
        if name is None or name == "":
            return next(iter(self.worker.models))
        if name not in self.worker.models:
            raise ApiError(404, f"unknown model {name!r}; served: {', '.join(self.worker.models)}", "not_found_error")
        return name

    async def run(self, request: Request, jobs: list[Job]) -> list[JobResult]:
        """The jobs' results, each job given the request's deadline (request_timeout_s from now, for waiting and
        running both); the jobs' errors raised, DeadlineExceededError at the deadline."""
        deadline = time.monotonic() + self.request_timeout_s
        for job in jobs:
            job.deadline = deadline
        results = await await_jobs(request, self.worker, jobs, deadline, self.request_timeout_s)
        request.state.images = sum(len(r.images) for r in results)  # for the request's log line
        return results


def served(request: Request) -> Served:
    return request.app.state.served


async def await_jobs(request: Request, worker: WorkerBase, jobs: list[Job], deadline: float | None = None,
                     timeout_s: float | None = None) -> list[JobResult]:
    """Submit `jobs` and wait for all of them, cancelling them all when one fails, the client goes away or the
    `deadline` (time.monotonic(); `timeout_s` after the request came, which the error names) passes: then
    DeadlineExceededError at once, whether they wait or run (a running call stops at its next step). The asyncio
    wrappers are never cancelled: that would cancel the worker's futures under it."""
    futures = []
    try:
        for job in jobs:
            futures.append(asyncio.wrap_future(worker.submit(job)))
            # A dropped job's error is read here, not reported as "never retrieved" (also when a later job's
            # submit fails and this one is cancelled unread).
            futures[-1].add_done_callback(lambda f: f.cancelled() or f.exception())
    except BaseException:
        for job in jobs:
            job.cancel()
        raise
    pending = set(futures)
    while pending:
        wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
        done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            for job in jobs:
                job.cancel()
            raise failed[0].exception()
        if pending and deadline is not None and time.monotonic() >= deadline:
            for job in jobs:
                job.cancel()
            limit = f" of {timeout_s:g} s (--timeout)" if timeout_s is not None else ""
            raise DeadlineExceededError(f"the request's deadline{limit} passed before its images were done")
        if pending and await request.is_disconnected():
            for job in jobs:
                job.cancel()
            raise ClientGone()
    return [f.result() for f in futures]


def check_limits(limits: Limits, prompt: str, negative: str, n: int, steps: int | None, width: int | None,
                 height: int | None) -> None:
    """The request against the server's limits, before anything is queued (the worker's submit checks the rest:
    ranges, names, seeds)."""
    for name, text in (("prompt", prompt), ("negative_prompt", negative)):
        if len(text) > limits.max_prompt_chars:
            raise ApiError(400, f"{name} is {len(text)} characters; the limit is {limits.max_prompt_chars}")
    limits.generation().check(steps, height, width, n, images_name="n")  # UsageError: a 400 naming the flag


def request_seed(seed: int | None) -> int:
    """The request's seed, or a random one (as OpenAI's API and A1111's -1 draw one per request)."""
    if seed is None:
        return random.SystemRandom().randrange(2**32)
    if not 0 <= seed <= MAX_SEED:
        raise ApiError(400, f"seed must be from 0 to {MAX_SEED}, got {seed}")
    return seed
