"""Worker processes (ProcessWorkers, `sdaccel serve --gpus`) on the CPU: two spawned processes of the tiny synthetic
SD1.5 on the eager engine. One pool serves the whole module (starting it costs most of the time); its last tests
kill one of its processes and then stop it, so they run last, in file order."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from serve_helpers import serve_process, wait_for  # noqa: E402

from sdaccel.cli import main as cli  # noqa: E402
from sdaccel.cli.serve import worker_devices  # noqa: E402
from sdaccel.errors import UsageError  # noqa: E402
from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.jobs import CancelledJobError, Job, QueueFullError  # noqa: E402
from sdaccel.serve.loadtest import memory_from_metrics  # noqa: E402
from sdaccel.serve.metrics import Metrics  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402
from sdaccel.serve.worker_api import WorkerBase  # noqa: E402
from sdaccel.serve.workers import ProcessWorkers, child_device  # noqa: E402

MODEL = "synthetic:sd15-tiny"


@pytest.fixture(scope="module")
def served():
    metrics = Metrics()
    pool = ProcessWorkers({"tiny": MODEL}, engine="eager", devices=["cpu", "cpu"], max_batch=4, batch_window_ms=100,
                          max_queue=8, events=metrics)
    assert isinstance(pool, WorkerBase) and pool.events is metrics
    pool.start()
    app = create_app(pool, stop_worker_on_shutdown=False, metrics=metrics)
    assert pool.events is metrics and app.state.metrics is metrics
    assert pool.wait_ready(300)
    yield SimpleNamespace(pool=pool, app=app, metrics=metrics)
    pool.stop(drain=False, timeout=60)


def job(prompt="a cat", seed=0, **settings):
    return Job("tiny", prompt, seed=seed, settings=dict(dict(steps=2, scheduler="ddim", height=32, width=32),
                                                         **settings))


def slow_job(seed=0, steps=60):
    """A job that holds its process for seconds (64x64, many steps)."""
    return job(f"slow {seed}", seed=seed, steps=steps, height=64, width=64)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux' /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pixels(result) -> np.ndarray:
    return np.asarray(result.images[0].convert("RGB"), dtype=np.int16)


# ------------------------------------------------------------------------------------------------ the pool


def test_jobs_spread_over_both_processes_which_batch_their_own(served):
    futures = [served.pool.submit(job(f"a cat {i}", seed=i)) for i in range(8)]
    results = [f.result(120) for f in futures]
    assert {r.worker for r in results} == {0, 1}
    assert [r.params[0]["seed"] for r in results] == list(range(8))
    assert max(r.batch_images for r in results) > 1


def test_an_image_equals_the_in_process_workers(served):
    reference = Worker({"tiny": MODEL}, engine="eager", device="cpu")
    reference.start()
    try:
        assert reference.wait_ready(300)
        expected = reference.submit(job("a dog", seed=5)).result(120)
    finally:
        reference.stop()
    got = served.pool.submit(job("a dog", seed=5)).result(120)
    assert got.params == expected.params
    assert np.abs(_pixels(got) - _pixels(expected)).max() <= 1


def test_a_bad_job_fails_alone(served):
    pool = served.pool
    good = pool.submit(job(seed=1))
    bad = Job("tiny", "a cat", settings=dict(scheduler="no-such-sampler", steps=2, height=32, width=32))
    with pytest.raises(UsageError, match="unknown scheduler"):
        pool.submit(bad)  # refused by the front's cheap checks
    with pytest.raises(UsageError, match="unknown model"):
        pool.submit(Job("other", "a cat"))
    assert good.result(120).images
    assert pool.submit(job(seed=2)).result(120).images


def test_cancelled_jobs_are_dropped_before_they_run(served):
    pool, metrics = served.pool, served.metrics

    def dropped() -> float:
        return metrics.registry.get_sample_value("sdaccel_jobs_dropped_total", {"reason": "cancelled"}) or 0

    before = dropped()
    slow = [pool.submit(slow_job(seed=i)) for i in range(2)]  # one per process: what follows waits
    gone = job(seed=7, steps=3)
    gone_future = pool.submit(gone)
    gone.cancel()  # the client went away
    waited = pool.submit(job(seed=8, steps=4))
    assert waited.cancel()  # the waiter cancels the future itself: its process is told too
    with pytest.raises(CancelledJobError):
        gone_future.result(120)
    assert all(f.result(120).images for f in slow)
    wait_for(lambda: dropped() >= before + 2, "both jobs to be dropped in their processes")
    assert pool.queue_depth() == 0 and not pool.busy()


def test_the_front_refuses_when_every_process_queue_is_full(served):
    pool = served.pool
    slow = [pool.submit(slow_job(seed=i, steps=40)) for i in range(2)]
    wait_for(lambda: all(c.progress for c in pool._children), "both processes to run their slow job")
    accepted = []
    with pytest.raises(QueueFullError) as refused:
        for i in range(3 * pool.max_queue):
            accepted.append(pool.submit(job(seed=i)))
    assert len(accepted) == 2 * pool.max_queue and refused.value.retry_after_s >= 1
    assert all(f.result(120).images for f in slow + accepted)  # no process refused what the front accepted


def test_the_app_serves_the_pool_and_each_process_memory(served):
    from starlette.testclient import TestClient

    client = TestClient(served.app)  # no lifespan: the module's pool outlives the client
    assert client.get("/ready").json()["status"] == "ready"
    body = {"prompt": "a red cube", "steps": 2, "width": 32, "height": 32, "scheduler": "ddim", "seed": 3}
    response = client.post("/v1/generate", json=body)
    assert response.status_code == 200 and len(response.json()["images"]) == 1
    assert client.post("/v1/generate", json=dict(body, n=0)).status_code in (400, 422)
    assert client.get("/sdapi/v1/progress").status_code == 200
    text = client.get("/metrics").text
    for index in ("0", "1"):
        assert f'sdaccel_worker_resident_memory_bytes{{worker="{index}"}}' in text
    assert 'sdaccel_images_total{model="tiny"}' in text  # the processes' calls, counted in the front
    memory = memory_from_metrics(text)
    assert memory["worker0_rss_bytes"] > 1e8 and memory["worker1_rss_bytes"] > 1e8 and memory["host_rss_bytes"] > 0
    assert "gpu_allocated_bytes" not in memory  # CPU processes, and the front reads no GPU


def test_a_killed_process_fails_its_jobs_and_the_other_serves_on(served):
    pool = served.pool
    slow = pool.submit(slow_job(seed=1, steps=300))
    child = next(c for c in pool._children if c.jobs)
    wait_for(lambda: child.progress, "the slow job to start")
    os.kill(child.process.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"worker process {child.index} exited \(code -9\)"):
        slow.result(60)
    futures = [pool.submit(job(seed=i)) for i in range(3)]
    assert {f.result(120).worker for f in futures} == {1 - child.index}
    assert pool.ready() and list(pool.memory()) == [str(1 - child.index)]


def test_stop_drains_queued_jobs_and_refuses_new_ones(served):
    pool = served.pool
    futures = [pool.submit(job(seed=i, steps=3 + i)) for i in range(4)]  # other steps each: one call each
    pool.stop(drain=True, timeout=120)
    assert all(f.done() and f.result().images for f in futures)
    with pytest.raises(RuntimeError, match="shutting down"):
        pool.submit(job())
    pool.stop()  # twice: nothing more to do
    assert not any(c.process.is_alive() for c in pool._children)


# --------------------------------------------------------------------------------------- no processes needed


def test_metrics_and_loadtest_take_memory_from_the_processes():
    class Pool:
        def queue_depth(self):
            return 0

        def busy(self):
            return False

        def memory(self):
            return {"0": dict(device="cuda:0", rss_bytes=2e9, gpu_allocated_bytes=4e9),
                    "1": dict(device="cuda:1", rss_bytes=3e9, gpu_allocated_bytes=5e9)}

    metrics = Metrics()
    metrics.bind(Pool())
    memory = memory_from_metrics(metrics.render().decode())
    assert {k: v for k, v in memory.items() if k != "host_rss_bytes"} == {
        "worker0_rss_bytes": 2e9, "worker1_rss_bytes": 3e9, "gpu_allocated_bytes": 9e9,
        "gpu_allocated_bytes_cuda:0": 4e9, "gpu_allocated_bytes_cuda:1": 5e9}
    assert memory["host_rss_bytes"] > 0
    single = 'process_resident_memory_bytes 1e9\nsdaccel_gpu_memory_allocated_bytes{device="cuda:0"} 4e9\n'
    assert memory_from_metrics(single) == {"host_rss_bytes": 1e9, "gpu_allocated_bytes": 4e9}


def test_a_gpu_process_sees_only_its_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert child_device("cuda:1") == ("cuda", "1") and child_device("cpu") == ("cpu", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")  # indices count among the server's own visible GPUs
    assert child_device("cuda:1") == ("cuda", "5")
    with pytest.raises(UsageError, match="no GPU 2"):
        child_device("cuda:2")


@pytest.mark.parametrize("args, message", [
    (["--gpus", "all"], "--gpus: no CUDA GPU is visible"),
    (["--gpus", "0"], "--gpus: no CUDA GPU is visible"),
    (["--gpus", "0,x"], "expected all or GPU indices"),
    (["--gpus", "1,1"], "a GPU is named twice"),
    (["--gpus", "0", "--ray"], "--gpus and --ray exclude each other"),
    (["--gpus", "0", "--device", "cpu"], "drop --device"),
    (["--gpus", "0", "--cpu-workers", "2"], "exclude each other"),
    (["--cpu-workers", "0"], "--cpu-workers must be >= 1"),
])
def test_gpus_errors_are_one_line(args, message, capsys):
    assert cli.main(["serve", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sdaccel: error: ") and message in err[0]


def test_gpus_counts_the_visible_gpus(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert worker_devices("all", None, None, False) == ["cuda:0", "cuda:1"]
    assert worker_devices(" 1, 0 ", None, None, False) == ["cuda:1", "cuda:0"]
    assert worker_devices(None, 3, None, False) == ["cpu"] * 3
    assert worker_devices(None, None, "cpu", False) is None
    assert cli.main(["serve", "--gpus", "0,2"]) == 2
    assert "there is no GPU 2 (2 visible: 0-1)" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_with_worker_processes_drains_on_sigterm(tmp_path):
    with serve_process(tmp_path, "--model", MODEL, "--engine", "eager", "--cpu-workers", "2",
                       new_session=True) as served:
        proc, url = served.proc, served.url
        pids = _children(proc.pid)
        assert len(pids) >= 2  # the two workers (and multiprocessing's resource tracker)
        result = {}
        thread = threading.Thread(target=lambda: result.update(r=httpx.post(
            f"{url}/v1/generate", json={"prompt": "x", "steps": 60, "width": 64, "height": 64}, timeout=120)))
        thread.start()
        wait_for(lambda: httpx.get(f"{url}/sdapi/v1/progress").json()["state"]["job_count"] > 0,
                 "the job to start")
        os.killpg(proc.pid, signal.SIGTERM)  # as a service manager stops it: every process gets SIGTERM
        thread.join(120)
        assert result["r"].status_code == 200 and len(result["r"].json()["images"]) == 1
        assert proc.wait(60) == 0, served.log.read_text()
        assert "2 worker processes: cpu, cpu" in served.log.read_text()
        wait_for(lambda: not any(_running(pid) for pid in pids), "the worker processes to exit", timeout=30)
