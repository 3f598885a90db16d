"""A Worker behind the app on a uvicorn server in a thread of the test process (as `sdaccel serve` runs it), for
tests that need a real HTTP port (webuiapi) and the worker's own pipelines beside it for reference images."""

from __future__ import annotations

import threading
import time

import uvicorn

from sdaccel.serve.app import create_app
from sdaccel.serve.loadtest import free_port
from sdaccel.serve.worker import Worker


class InProcessServer:
    """`Worker(models, engine="eager", device="cpu", **worker_args)` started and ready, served at self.url;
    `app_args` go to create_app (loras=..., request_timeout_s: 120 unless given)."""

    def __init__(self, models: dict[str, str], app_args: dict | None = None, **worker_args):
        self.worker = Worker(models, engine="eager", device="cpu", **worker_args)
        self.worker.start()
        assert self.worker.wait_ready(300)
        app = create_app(self.worker, **{"request_timeout_s": 120, **(app_args or {})})
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
