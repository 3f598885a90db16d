"""A1111's progress with live previews, interrupt and skip (previews.py, progress.py, routes_progress.py) on an
in-process Worker behind a real server: the tiny SD1.5 on the CPU, its calls held at a chosen step until the test
lets them go, so what /progress shows mid-call is known exactly."""

from __future__ import annotations

import base64
import functools
import io
import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from inprocess_server import InProcessServer  # noqa: E402

from sdaccel.errors import UsageError  # noqa: E402
from sdaccel.models import get_spec  # noqa: E402
from sdaccel.pipeline.remedies import to_uint8  # noqa: E402
from sdaccel.pipeline.stopping import STOP  # noqa: E402
from sdaccel.serve import previews  # noqa: E402
from sdaccel.serve.jobs import Job  # noqa: E402
from sdaccel.serve.previews import (SD_LATENT_RGB, SDXL_LATENT_RGB, LatentPreviews, latent_rgb_factors,  # noqa: E402
                                    preview_pixels)
from sdaccel.serve.progress import Progress  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402

MODEL = "synthetic:sd15-tiny"
BODY = {"prompt": "a lighthouse", "steps": 8, "width": 64, "height": 64, "scheduler": "ddim", "seed": 4}


@functools.lru_cache(maxsize=1)
def _pipe():
    import sdaccel

    return sdaccel.load(MODEL, engine="eager", device="cpu")


class Held:
    """The tiny pipeline, each call held after step `hold` (0-based, before the worker's callback sees that step)
    until release(), every step's latents kept."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.arm(None)

    def arm(self, hold: int | None) -> None:
        self.hold, self.latents = hold, []
        self.reached, self.released = threading.Event(), threading.Event()

    def __call__(self, *args, callback=None, **kwargs):
        def held(i, t, latents):
            self.latents.append(latents.clone())
            if i == self.hold:
                self.reached.set()
                assert self.released.wait(60)
            return callback(i, t, latents)

        return self.pipe(*args, callback=held, **kwargs)

    def __getattr__(self, name):
        return getattr(self.pipe, name)


@pytest.fixture(scope="module")
def served():
    held = Held(_pipe())
    server = InProcessServer({"tiny": MODEL}, loader=lambda ref, **kwargs: held, max_batch=4, batch_window_ms=20,
                             preview_every=2)
    yield SimpleNamespace(url=server.url, held=held, worker=server.worker)
    server.close()


def in_background(call):
    """call() on a thread; the returned function joins it and gives its result."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(r=call()))
    thread.start()

    def join():
        thread.join(120)
        return out["r"]

    return join


def vae_pixels(latents: torch.Tensor) -> np.ndarray:
    """Latents decoded by diffusers' VAE, as the pipeline converts them: (B, H, W, 3) uint8."""
    pipe = _pipe()
    with torch.inference_mode():
        image = to_uint8(pipe.components.vae.decode(latents / pipe.spec.vae_scaling_factor).sample)
    return image.permute(0, 2, 3, 1).numpy()


