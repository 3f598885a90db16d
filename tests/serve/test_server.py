"""`sdaccel serve` end to end on the CPU: a real uvicorn server on a loopback port, the tiny synthetic SD1.5, the
eager engine and 2-3 steps; driven by httpx, the openai client and webuiapi (A1111's client)."""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from inprocess_server import InProcessServer  # noqa: E402
from serve_helpers import REPO, serve_process, wait_for  # noqa: E402

from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.metrics import Metrics  # noqa: E402
from sdaccel.serve.schemas import Limits  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "synthetic:sd15-tiny"


@functools.lru_cache(maxsize=1)
def _pipe():
    import sdaccel

    return sdaccel.load(MODEL, engine="eager", device="cpu")


def _loader(ref, **kwargs):
    """Every worker of this module shares one loaded pipeline (the workers never run at the same time)."""
    return _pipe()


class _Server(InProcessServer):
    """A Worker behind the app on a uvicorn server in a thread, as `sdaccel serve` runs it, its metrics kept."""

    def __init__(self, models: dict[str, str], *, api_key: str | None = None, limits: Limits = Limits(),
                 **worker_args):
        self.metrics = Metrics()
        super().__init__(models, app_args=dict(api_key=api_key, limits=limits, metrics=self.metrics),
                         loader=_loader, events=self.metrics, **worker_args)

    def close(self) -> None:
        super().close()
        assert not self.worker._thread.is_alive()  # the lifespan's shutdown stopped the worker


@pytest.fixture(scope="module")
def server():
    s = _Server({"tiny": MODEL, "tiny2": MODEL}, api_key=KEY, limits=Limits(max_body_bytes=2 * 2**20, max_n=4),
                max_batch=8, batch_window_ms=300, max_queue=16)
    yield s
    s.close()


