"""What the serve tests share: waiting for a condition, and `sdaccel serve` run as a process of its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

from sdaccel.serve.loadtest import free_port

REPO = Path(__file__).resolve().parents[2]


def wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def serve_process(tmp_path: Path, *args: str, new_session: bool = False):
    """`sdaccel serve ARGS` on a free loopback port, its output in tmp_path/serve.log, ready when entered; killed on
    the way out if still running. Yields (proc, url, log: the log's path)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log_path = tmp_path / "serve.log"
    log = open(log_path, "w+")
    proc = subprocess.Popen([sys.executable, "-m", "sdaccel", "serve", *args, "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=new_session)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready():
            assert proc.poll() is None, log_path.read_text()
            try:
                return httpx.get(f"{url}/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, "the server to be ready", timeout=120)
        yield SimpleNamespace(proc=proc, url=url, log=log_path)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
