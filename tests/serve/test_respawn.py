"""Worker processes that come back after they die, and probes that say so: ProcessWorkers of the tiny synthetic SD1.5
on the CPU (spawned processes), killed with SIGKILL; the in-process Worker's /health and /ready from fakes. One pool
of two processes serves the first tests (each kills some of its processes and waits until they are back)."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from serve_helpers import wait_for  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from sdaccel.serve import workers as workers_module  # noqa: E402
from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.jobs import Job, NoWorkerError  # noqa: E402
from sdaccel.serve.metrics import Metrics  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402
from sdaccel.serve.workers import ProcessWorkers  # noqa: E402

MODEL = "synthetic:sd15-tiny"
BODY = {"prompt": "a red cube", "steps": 2, "width": 32, "height": 32, "scheduler": "ddim", "seed": 3}


@pytest.fixture(scope="module")
def served():
    metrics = Metrics()
    pool = ProcessWorkers({"tiny": MODEL}, engine="eager", devices=["cpu", "cpu"], max_batch=4, batch_window_ms=50,
                          max_queue=8, events=metrics)
    pool.start()
    app = create_app(pool, stop_worker_on_shutdown=False, metrics=metrics)
    assert pool.wait_ready(300)
    yield SimpleNamespace(pool=pool, client=TestClient(app), metrics=metrics)
    pool.stop(drain=False, timeout=60)


def job(seed=0, steps=2, size=32):
    return Job("tiny", f"a cat {seed}", seed=seed, settings=dict(steps=steps, scheduler="ddim", height=size,
                                                                 width=size))


def restarts(metrics: Metrics, worker: str) -> float:
    metrics.render()
    return metrics.registry.get_sample_value("sdaccel_worker_restarts_total", {"worker": worker})


def sample(metrics: Metrics, name: str) -> float:
    metrics.render()
    return metrics.registry.get_sample_value(name)


def kill(pool: ProcessWorkers, index: int) -> int:
    pid = pool._children[index].process.pid
    os.kill(pid, signal.SIGKILL)
    return pid


def serves_on(pool: ProcessWorkers, index: int) -> None:
    """Jobs until one is answered by worker process `index` (jobs go to the process with the fewest images)."""
    for attempt in range(10):
        results = [f.result(120) for f in [pool.submit(job(seed=10 * attempt + i)) for i in range(4)]]
        if any(r.worker == index for r in results):
            return
    raise AssertionError(f"worker process {index} answered no job")


# ------------------------------------------------------------------------------------------- the pool


@pytest.mark.slow
def test_a_killed_process_fails_its_job_with_503_and_comes_back(served):
    pool, client, metrics = served.pool, served.client, served.metrics
    before = {i: restarts(metrics, i) for i in ("0", "1")}  # each shown, at 0 before its first restart
    assert None not in before.values()
    slow = pool.submit(job(seed=1, steps=300, size=64))
    index = next(c.index for c in pool._children if c.jobs)
    wait_for(lambda: pool._children[index].progress, "the slow job to start")
    old = kill(pool, index)
    with pytest.raises(NoWorkerError, match=rf"worker process {index} exited \(code -9\) before it answered: retry"):
        slow.result(60)
    assert pool.ready()  # the other process serves meanwhile
    assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200
    assert pool.worker_states()[str(index)] in ("restarting", "loading")
    wait_for(lambda: pool.worker_states()[str(index)] == "ready", "the killed process to be back", timeout=120)
    assert pool._children[index].process.pid != old and pool._children[index].generation == 1
    serves_on(pool, index)
    assert restarts(metrics, str(index)) == before[str(index)] + 1
    assert restarts(metrics, str(1 - index)) == before[str(1 - index)]
    assert sample(metrics, "sdaccel_workers_live") == 2 and sample(metrics, "sdaccel_workers_ready") == 2


@pytest.mark.slow
def test_with_every_process_dead_requests_are_503_then_served_again(served, monkeypatch, caplog):
    pool, client, metrics = served.pool, served.client, served.metrics
    monkeypatch.setattr(workers_module, "RESPAWN_FIRST_S", 5.0)  # an outage long enough to probe
    monkeypatch.setattr(workers_module, "STABLE_S", 1e9)  # no process served long enough to reset its backoff
    caplog.set_level(logging.ERROR, "sdaccel.serve")
    pool._children[0].exits, pool._children[1].exits = 0, 1  # the second exited once before: its wait doubles
    before = {i: restarts(metrics, i) for i in ("0", "1")}
    for index in (0, 1):
        kill(pool, index)
    wait_for(lambda: set(pool.worker_states().values()) == {"restarting"}, "both processes to be seen dead")
    with pytest.raises(NoWorkerError, match="no worker process is running") as refused:
        pool.submit(job())
    assert refused.value.retry_after_s >= 1
    response = client.post("/v1/generate", json=BODY)
    assert response.status_code == 503 and response.json()["error"]["type"] == "server_unavailable"
    assert int(response.headers["Retry-After"]) >= 1
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    assert "no worker process is running" in health.json()["error"]["message"]
    ready = client.get("/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
    why = ready.json()["error"]["message"]
    assert re.search(r"worker process 0: restarting after it exited \(code -9\), next try in \d+ s", why), why
    assert "worker process 1: restarting after it exited (code -9)" in why
    assert sample(metrics, "sdaccel_workers_live") == 0
    waits = {int(m.group(1)): float(m.group(2)) for m in (
        re.search(r"worker process (\d) .*exited \(code -9\).* starting it again in ([\d.]+) s", r.getMessage())
        for r in caplog.records) if m}
    assert waits == {0: 5.0, 1: 10.0}, waits
    wait_for(lambda: pool.ready(), "a process to be back", timeout=120)
    assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200
    response = client.post("/v1/generate", json=BODY)
    assert response.status_code == 200 and len(response.json()["images"]) == 1
    wait_for(lambda: set(pool.worker_states().values()) == {"ready"}, "both processes to be back", timeout=120)
    assert all(restarts(metrics, i) == before[i] + 1 for i in ("0", "1"))


@pytest.mark.slow
def test_a_process_that_served_long_enough_restarts_after_the_first_wait_again(served, monkeypatch, caplog):
    pool = served.pool
    monkeypatch.setattr(workers_module, "STABLE_S", 0.0)  # every ready process counts as having served a while
    caplog.set_level(logging.ERROR, "sdaccel.serve")
    index = 0
    pool._children[index].exits = 3  # three exits in a row before: 8 s, had it not served long enough
    kill(pool, index)
    wait_for(lambda: any("starting it again" in r.getMessage() for r in caplog.records), "the exit to be seen")
    assert any(f"worker process {index} " in r.getMessage() and "starting it again in 1 s" in r.getMessage()
               for r in caplog.records)
    wait_for(lambda: pool.worker_states()[str(index)] == "ready", "the process to be back", timeout=120)


# ------------------------------------------------------------------------------- a restart that fails to load


@pytest.mark.slow
def test_a_restarted_process_that_fails_to_load_backs_off_and_says_why(monkeypatch, caplog):
    monkeypatch.setattr(workers_module, "RESPAWN_MAX_S", 2.0)
    caplog.set_level(logging.ERROR, "sdaccel.serve")
    pool = ProcessWorkers({"tiny": MODEL}, engine="eager", devices=["cpu"])
    pool.start()
    try:
        assert pool.wait_ready(300)
        pool._config["models"] = {"tiny": "synthetic:no-such-arch"}  # what every later process loads
        kill(pool, 0)

        def waits() -> list[str]:
            return re.findall(r"starting it again in ([\d.]+) s", "\n".join(r.getMessage() for r in caplog.records))

        wait_for(lambda: len(waits()) >= 3, "two failed restarts", timeout=180)
        assert waits()[:3] == ["1", "2", "2"]  # doubled, then capped at RESPAWN_MAX_S
        monkeypatch.setattr(workers_module, "RESPAWN_MAX_S", 30.0)  # the next wait is long enough to probe
        wait_for(lambda: len(waits()) >= 4, "a third failed restart", timeout=180)
        assert waits()[3] == "8"
        assert sum("failed to load after its restart" in r.getMessage() for r in caplog.records) == 3
        assert pool.worker_states()["0"] == "restarting"
        assert "worker process 0: restarting after it failed to load (" in pool.not_ready_reason()
        assert pool.failure is None  # not the pool's failure: it keeps trying
        with pytest.raises(NoWorkerError):
            pool.submit(job())
    finally:
        pool.stop(drain=False, timeout=60)
    assert not pool._children[0].process.is_alive() and not pool._timers


def test_a_process_that_fails_at_the_first_start_fails_the_pool():
    pool = ProcessWorkers({"tiny": "synthetic:no-such-arch"}, engine="eager", devices=["cpu"])
    pool.start()
    try:
        with pytest.raises(Exception, match="no-such-arch"):
            pool.wait_ready(300)
        assert "no-such-arch" in pool.unhealthy_reason() and pool.worker_states() == {"0": "failed"}
        kill(pool, 0)  # and once it exits, it is not started again: the server reports the failure
        wait_for(lambda: pool._children[0].gone, "the exit to be seen")
        time.sleep(workers_module.RESPAWN_FIRST_S + 1)
        assert pool._children[0].generation == 0 and pool.worker_states() == {"0": "failed"}
    finally:
        pool.stop(drain=False, timeout=60)


# --------------------------------------------------------------------------------------- the in-process worker


class _Pipe:
    """Enough of a pipeline for a Worker to load."""


def _worker_app(loader) -> tuple[Worker, TestClient]:
    worker = Worker({"tiny": MODEL}, loader=loader)
    worker.start()
    return worker, TestClient(create_app(worker, stop_worker_on_shutdown=False))


def test_an_in_process_worker_whose_loading_failed_is_unhealthy():
    def fail(ref, **kwargs):
        raise OSError("no such file: weights.safetensors")

    worker, client = _worker_app(fail)
    with pytest.raises(OSError):
        worker.wait_ready(30)
    health, ready = client.get("/health"), client.get("/ready")
    assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    assert "weights.safetensors" in health.json()["error"]["message"]
    assert ready.status_code == 503 and "failed to start" in ready.json()["error"]["message"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the fault it injects
def test_an_in_process_worker_whose_thread_died_is_unhealthy(monkeypatch):
    gate = threading.Event()

    def loader(ref, **kwargs):
        gate.wait(30)
        return _Pipe()

    worker, client = _worker_app(loader)
    assert client.get("/health").status_code == 200  # loading is healthy
    assert client.get("/ready").status_code == 503
    monkeypatch.setattr(worker, "_next_batch", lambda: 1 / 0)  # a bug in the worker's loop kills its thread
    gate.set()
    wait_for(lambda: not worker._thread.is_alive(), "the worker's thread to die")
    health, ready = client.get("/health"), client.get("/ready")
    assert health.status_code == 503 and "the worker's thread exited" in health.json()["error"]["message"]
    assert ready.status_code == 503 and "the worker's thread exited" in ready.json()["error"]["message"]
    assert worker.worker_states() == {"0": "failed"}
