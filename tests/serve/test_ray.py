"""`sdaccel serve --ray`: two local Ray Serve replicas of the worker and app, requests spread over both, the API key
kept, and SIGTERM shutting Serve down; a full queue refused with 429 and Retry-After."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
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
KEY = "ray-key-0123456789"  # --api-key takes 16 characters at least


@contextlib.contextmanager
def ray_server(tmp_path, *args: str):
    """`sdaccel serve --ray ARGS` on a free port with a Ray instance of its own, ready when entered; yields its URL
    and, on the way out, stops it with SIGTERM and checks that it exited 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a Ray instance of its own
    env.update(PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled")
    server = subprocess.Popen(
        [sys.executable, "-m", "sdaccel", "serve", "--ray", "--model", "synthetic:sd15-tiny", "--engine", "eager",
         "--device", "cpu", "--port", str(port), "--api-key", KEY, *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # Ray's start and the replicas loading torch on a busy 2-core machine
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, server.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the replicas did not become ready"
            time.sleep(2)
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=240)  # Serve's controller takes up to a minute to stop
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert code == 0


@pytest.mark.slow
def test_two_replicas_serve_and_shut_down(tmp_path):
    with ray_server(tmp_path, "--replicas", "2") as url:
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


@pytest.mark.slow
def test_a_full_queue_is_refused_with_429(tmp_path):
    # A replica holds max_queue + max_batch = 2 requests, Ray's proxy max_queue = 1 more: of 6 at once, some are
    # refused at once (Ray counts its queue loosely: it may refuse more than strictly needed), and every one is
    # answered, 200 or 429 with Retry-After; none waits in an unbounded queue nor turns into a 503.
    with ray_server(tmp_path, "--max-queue", "1", "--max-batch", "1") as url:
        body = {"prompt": "a cat", "steps": 20, "width": 64, "height": 64, "scheduler": "ddim"}

        def generate(seed):
            return httpx.post(f"{url}/v1/generate", json=dict(body, seed=seed), timeout=300,
                              headers={"Authorization": f"Bearer {KEY}"})

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(generate, range(6)))
        codes = sorted(r.status_code for r in responses)
        assert set(codes) == {200, 429}, codes
        for r in responses:
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1, r.headers
            else:
                assert len(r.json()["images"]) == 1
