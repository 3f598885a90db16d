"""`sdaccel serve` as a process facing jobs that would run too long: --timeout is each request's whole time, answered
503 at the deadline whether its job waits or runs (the running call stops between steps and the server serves on),
and a job whose estimate is over --max-job-seconds (OpenAI's 1024x1024 on a CPU server) is a 400 at once; in the
server's own process and with worker processes (--cpu-workers 2), whose front cancels and estimates across the
pipe."""

from __future__ import annotations

import re
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from serve_helpers import serve_process, wait_for  # noqa: E402

from sdaccel.errors import UsageError  # noqa: E402
from sdaccel.serve.jobs import CancelledJobError, Job  # noqa: E402
from sdaccel.serve.workers import ProcessWorkers  # noqa: E402

MODEL = "synthetic:sd15-tiny"
TIMEOUT_S = 3.0
LONG = {"prompt": "a long one", "steps": 100, "width": 128, "height": 128, "scheduler": "ddim"}  # a minute or more


def _idle(url: str) -> bool:
    state = httpx.get(f"{url}/sdapi/v1/progress", timeout=10).json()["state"]
    return state["job_count"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [None, 2], ids=["in-process", "cpu-workers-2"])
def test_deadlines_hold_while_waiting_and_running_and_long_jobs_are_refused(tmp_path, workers):
    extra = [] if workers is None else ["--cpu-workers", str(workers)]
    with serve_process(tmp_path, "--model", MODEL, "--engine", "eager", "--timeout", str(TIMEOUT_S),
                       *([] if workers else ["--device", "cpu"]), *extra) as served:
        url = served.url
        # OpenAI's 1024x1024 on this CPU would run for hours: refused at once, by the default --max-job-seconds.
        started = time.monotonic()
        r = httpx.post(f"{url}/v1/images/generations", json={"prompt": "big", "size": "1024x1024", "steps": 50},
                       timeout=60)
        assert r.status_code == 400 and time.monotonic() - started < 5, r.text
        assert re.fullmatch(r"this request would take about \d+ s on this server \(estimate\); the limit is 300 s "
                            r"\(--max-job-seconds\)", r.json()["error"]["message"]), r.text

        answers: dict[str, tuple[httpx.Response, float]] = {}

        def post(name: str, seed: int) -> None:
            began = time.monotonic()
            response = httpx.post(f"{url}/v1/generate", json=dict(LONG, seed=seed), timeout=120)
            answers[name] = (response, time.monotonic() - began)

        running = [threading.Thread(target=post, args=(f"running-{i}", i)) for i in range(workers or 1)]
        for thread in running:
            thread.start()
        # Taken by the worker (encoding or stepping): on a loaded machine its first step may come only near its own
        # deadline, and once it is stopped the step count is back to 0, so waiting for a step would race that; on a
        # loaded machine the job may even be taken and stopped between two polls, so its answer counts too.
        wait_for(lambda: bool(answers) or not _idle(url), "a long job to be taken", timeout=30)
        time.sleep(0.5)  # the other worker process's too
        queued = [threading.Thread(target=post, args=(f"queued-{i}", 10 + i)) for i in range(2)]
        for thread in queued:
            thread.start()
        for thread in running + queued:
            thread.join(60)
        answered = time.monotonic()
        assert len(answers) == len(running) + 2
        for name, (response, seconds) in answers.items():
            assert response.status_code == 503, (name, response.text)
            assert response.json()["error"]["type"] == "timeout_error", (name, response.text)
            assert seconds < TIMEOUT_S + 1.5, (name, seconds)  # at its deadline, not when the long calls end
        # The long calls stopped between steps at their deadlines: the server is idle long before 100 steps.
        wait_for(lambda: _idle(url), "the stopped calls to end", timeout=15)
        assert time.monotonic() - answered < 15
        r = httpx.post(f"{url}/v1/generate", json={"prompt": "after", "steps": 2, "width": 32, "height": 32},
                       timeout=60)
        assert r.status_code == 200 and len(r.json()["images"]) == 1, r.text  # serving on
        ok = httpx.post(f"{url}/v1/images/generations", json={"prompt": "default size", "steps": 50}, timeout=60)
        # The model's default size at 50 steps is taken (a few seconds here: it may run past the 3 s deadline).
        assert ok.status_code == 200 or ok.json()["error"]["type"] == "timeout_error", ok.text


@pytest.mark.slow
def test_abort_reaches_the_worker_processes_and_their_estimates_reach_the_front():
    pool = ProcessWorkers({"tiny": MODEL}, engine="eager", devices=["cpu"], max_batch=1, batch_window_ms=0)
    pool.start()
    try:
        assert pool.wait_ready(300)
        assert pool.rates.shapes["tiny"].height == 64 and pool.rates.snapshot()["tiny"].per_work > 0
        pool.max_job_seconds = 60
        big = Job("tiny", "big", settings=dict(steps=50, height=1024, width=1024))
        with pytest.raises(UsageError, match=r"the limit is 60 s \(--max-job-seconds\)"):
            pool.submit(big)
        pool.max_job_seconds = 0  # no limit: the long job below runs
        long = pool.submit(Job("tiny", "long", settings=dict(steps=100, height=128, width=128, scheduler="ddim")))
        wait_for(lambda: pool.progress.snapshot().get("step", 0) > 0, "the long job to run", timeout=60)
        queued = pool.submit(Job("tiny", "queued", settings=dict(steps=2, height=32, width=32)))
        started = time.monotonic()
        pool.abort("going away")
        for future in (long, queued):
            with pytest.raises(CancelledJobError, match="going away"):
                future.result(30)
        assert time.monotonic() - started < 10  # the long call stopped between steps, not after 100 of them
        with pytest.raises(RuntimeError, match="shutting down"):
            pool.submit(Job("tiny", "later"))
    finally:
        pool.stop(drain=False, timeout=60)
