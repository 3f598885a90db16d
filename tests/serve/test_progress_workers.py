"""Progress with live previews, interrupt and skip through worker processes (ProcessWorkers, `sdaccel serve
--cpu-workers`): the preview's pixels cross from the process with its progress, and the front tells the process
running the call to stop it. One spawned CPU process of the tiny SD1.5, long calls (many steps) stopped early."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from serve_helpers import wait_for  # noqa: E402

from sdaccel.pipeline.stopping import STOP  # noqa: E402
from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.jobs import Job  # noqa: E402
from sdaccel.serve.workers import ProcessWorkers  # noqa: E402

MODEL = "synthetic:sd15-tiny"
SETTINGS = dict(steps=150, height=64, width=64, scheduler="ddim")  # seconds of steps: stopped long before the end


@pytest.fixture(scope="module")
def served():
    from starlette.testclient import TestClient

    pool = ProcessWorkers({"tiny": MODEL}, engine="eager", devices=["cpu"], max_batch=2, preview_every=5)
    pool.start()
    try:
        assert pool.wait_ready(300)
        yield pool, TestClient(create_app(pool, stop_worker_on_shutdown=False))
    finally:
        pool.stop(drain=False, timeout=60)


def stopped_reference(seed: int, steps_run: int) -> np.ndarray:
    """The image of the same call stopped after `steps_run` steps, made in this process."""
    import sdaccel

    pipe = sdaccel.load(MODEL, engine="eager", device="cpu")
    result = pipe("a slow cat", seeds=[seed], **SETTINGS,
                  callback=lambda i, t, latents: STOP if i + 1 == steps_run else None)
    return np.asarray(result.images[0], dtype=np.int16)


@pytest.mark.slow
def test_a_processs_call_shows_its_preview_and_stops_when_interrupted(served):
    pool, client = served
    future = pool.submit(Job("tiny", "a slow cat", seed=3, settings=SETTINGS))
    wait_for(lambda: pool.progress.preview() is not None, "a preview from the worker process")
    preview = pool.progress.preview()
    assert preview.pixels.shape == (32, 32, 3) and preview.pixels.dtype == np.uint8 and preview.step % 5 == 0
    progress = client.get("/sdapi/v1/progress").json()
    shown = Image.open(io.BytesIO(base64.b64decode(progress["current_image"])))
    assert shown.format == "PNG" and shown.size == (32, 32) and progress["state"]["sampling_steps"] == 150
    assert client.get("/sdapi/v1/progress?skip_current_image=true").json()["current_image"] is None
    seen = progress["state"]["sampling_step"]
    assert client.post("/sdapi/v1/interrupt").json() == {}
    result = future.result(120)
    step = result.params[0]["interrupted_at_step"]
    assert seen <= step < 150
    got = np.asarray(result.images[0], dtype=np.int16)
    assert np.abs(got - stopped_reference(3, step)).max() <= 1  # the latents reached, decoded
    wait_for(lambda: not pool.busy(), "the process to finish its call")
    assert pool.progress.preview() is None and client.get("/sdapi/v1/progress").json()["current_image"] is None
    whole = pool.submit(Job("tiny", "a cat", seed=1, settings=dict(SETTINGS, steps=3))).result(120)
    assert "interrupted_at_step" not in whole.params[0]  # the process serves on


@pytest.mark.slow
def test_skip_reaches_the_process_too(served):
    pool, client = served
    future = pool.submit(Job("tiny", "a slow cat", seed=4, settings=SETTINGS))
    wait_for(lambda: pool.progress.snapshot().get("step", 0) >= 2, "the call to run")
    assert client.post("/sdapi/v1/skip").status_code == 200
    assert future.result(120).params[0]["interrupted_at_step"] < 150
    assert not pool.interrupt()  # nothing runs now
