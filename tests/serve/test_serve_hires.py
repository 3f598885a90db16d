"""Hires fix over HTTP: A1111's enable_hr fields (webuiapi's txt2img, and raw JSON) and /v1/generate's hires_* give
the image the Python API gives for the same settings (the CLI gives it too: tests/cli/test_cli_hires.py); what the
server cannot honour is a 400 naming the field; /sdapi/v1/upscalers and latent-upscale-modes list what it takes."""

from __future__ import annotations

import base64
import io
import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import numpy as np  # noqa: E402
from inprocess_server import InProcessServer  # noqa: E402
from PIL import Image  # noqa: E402

from sdaccel.serve.schemas import Limits  # noqa: E402

MODEL = "synthetic:sd15-tiny"


@pytest.fixture(scope="module")
def server():
    s = InProcessServer({"tiny": MODEL}, app_args=dict(limits=Limits(max_side=256)), batch_window_ms=300)
    yield s
    s.close()


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def decoded(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def api_image(server, **kwargs) -> Image.Image:
    """The Python API's image from the worker's own pipeline (called between requests, never beside one)."""
    return server.worker.pipes["tiny"]("a lighthouse", steps=2, height=32, width=32, **kwargs).images[0]


def txt2img(server, **fields):
    body = {"prompt": "a lighthouse", "steps": 2, "width": 32, "height": 32, "seed": 5, "enable_hr": True, **fields}
    return httpx.post(f"{server.url}/sdapi/v1/txt2img", json=body, timeout=300)


@pytest.mark.parametrize("fields, hires", [
    (dict(hr_scale=2, hr_second_pass_steps=1, denoising_strength=0.6),
     dict(hires_scale=2, hires_steps=1, hires_strength=0.6)),
    (dict(hr_upscaler="Lanczos", hr_resize_x=48, hr_resize_y=0, hr_sampler_name="DDIM"),
     dict(hires_size=(48, 0), hires_upscaler="Lanczos", hires_strength=0.75, hires_scheduler="ddim")),
])
def test_enable_hr_answers_the_apis_image(server, fields, hires):
    r = txt2img(server, **fields)
    assert r.status_code == 200, r.text
    (image,) = r.json()["images"]
    expected = api_image(server, seed=5, **hires)
    assert np.array_equal(pixels(decoded(image)), pixels(expected))
    info = json.loads(r.json()["info"])
    assert (info["width"], info["height"]) == (32, 32) and info["denoising_strength"] == hires["hires_strength"]
    assert "Hires upscaler: " in info["infotexts"][0] and "Size: 32x32" in info["infotexts"][0]


def test_webuiapi_hires_fix_batch_gives_each_seeds_image(server):
    webuiapi = pytest.importorskip("webuiapi")
    api = webuiapi.WebUIApi(host="127.0.0.1", port=server.port)
    result = api.txt2img(prompt="a lighthouse", seed=7, steps=2, width=32, height=32, batch_size=2, enable_hr=True,
                         hr_scale=1.5, hr_second_pass_steps=1, denoising_strength=0.5, sampler_name="Euler")
    assert [im.size for im in result.images] == [(48, 48), (48, 48)] and result.info["all_seeds"] == [7, 8]
    assert "Hires upscale: 1.5, Hires steps: 1, Hires upscaler: Latent" in result.images[1].info["parameters"]
    alone = api_image(server, seed=8, scheduler="euler", guidance=7.0, hires_scale=1.5, hires_steps=1,
                      hires_strength=0.5)
    # The batch of two computes both images in one call: equal to the image alone up to the batch's rounding.
    assert np.abs(pixels(result.images[1]).astype(int) - pixels(alone).astype(int)).max() <= 1


def test_v1_generate_takes_the_hires_keywords(server):
    body = {"prompt": "a lighthouse", "steps": 2, "width": 32, "height": 32, "seed": 9, "hires_scale": 2,
            "hires_upscaler": "Latent (bicubic)", "hires_steps": 1}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    (image,), (params,) = r.json()["images"], r.json()["parameters"]
    expected = api_image(server, seed=9, hires_scale=2, hires_upscaler="Latent (bicubic)", hires_steps=1)
    assert np.array_equal(pixels(decoded(image)), pixels(expected))
    assert params["hires_upscaler"] == "Latent (bicubic)" and (params["hires_width"], params["width"]) == (64, 32)


@pytest.mark.parametrize("fields, words", [
    (dict(hr_upscaler="R-ESRGAN 4x+"), "hr_upscaler 'R-ESRGAN 4x+' is not supported; supported: Latent, "),
    (dict(hr_upscaler="SwinIR_4x"), "hr_upscaler 'SwinIR_4x' is not supported"),
    (dict(hr_checkpoint_name="another.safetensors"), "hr_checkpoint_name 'another.safetensors': a second checkpoint"),
    (dict(hr_scale=0), "hr_scale must be a number > 0"),
    (dict(denoising_strength=0), "denoising_strength must be a number in (0, 1]"),
    (dict(hr_resize_x=-8), "hr_resize_x must be >= 0"),
    (dict(hr_scale=16), "the target 512x512 is over this server's limit of 256 pixels a side"),
    (dict(hr_second_pass_steps=500), "hires steps must be at most 150"),
    (dict(hr_prompt="<lora:x:1> a tower"), "hr_prompt: <lora:...> tags in the hires prompt are not supported"),
    (dict(hr_sampler_name="Nope Sampler"), "hr_sampler_name / hr_scheduler: "),
])
def test_what_hires_fix_cannot_honour_is_a_400_naming_it(server, fields, words):
    r = txt2img(server, **fields)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_hr_fields_without_enable_hr_change_nothing_as_in_a1111(server):
    plain = txt2img(server, enable_hr=False)
    with_fields = txt2img(server, enable_hr=False, hr_scale=4, hr_upscaler="R-ESRGAN 4x+", denoising_strength=0.3)
    assert plain.status_code == with_fields.status_code == 200, with_fields.text
    assert plain.json()["images"] == with_fields.json()["images"]


def test_img2img_has_no_hires_fix(server):
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (10, 200, 30)).save(buffer, format="PNG")
    body = {"prompt": "x", "steps": 2, "init_images": [base64.b64encode(buffer.getvalue()).decode()],
            "enable_hr": True}
    r = httpx.post(f"{server.url}/sdapi/v1/img2img", json=body, timeout=120)
    assert r.status_code == 400 and "enable_hr: hires fix is txt2img's" in r.json()["error"]["message"]


def test_v1_generate_refuses_bad_hires_settings_by_name(server):
    for body, words in ((dict(hires_scale=2, hires_upscaler="SwinIR"), "hires_upscaler 'SwinIR' is not supported"),
                        (dict(hires_size=[512, 0]), "the target 512x512 is over this server's limit"),
                        (dict(hires_steps=2), "hires_steps needs hires_scale or hires_size")):
        r = httpx.post(f"{server.url}/v1/generate", json={"prompt": "x", "steps": 2, "width": 32, "height": 32,
                                                          **body}, timeout=120)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_upscaler_lists_in_a1111s_shape(server):
    upscalers = httpx.get(f"{server.url}/sdapi/v1/upscalers").json()
    assert [u["name"] for u in upscalers] == ["None", "Lanczos", "Nearest"]
    assert set(upscalers[0]) == {"name", "model_name", "model_path", "model_url", "scale"}
    modes = httpx.get(f"{server.url}/sdapi/v1/latent-upscale-modes").json()
    assert modes[0] == {"name": "Latent"} and {"name": "Latent (nearest-exact)"} in modes and len(modes) == 6