def _png(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def _pixels(b64: str) -> np.ndarray:
    return np.asarray(_png(b64).convert("RGB"), dtype=np.int16)


def _b64_image(size=(32, 32), color=(120, 80, 200), mode="RGB") -> str:
    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _generate(server, **body):
    body = {"prompt": "a red cube", "steps": 2, "width": 32, "height": 32, "scheduler": "ddim", **body}
    return httpx.post(f"{server.url}/v1/generate", json=body, headers=AUTH, timeout=120)


# ------------------------------------------------------------------------------------------------ access


def test_health_ready_and_api_key(server):
    assert httpx.get(f"{server.url}/health").status_code == 200  # open without the key
    ready = httpx.get(f"{server.url}/ready")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}  # open, but no detail without the key
    ready = httpx.get(f"{server.url}/ready", headers=AUTH)
    assert ready.status_code == 200 and ready.json()["models"] == ["tiny", "tiny2"]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}):
        r = httpx.get(f"{server.url}/sdapi/v1/sd-models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.post(f"{server.url}/v1/generate", json={"prompt": "x"}).status_code == 401
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    for headers in (AUTH, {"X-API-Key": KEY}):
        r = httpx.get(f"{server.url}/sdapi/v1/sd-models", headers=headers)
        assert r.status_code == 200
        assert [m["title"] for m in r.json()] == ["tiny", "tiny2"]


def test_ready_is_503_until_the_worker_is_ready():
    worker = Worker({"tiny": MODEL}, loader=lambda ref, **kw: time.sleep(30))  # never ready during the test
    events = worker.events
    transport = httpx.ASGITransport(app=create_app(worker, stop_worker_on_shutdown=False))
    assert worker.events is events  # the app reports to its own Metrics: the worker's events stay its own

    async def probe():
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/ready"), await client.get("/health")

    ready, health = asyncio.run(probe())
    assert ready.status_code == 503 and "loading" in ready.json()["error"]["message"]
    assert health.status_code == 200


# ------------------------------------------------------------------------------------------------ OpenAI


def test_openai_client_images_and_determinism(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)

    def call():
        return client.images.generate(prompt="a lighthouse", n=2, size="64x64", response_format="b64_json",
                                      extra_body={"steps": 2, "seed": 3, "scheduler": "ddim"})

    first, second = call(), call()
    assert len(first.data) == 2
    images = [_png(d.b64_json) for d in first.data]
    assert all(im.size == (64, 64) for im in images)
    text = images[1].text["parameters"]
    # Image i of seed s is seed s + i's (A1111's numbering): each PNG names its own.
    assert text.startswith("a lighthouse") and "Seed: 4" in text and "Steps: 2" in text and "Batch index: 1" in text
    assert "Seed: 3," in images[0].text["parameters"]
    assert [d.b64_json for d in first.data] == [d.b64_json for d in second.data]  # same seed, same PNG bytes
    assert first.data[0].b64_json != first.data[1].b64_json

    jpeg = client.images.generate(prompt="a lighthouse", n=1, size="64x64", output_format="jpeg",
                                  output_compression=90, extra_body={"steps": 2, "seed": 3, "scheduler": "ddim"})
    assert jpeg.output_format == "jpeg"
    decoded = Image.open(io.BytesIO(base64.b64decode(jpeg.data[0].b64_json)))
    assert decoded.format == "JPEG" and decoded.size == (64, 64)
    # The PNG of the same seed, encoded as JPEG at the same quality here: the same pixels.
    local = io.BytesIO()
    images[0].convert("RGB").save(local, format="JPEG", quality=90)
    assert np.array_equal(np.asarray(decoded), np.asarray(Image.open(local)))

    with pytest.raises(openai.BadRequestError, match="b64_json"):
        client.images.generate(prompt="x", size="64x64", response_format="url", extra_body={"steps": 2})
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong").images.generate(prompt="x")


# ------------------------------------------------------------------------------------------------- A1111


def test_webuiapi_txt2img_seeds_like_a1111(server):
    webuiapi = pytest.importorskip("webuiapi")
    api = webuiapi.WebUIApi(host="127.0.0.1", port=server.port, username="user", password=KEY)
    result = api.txt2img(prompt="a forest", negative_prompt="fog", seed=5, steps=2, width=32, height=32,
                         batch_size=2, sampler_name="DPM++ 2M Karras", cfg_scale=6)
    assert len(result.images) == 2 and all(im.size == (32, 32) for im in result.images)
    assert result.info["all_seeds"] == [5, 6] and result.info["seed"] == 5
    assert result.info["sampler_name"] == "dpmpp_2m_karras" and result.info["cfg_scale"] == 6
    assert "Negative prompt: fog" in result.images[1].info["parameters"]
    # Each image is the one its own seed gives alone, as in A1111.
    alone = api.txt2img(prompt="a forest", negative_prompt="fog", seed=6, steps=2, width=32, height=32,
                        sampler_name="DPM++ 2M Karras", cfg_scale=6)
    diff = np.abs(np.asarray(alone.image, np.int16) - np.asarray(result.images[1], np.int16)).max()
    assert diff <= 1


def test_a1111_options_models_and_progress(server):
    url = f"{server.url}/sdapi/v1"
    assert httpx.get(f"{url}/options", headers=AUTH).json()["sd_model_checkpoint"] == "tiny"
    assert httpx.post(f"{url}/options", json={"sd_model_checkpoint": "tiny2"}, headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/options", headers=AUTH).json()["sd_model_checkpoint"] == "tiny2"
    r = httpx.post(f"{url}/txt2img", json={"prompt": "x", "steps": 2, "width": 32, "height": 32, "seed": 1},
                   headers=AUTH, timeout=120)
    assert r.status_code == 200 and json.loads(r.json()["info"])["sd_model_name"] == "tiny2"
    r = httpx.post(f"{url}/options", json={"sd_model_checkpoint": "nope"}, headers=AUTH)
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    assert httpx.post(f"{url}/options", json={"sd_model_checkpoint": "tiny"}, headers=AUTH).status_code == 200
    progress = httpx.get(f"{url}/progress", headers=AUTH).json()
    assert progress["progress"] == 0 and progress["state"]["job_count"] == 0


def test_a1111_img2img_and_inpainting(server):
    mask = Image.new("L", (32, 32), 0)
    mask.paste(255, (0, 0, 16, 32))
    buffer = io.BytesIO()
    mask.save(buffer, format="PNG")
    body = {"init_images": [_b64_image()], "denoising_strength": 0.5, "steps": 2, "width": 32, "height": 32,
            "seed": 4, "mask": base64.b64encode(buffer.getvalue()).decode(), "mask_blur": 0}
    r = httpx.post(f"{server.url}/sdapi/v1/img2img", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    image = _png(r.json()["images"][0])
    assert image.size == (32, 32)
    assert "Denoising strength: 0.5" in image.text["parameters"] and "Workload: inpaint" in image.text["parameters"]


# --------------------------------------------------------------------------------------- sdaccel's own API


def test_concurrent_requests_batch_and_match_alone(server):
    requests = [dict(prompt="a red cube", seed=11, n=1), dict(prompt="a blue sphere", seed=12, n=2,
                                                                negative_prompt="blur"),
                dict(prompt="a green cone", seed=13, n=1)]

    async def together():
        async with httpx.AsyncClient(headers=AUTH, timeout=120) as client:
            return await asyncio.gather(*(client.post(
                f"{server.url}/v1/generate", json={"steps": 2, "width": 32, "height": 32, "scheduler": "ddim", **r})
                for r in requests))

    batched = [r.json() for r in asyncio.run(together())]
    assert all(b["batch_images"] > 1 for b in batched), [b["batch_images"] for b in batched]
    for request, got in zip(requests, batched):
        alone = _generate(server, **request).json()
        assert alone["batch_images"] == request["n"] and len(alone["images"]) == request["n"]
        seeds = list(range(request["seed"], request["seed"] + request["n"]))
        assert [p["seed"] for p in got["parameters"]] == seeds == [p["seed"] for p in alone["parameters"]]
        for a, b in zip(alone["images"], got["images"]):
            assert np.abs(_pixels(a) - _pixels(b)).max() <= 1
    # The 2-image request's second image is the 1-image request's of seed 13, its PNG naming that seed.
    second = dict(requests[1], seed=13, n=1)
    (one,) = _generate(server, **second).json()["images"]
    assert np.abs(_pixels(one) - _pixels(batched[1]["images"][1])).max() <= 1
    assert "Seed: 13," in _png(batched[1]["images"][1]).text["parameters"]


def test_generate_png_format_and_random_seed(server):
    r = _generate(server, response_format="png", seed=7)
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    image = Image.open(io.BytesIO(r.content))
    assert image.size == (32, 32) and "Seed: 7" in image.text["parameters"]
    seeds = {_generate(server).json()["parameters"][0]["seed"] for _ in range(2)}
    assert len(seeds) == 2  # no seed given: a random one per request, reported
    webp = _generate(server, output_format="webp", output_compression=80, seed=7).json()
    assert webp["output_format"] == "webp" and webp["parameters"][0]["seed"] == 7
    decoded = Image.open(io.BytesIO(base64.b64decode(webp["images"][0])))
    assert decoded.format == "WEBP" and decoded.size == (32, 32)


def test_prompts_are_read_with_a1111s_emphasis_on_every_api(server):
    def image(path, prompt, **extra):
        if path == "/v1/generate":
            r = _generate(server, prompt=prompt, seed=3, **extra)
            assert r.status_code == 200, r.text
            return _pixels(r.json()["images"][0])
        body = {"prompt": prompt, "steps": 2, "width": 32, "height": 32, "seed": 3, "sampler_name": "DDIM"}
        r = httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        return _pixels(r.json()["images"][0])

    for path in ("/v1/generate", "/sdapi/v1/txt2img"):
        plain = image(path, "a red cube")
        assert np.array_equal(image(path, "a (red:1.0) cube"), plain)  # emphasis of 1 is no emphasis
        assert not np.array_equal(image(path, "a (red:1.6) cube"), plain)
    literal = image("/v1/generate", "a (red:1.6) cube", prompt_syntax="none")
    assert not np.array_equal(literal, image("/v1/generate", "a (red:1.6) cube"))
    r = _generate(server, prompt="a (red:1.2.3) cube")
    assert r.status_code == 400 and "1.2.3" in r.json()["error"]["message"]


@pytest.mark.parametrize("path, body, status, words", [
    ("/v1/images/generations", {"prompt": "x", "size": "64"}, 400, "WIDTHxHEIGHT"),
    ("/v1/images/generations", {"prompt": "x", "size": "60x60"}, 400, "multiple of 8"),
    ("/v1/images/generations", {"prompt": "x", "response_format": "url"}, 400, "b64_json"),
    ("/v1/images/generations", {"prompt": "x", "model": "dall-e-3"}, 404, "dall-e-3"),
    ("/v1/generate", {"prompt": "x", "n": 5}, 400, "n must be"),
    ("/v1/generate", {"prompt": "x", "steps": 0}, 400, "steps"),
    ("/v1/generate", {"prompt": "x", "steps": 151}, 400, "steps"),
    ("/v1/generate", {"prompt": "x", "width": 4096}, 400, "width"),
    ("/v1/generate", {"prompt": "x" * 4001}, 400, "prompt"),
    ("/v1/generate", {"prompt": "x", "model": "nope"}, 404, "nope"),
    ("/v1/generate", {"prompt": "x", "image": "not base64!"}, 400, "base64"),
    ("/v1/generate", {"prompt": "x", "image": base64.b64encode(b"not a png").decode()}, 400, "image"),
    ("/v1/generate", {"prompt": "x", "scheduler": "bogus"}, 400, "scheduler"),
    ("/v1/images/generations", {"prompt": "x", "scheduler": "bogus"}, 400, "scheduler"),
    ("/v1/generate", {"prompt": "x", "preset": "nope"}, 400, "preset"),
    ("/v1/generate", {"prompt": "x", "timestep_spacing": "odd"}, 400, "timestep_spacing"),
    ("/v1/generate", {"prompt": "x", "guidance": -1}, 400, "guidance"),
    ("/v1/generate", {"prompt": "x", "seed": -3}, 400, "seed"),
    ("/v1/generate", {"prompt": "x", "seed": 2**63 - 2, "n": 2}, 400, "for 2 images"),
    ("/v1/images/generations", {"prompt": "x", "seed": 2**63 - 3, "n": 3}, 400, "for 3 images"),
    ("/v1/generate", {"prompt": "x", "stepz": 2}, 422, "stepz"),
    ("/v1/generate", {"n": 1}, 422, "prompt"),
    ("/v1/generate", {"prompt": "x", "n": "two"}, 422, "n"),
    ("/v1/generate", {"prompt": "x", "response_format": "png", "output_format": "jpeg"}, 400, "b64_json"),
    ("/v1/generate", {"prompt": "x", "output_format": "gif"}, 422, "output_format"),
    ("/v1/images/generations", {"prompt": "x", "output_compression": 101}, 422, "output_compression"),
    ("/v1/generate", {"prompt": "x", "response_format": "png", "n": 2}, 400, "n = 1"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "enable_hr": True, "hr_upscaler": "ESRGAN_4x"}, 400, "hr_upscaler"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "sampler_name": "Nope Sampler"}, 400, "scheduler"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "override_settings": {"sd_model_checkpoint": "other"}}, 404, "other"),
    ("/sdapi/v1/img2img", {"prompt": "x", "init_images": []}, 400, "one image"),
    ("/nowhere", {"prompt": "x"}, 404, "Not Found"),
])
def test_bad_requests_are_4xx_json(server, path, body, status, words):
    r = httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["type"]