def png_pixels(b64: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


# ------------------------------------------------------------------------------------------------ the previews


def test_a_preview_is_the_a1111_coefficient_map_of_the_latents():
    latents = torch.randn(4, 5, 7, generator=torch.Generator().manual_seed(0)) * 1.5
    for factors in (SD_LATENT_RGB, SDXL_LATENT_RGB):
        pixels = preview_pixels(latents, torch.tensor(factors)).numpy()
        assert pixels.shape == (5, 7, 3) and pixels.dtype == np.uint8
        x = latents.double().numpy()
        for y in range(5):
            for col in range(7):
                for c in range(3):  # sum over the latent channels, then A1111's x * 0.5 + 0.5, clamped, truncated
                    value = sum(x[k, y, col] * factors[k][c] for k in range(4)) * 0.5 + 0.5
                    expected = int(min(max(value, 0.0), 1.0) * 255)
                    on_a_boundary = abs(value * 255 - round(value * 255)) < 1e-4  # float32 may truncate either way
                    assert abs(int(pixels[y, col, c]) - expected) <= (1 if on_a_boundary else 0)
    assert latent_rgb_factors(get_spec("sd15-tiny")) == SD_LATENT_RGB
    assert latent_rgb_factors(get_spec("sd21-tiny")) == SD_LATENT_RGB
    assert latent_rgb_factors(get_spec("sdxl-tiny")) == SDXL_LATENT_RGB
    assert latent_rgb_factors(SimpleNamespace(latent_channels=16, is_xl=False)) is None


def test_previews_come_every_n_steps_and_never_with_0(monkeypatch):
    computed = []
    real = previews.preview_pixels
    monkeypatch.setattr(previews, "preview_pixels", lambda *a: computed.append(1) or real(*a))
    steps = [torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(i)) for i in range(9)]
    every3 = LatentPreviews(3)
    every3.start(get_spec("sd15-tiny"))
    assert every3.latest() is None
    for i, latents in enumerate(steps):
        every3.step(i, latents)
    assert len(computed) == 3  # after steps 3, 6 and 9
    latest = every3.latest()
    assert latest.step == 9 and np.array_equal(latest.pixels,
                                               real(steps[8][0], torch.tensor(SD_LATENT_RGB)).numpy())
    assert latest.png_b64() is latest.png_b64()  # encoded once
    every3.finish()
    assert every3.latest() is None
    never = LatentPreviews(0)
    never.start(get_spec("sd15-tiny"))
    for i, latents in enumerate(steps):
        never.step(i, latents)
    assert len(computed) == 3 and never.latest() is None
    for bad in (-1, 1.5, True, "5"):
        with pytest.raises(UsageError, match="preview_every"):
            Worker({"tiny": MODEL}, preview_every=bad)


def test_a_stop_is_asked_of_the_running_call_only():
    progress = Progress(0)
    assert not progress.request_stop() and progress.snapshot() == {}
    progress.start([Job("tiny", "a cat", n=2)], steps=10)
    call = progress.snapshot()["call"]
    assert progress.step(0) is None and progress.snapshot()["step"] == 1
    assert not progress.request_stop(call=call + 1)  # another call's number: that call has ended
    assert progress.request_stop(skip=True, call=call)
    state = progress.snapshot()
    assert state["skipped"] and not state["interrupted"] and progress.step(1) is STOP
    progress.finish()
    assert progress.snapshot() == {} and not progress.request_stop()
    progress.start([Job("tiny", "a cat")], steps=10)
    assert progress.snapshot()["call"] == call + 1 and progress.step(0) is None


# ------------------------------------------------------------------------------------------------ the server


def test_progress_shows_the_preview_and_interrupt_answers_the_latents_reached(served):
    url, held = served.url, served.held
    held.arm(hold=3)
    answer = in_background(lambda: httpx.post(f"{url}/v1/generate", json=BODY, timeout=120))
    assert held.reached.wait(60)
    queued = in_background(lambda: httpx.post(f"{url}/v1/generate", json=dict(BODY, steps=3, seed=9), timeout=120))
    progress = httpx.get(f"{url}/sdapi/v1/progress").json()
    assert progress["state"]["sampling_step"] == 3 and progress["state"]["sampling_steps"] == 8
    assert progress["progress"] == pytest.approx(3 / 8) and not progress["state"]["interrupted"]
    shown = png_pixels(progress["current_image"])  # the preview after step 2 (every 2 steps), at latent size
    assert shown.shape == (32, 32, 3)
    assert np.array_equal(shown, preview_pixels(held.latents[1][0], torch.tensor(SD_LATENT_RGB)).numpy())
    skipped = httpx.get(f"{url}/sdapi/v1/progress", params={"skip_current_image": "true"}).json()
    assert skipped["current_image"] is None and skipped["state"]["sampling_step"] == 3
    stopped = httpx.post(f"{url}/sdapi/v1/interrupt")
    assert stopped.status_code == 200 and stopped.json() == {}
    state = httpx.get(f"{url}/sdapi/v1/progress").json()["state"]
    assert state["interrupted"] and not state["skipped"]
    held.released.set()
    response = answer()
    assert response.status_code == 200, response.text
    params = response.json()["parameters"][0]
    assert params["interrupted_at_step"] == 4 and params["steps"] == 8 and params["seed"] == 4
    # The image is the latents after the step that stopped, decoded; the job queued meanwhile ran whole.
    assert np.array_equal(png_pixels(response.json()["images"][0]), vae_pixels(held.latents[3])[0])
    after = queued()
    assert after.status_code == 200 and "interrupted_at_step" not in after.json()["parameters"][0]
    idle = httpx.get(f"{url}/sdapi/v1/progress").json()
    assert idle["current_image"] is None and idle["state"]["job_count"] == 0 and not idle["state"]["interrupted"]


