"""`sdaccel serve --cpu-workers 2` as a process of its own, both worker processes killed with SIGKILL: every request
during the outage is answered (503 with Retry-After, or 200 once a process is back, never a 500 or a dropped
connection), the server serves again, and /metrics counts both restarts."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

from serve_helpers import serve_process, wait_for  # noqa: E402

MODEL = "synthetic:sd15-tiny"
BODY = {"prompt": "a red cube", "steps": 2, "width": 32, "height": 32, "scheduler": "ddim", "seed": 1}
BACK_WITHIN_S = 60


def worker_pids(server_pid: int) -> list[int]:
    """The server's worker processes (multiprocessing's spawned children; not its resource tracker)."""
    return sorted(p.pid for p in psutil.Process(server_pid).children()
                  if "spawn_main" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE)


@pytest.mark.slow
def test_killing_every_worker_process_is_503_until_they_are_back(tmp_path):
    with serve_process(tmp_path, "--model", MODEL, "--engine", "eager", "--cpu-workers", "2") as served:
        url, proc = served.url, served.proc
        assert httpx.post(f"{url}/v1/generate", json=BODY, timeout=60).status_code == 200
        killed = worker_pids(proc.pid)
        assert len(killed) == 2, killed
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        statuses = []
        while time.monotonic() - killed_at < BACK_WITHIN_S:
            response = httpx.post(f"{url}/v1/generate", json=BODY, timeout=BACK_WITHIN_S)  # raises if dropped
            statuses.append(response.status_code)
            if response.status_code == 200:
                break
            assert response.status_code == 503, response.text
            assert response.json()["error"]["type"] == "server_unavailable"
            assert int(response.headers["Retry-After"]) >= 1
            time.sleep(0.1)
        assert statuses[-1] == 200, f"not serving {BACK_WITHIN_S} s after the kill: {statuses}\n" + \
            served.log.read_text()[-3000:]
        assert 503 in statuses  # the outage was seen, and answered
        wait_for(lambda: httpx.get(f"{url}/ready").status_code == 200, "/ready", timeout=BACK_WITHIN_S)
        wait_for(lambda: len(worker_pids(proc.pid)) == 2, "both worker processes", timeout=BACK_WITHIN_S)
        assert not set(worker_pids(proc.pid)) & set(killed)
        metrics = httpx.get(f"{url}/metrics").text
        for index in ("0", "1"):
            assert f'sdaccel_worker_restarts_total{{worker="{index}"}} 1.0' in metrics
        log = served.log.read_text()
        assert "worker process 0 (cpu) exited (code -9)" in log and "worker process 1 (cpu) started again" in log
        assert proc.poll() is None