def test_bad_json_and_too_large_bodies(server):
    r = httpx.post(f"{server.url}/v1/generate", content=b"{not json", headers={**AUTH, "Content-Type":
                                                                                "application/json"})
    assert r.status_code == 422 and r.json()["error"]["message"]
    big = {"prompt": "x", "image": "A" * (3 * 2**20)}
    r = httpx.post(f"{server.url}/v1/generate", json=big, headers=AUTH, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"prompt": "x", "image": "'
        for _ in range(3):
            yield b"A" * 2**20
        yield b'"}'

    r = httpx.post(f"{server.url}/v1/generate", content=chunks(), headers={**AUTH, "Content-Type":
                                                                             "application/json"}, timeout=60)
    assert r.status_code == 413, r.text


def test_metrics(server):
    _generate(server, seed=1)
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    assert 'sdaccel_requests_total{endpoint="/v1/generate",status="200"}' in text
    assert 'sdaccel_requests_total{endpoint="/v1/generate",status="400"}' in text
    assert "sdaccel_queue_depth 0.0" in text
    for name in ('sdaccel_batch_images_bucket{le="1.0",model="tiny"}', 'stage="denoise"', 'stage="decode"',
                 'stage="text"', 'stage="total"', 'sdaccel_images_total{model="tiny"}'):
        assert name in text, name


# ---------------------------------------------------------------------------------- overload, cancellation


@pytest.fixture(scope="module")
def small_server():
    s = _Server({"tiny": MODEL}, max_batch=1, batch_window_ms=0, max_queue=1)
    yield s
    s.close()


@pytest.mark.slow
def test_overload_is_429_and_a_gone_client_has_its_job_dropped(small_server):
    s = small_server
    slow = {}

    def run_slow():
        slow["response"] = httpx.post(f"{s.url}/v1/generate", timeout=120, json={
            "prompt": "slow", "steps": 150, "width": 64, "height": 64, "scheduler": "ddim"})

    thread = threading.Thread(target=run_slow)
    thread.start()
    wait_for(lambda: s.worker.busy(), "the slow job to start")

    def run_impatient():  # queued behind the slow job; its client gives up after 0.5 s
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{s.url}/v1/generate", json={"prompt": "gone", "steps": 2, "width": 32, "height": 32},
                       timeout=httpx.Timeout(60, read=0.5))

    impatient = threading.Thread(target=run_impatient)
    impatient.start()
    wait_for(lambda: s.worker.queue_depth() == 1, "the second job to queue")
    for _ in range(3):
        r = httpx.post(f"{s.url}/v1/generate", json={"prompt": "more", "steps": 2, "width": 32, "height": 32})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    impatient.join(30)
    thread.join(120)
    assert slow["response"].status_code == 200
    wait_for(lambda: 'sdaccel_jobs_dropped_total{reason="cancelled"} 1.0' in httpx.get(f"{s.url}/metrics").text,
          "the gone client's job to be dropped")
    text = httpx.get(f"{s.url}/metrics").text
    assert 'sdaccel_requests_total{endpoint="/v1/generate",status="429"} 3.0' in text
    assert 'sdaccel_requests_total{endpoint="/v1/generate",status="499"} 1.0' in text
    assert 'sdaccel_images_total{model="tiny"} 1.0' in text  # the dropped job never ran


