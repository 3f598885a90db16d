"""`sdaccel serve --ray`: two local Ray Serve replicas of the worker and app, requests spread over both, the API key
kept, and SIGTERM shutting Serve down."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

REPO = Path(__file__).resolve().parents[2]
KEY = "ray-key"


@pytest.mark.slow
def test_two_replicas_serve_and_shut_down(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a Ray instance of its own
    env.update(PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled")
    server = subprocess.Popen(
        [sys.executable, "-m", "sdaccel", "serve", "--ray", "--replicas", "2", "--model", "synthetic:sd15-tiny",
         "--engine", "eager", "--device", "cpu", "--port", str(port), "--api-key", KEY],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # Ray's start and two replicas loading torch on a busy 2-core machine
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, server.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the replicas did not become ready"
            time.sleep(2)
        body = {"prompt": "a cat", "steps": 2, "width": 32, "height": 32, "scheduler": "ddim"}

        def generate(seed):
            return httpx.post(f"{url}/v1/generate", json=dict(body, seed=seed), timeout=300,
                              headers={"Authorization": f"Bearer {KEY}"})

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(generate, range(8)))
        assert [r.status_code for r in responses] == [200] * 8
        assert all(len(r.json()["images"]) == 1 for r in responses)
        replicas = {r.headers["x-sdaccel-replica"] for r in responses}
        for _ in range(10):  # Ray's router may favour one replica for a while: more rounds until both answered
            if len(replicas) == 2:
                break
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                replicas |= {r.headers["x-sdaccel-replica"] for r in pool.map(generate, range(8))}
        again, first = (np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["images"][0]))), dtype=np.int16)
                        for r in (generate(3), responses[3]))
        assert np.abs(again - first).max() <= 1  # the same seed on either replica, batched or alone
        assert len(replicas) == 2, replicas
        assert httpx.post(f"{url}/v1/generate", json=body, timeout=60).status_code == 401
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=240)  # Serve's controller takes up to a minute to stop
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert code == 0