def test_skip_stops_an_a1111_call_which_answers_its_images_and_infotext(served):
    url, held = served.url, served.held
    held.arm(hold=1)
    body = {"prompt": "a forest", "steps": 6, "width": 64, "height": 64, "seed": 3, "sampler_name": "DDIM"}
    answer = in_background(lambda: httpx.post(f"{url}/sdapi/v1/txt2img", json=body, timeout=120))
    assert held.reached.wait(60)
    skipped = httpx.post(f"{url}/sdapi/v1/skip")
    assert skipped.status_code == 200 and skipped.json() is None
    state = httpx.get(f"{url}/sdapi/v1/progress").json()["state"]
    assert state["skipped"] and not state["interrupted"]
    held.released.set()
    response = answer()
    assert response.status_code == 200, response.text
    info = json.loads(response.json()["info"])
    assert info["all_seeds"] == [3] and "Steps: 6" in info["infotexts"][0]
    assert np.array_equal(png_pixels(response.json()["images"][0]), vae_pixels(held.latents[1])[0])
    held.arm(None)
    again = httpx.post(f"{url}/sdapi/v1/txt2img", json=body, timeout=120)  # the worker serves on, whole calls
    assert again.status_code == 200 and len(held.latents) == 6


def test_interrupt_and_skip_answer_200_when_idle_and_refuse_unknown_parameters(served):
    url = served.url
    assert httpx.post(f"{url}/sdapi/v1/interrupt").json() == {}
    assert httpx.post(f"{url}/sdapi/v1/skip").status_code == 200
    assert not served.worker.interrupt() and not served.worker.interrupt(skip=True)
    for method, path in (("GET", "progress?skip_current_images=true"), ("POST", "interrupt?now=1"),
                         ("POST", "skip?all=1")):
        response = httpx.request(method, f"{url}/sdapi/v1/{path}")
        name = path.split("?")[1].split("=")[0]
        assert response.status_code == 400 and name in response.json()["error"]["message"]
    assert httpx.get(f"{url}/sdapi/v1/progress", params={"skip_current_image": "maybe"}).status_code in (400, 422)
    assert httpx.get(f"{url}/health").status_code == 200  # still up


def test_preview_every_0_computes_no_preview(monkeypatch):
    computed = []
    real = previews.preview_pixels
    monkeypatch.setattr(previews, "preview_pixels", lambda *a: computed.append(1) or real(*a))
    held = Held(_pipe())
    worker = Worker({"tiny": MODEL}, engine="eager", device="cpu", loader=lambda ref, **kwargs: held,
                    preview_every=0)
    worker.start()
    try:
        assert worker.wait_ready(300)
        held.arm(hold=5)
        future = worker.submit(Job("tiny", "a cat", seed=1, settings=dict(steps=8, height=64, width=64)))
        assert held.reached.wait(60)
        assert worker.progress.snapshot()["step"] == 5 and worker.progress.preview() is None
        held.released.set()
        assert future.result(120).images and computed == []
    finally:
        worker.stop()


def test_serve_refuses_a_negative_preview_every_in_one_line(capsys):
    from sdaccel.cli import main as cli

    assert cli.main(["serve", "--preview-every", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--preview-every must be >= 0" in err and len(err.splitlines()) == 1