@pytest.mark.slow
def test_loadtest_overload_probes_a_full_server(small_server):
    from sdaccel.serve.loadtest import overload

    # A job runs (150 steps), at most one waits, the rest of the burst is refused. Then the probes: one that finds
    # the queue free is accepted and fills it, so at most one of them is not refused.
    payload = dict(steps=150, width=64, height=64, scheduler="ddim")
    found = asyncio.run(overload(small_server.url, payload, 4, probes=3))
    assert found.burst_429 >= 2 and len(found.burst_429_s) == found.burst_429
    assert found.probe_429 >= 2 and all(0 < t < 30 for t in found.probe_429_s)


@pytest.mark.slow
def test_a_job_past_its_deadline_is_503(small_server):
    s = small_server
    app = create_app(s.worker, request_timeout_s=0.3, metrics=s.metrics, stop_worker_on_shutdown=False)
    thread = threading.Thread(target=lambda: httpx.post(f"{s.url}/v1/generate", timeout=120, json={
        "prompt": "slow", "steps": 150, "width": 64, "height": 64}))
    thread.start()
    wait_for(lambda: s.worker.busy(), "the slow job to start")

    async def late():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            return await client.post("/v1/generate", json={"prompt": "late", "steps": 2, "width": 32, "height": 32})

    r = asyncio.run(late())
    thread.join(120)
    assert r.status_code == 503 and "deadline" in r.json()["error"]["message"]
    assert 'sdaccel_jobs_dropped_total{reason="deadline"} 1.0' in httpx.get(f"{s.url}/metrics").text


# ------------------------------------------------------------------------------------------ the command


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests(tmp_path):
    # The job finishes well within the shutdown timeout, however busy the CPU (and is not refused by its estimate).
    with serve_process(tmp_path, "--model", MODEL, "--device", "cpu", "--engine", "eager", "--max-job-seconds", "0",
                       "--shutdown-timeout", "300") as served:
        result = {}
        thread = threading.Thread(target=lambda: result.update(r=httpx.post(
            f"{served.url}/v1/generate", json={"prompt": "x", "steps": 150, "width": 64, "height": 64},
            timeout=120)))
        thread.start()
        wait_for(lambda: httpx.get(f"{served.url}/sdapi/v1/progress").json()["state"]["job_count"] > 0,
              "the job to start")
        served.proc.send_signal(signal.SIGTERM)
        thread.join(120)
        assert result["r"].status_code == 200 and len(result["r"].json()["images"]) == 1
        assert served.proc.wait(60) == 0, served.log.read_text()
        lines = [json.loads(line) for line in served.log.read_text().splitlines() if line.startswith("{")]
        assert {"method": "POST", "path": "/v1/generate", "status": 200, "images": 1}.items() <= \
            next(line for line in lines if line["path"] == "/v1/generate").items()


def test_non_loopback_host_needs_an_api_key():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SDACCEL_API_KEY", None)
    proc = subprocess.run([sys.executable, "-m", "sdaccel", "serve", "--host", "0.0.0.0"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "API key" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_loadtest_payload_carries_the_request_settings():
    from types import SimpleNamespace

    from sdaccel.errors import UsageError
    from sdaccel.serve.loadtest import _payload

    def args(**kw):
        return SimpleNamespace(**dict(dict(steps=None, size=None, model=None, output_format=None,
                                           output_compression=None), **kw))

    assert _payload(args(steps=20, size="512x768", output_format="jpeg", output_compression=90)) == dict(
        n=1, steps=20, width=512, height=768, output_format="jpeg", output_compression=90)
    for bad in (args(output_compression=90), args(output_format="jpeg", output_compression=101),
                args(size="512")):
        with pytest.raises(UsageError):
            _payload(bad)


def test_parse_warm_and_models():
    from sdaccel.cli.serve import parse_models, parse_warm
    from sdaccel.errors import SdaccelError

    assert parse_warm(["512x768:1,2,4", "64x64"]) == ((512, 768, 1), (512, 768, 2), (512, 768, 4), (64, 64, 1))
    assert parse_models(["a=synthetic:sd15-tiny", "synthetic:sd21-tiny"], "d") == {
        "a": "synthetic:sd15-tiny", "synthetic:sd21-tiny": "synthetic:sd21-tiny"}
    assert parse_models([], "synthetic:sd15-tiny") == {"synthetic:sd15-tiny": "synthetic:sd15-tiny"}
    for bad in ("512:1", "500x512:1", "512x512:0"):
        with pytest.raises(SdaccelError):
            parse_warm([bad])


def test_the_page_is_served_without_the_key(server):
    response = httpx.get(f"{server.url}/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert 'id="form"' in response.text and "/v1/generate" in response.text


def test_loadtest_reports_what_the_clients_got(server):
    from sdaccel.serve.loadtest import overload, run_load

    payload = dict(steps=2, width=32, height=32, scheduler="ddim")
    result = asyncio.run(run_load(server.url, clients=3, requests=6, duration_s=120, payload=payload, api_key=KEY,
                                  warmup=1))
    assert result.ok == 6 and result.images == 6 and not result.errors
    assert result.latency_p50_s is not None and result.latency_p50_s <= result.latency_p99_s
    assert result.images_per_min > 0 and result.mean_batch_images >= 1
    assert result.memory_start["host_rss_bytes"] > 0 and "host_rss_bytes" in result.memory_growth()
    found = asyncio.run(overload(server.url, payload, 0, KEY))
    assert found.burst_429 == 0 and found.probe_429 == 0  # nothing sent: no queue filled, no probe


@pytest.mark.slow
def test_loadtest_command_serves_measures_and_drains(tmp_path):
    out = tmp_path / "load.json"
    done = subprocess.run(
        [sys.executable, "-m", "sdaccel", "loadtest", "--serve", f"--model {MODEL} --engine eager --device cpu",
         "--clients", "2", "--requests", "4", "--steps", "2", "--size", "32x32", "--overload", "6", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["load"]["ok"] == 4 and report["load"]["images"] == 4
    assert "| clients |" in done.stdout
