"""ControlNet units on the server: A1111's `alwayson_scripts.controlnet.args` (webuiapi's ControlNetUnit) and
/v1/generate's `controlnet`, each image the one sdaccel's own ControlNet call gives; the extension's resize modes and
canny preprocessor; several ControlNets; what is refused; /controlnet/model_list and module_list."""

from __future__ import annotations

import base64
import functools
import io
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from inprocess_server import InProcessServer  # noqa: E402
from PIL import Image  # noqa: E402

from sdaccel.errors import UsageError  # noqa: E402
from sdaccel.serve import a1111_controlnet  # noqa: E402
from sdaccel.serve.controlnets import controlnet_plan, parse_controlnets  # noqa: E402

MODEL = "synthetic:sd15-tiny"
NET = "synthetic:controlnet-sd15-tiny"
SETTINGS = dict(steps=3, scheduler="ddim", height=32, width=32)
A, B, C, D = (200, 0, 0), (0, 200, 0), (0, 0, 200), (200, 0, 0)  # the stripes' colours (A = D: the fill's median)


@functools.lru_cache(maxsize=4)
def _pipe(controlnets: tuple = ()):
    import sdaccel

    return sdaccel.load(MODEL, engine="eager", device="cpu", controlnet=list(controlnets) or None)


def _loader(ref, controlnet=None, **kwargs):
    return _pipe(tuple(controlnet or ()))


@pytest.fixture(scope="module")
def other_net(tmp_path_factory):
    """A diffusers ControlNet folder of the same architecture with other weights."""
    from sdaccel.models.controlnet import build_synthetic_controlnet

    folder = tmp_path_factory.mktemp("cn") / "control_other"
    build_synthetic_controlnet("controlnet-sd15-tiny", seed=5).save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def server():
    s = InProcessServer({"tiny": MODEL}, controlnets={"edges": NET}, loader=_loader, max_batch=8,
                        batch_window_ms=400, max_queue=16)
    yield s
    s.close()


def reference(prompt: str, seed: int, nets: tuple = (NET,), **control) -> np.ndarray:
    """sdaccel's own ControlNet call on the same model and seed, as the worker calls it for one job."""
    settings = dict(SETTINGS, **{k: v for k, v in control.items() if k in ("height", "width")})
    control = {k: v for k, v in control.items() if k not in ("height", "width")}
    return _pixels(_pipe(nets)([prompt], [""], seeds=[seed], **settings, **control).images[0])


def _pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def _b64(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _decoded(b64: str) -> np.ndarray:
    return _pixels(Image.open(io.BytesIO(base64.b64decode(b64))))


def _control_image(size=(32, 32), seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _stripes() -> Image.Image:
    """64x32: four 16-pixel vertical stripes A, B, C, D."""
    pixels = np.zeros((32, 64, 3), np.uint8)
    for k, colour in enumerate((A, B, C, D)):
        pixels[:, 16 * k:16 * (k + 1)] = colour
    return Image.fromarray(pixels)


def _columns(size, *runs) -> Image.Image:
    """An image of `size` made of vertical runs (width, colour), left to right, over rows [top, bottom) of each."""
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    x = 0
    for width, colour, top, bottom in runs:
        pixels[top:bottom, x:x + width] = colour
        x += width
    return Image.fromarray(pixels)


def txt2img(server, units, **body):
    body = {"prompt": "a house", "steps": 3, "sampler_name": "DDIM", "width": 32, "height": 32, "seed": 4,
            "alwayson_scripts": {"controlnet": {"args": units}}, **body}
    return httpx.post(f"{server.url}/sdapi/v1/txt2img", json=body, timeout=120)


def generate(server, **body):
    return httpx.post(f"{server.url}/v1/generate", json={**SETTINGS, "prompt": "a house", "seed": 4, **body},
                      timeout=120)


def test_the_controlnets_served_beside_the_model(server):
    assert server.worker.model_controlnets == {"tiny": ["edges"]}
    assert httpx.get(f"{server.url}/controlnet/model_list").json() == {"model_list": ["edges"]}
    modules = httpx.get(f"{server.url}/controlnet/module_list").json()
    assert modules["module_list"] == a1111_controlnet.preprocessors()
    assert set(modules["module_detail"]) == set(modules["module_list"])


def test_an_a1111_unit_equals_sdaccels_controlnet_call(server):
    image = _control_image()
    unit = {"image": _b64(image), "model": "edges [d14c016b]", "module": "none", "weight": 0.7,
            "guidance_start": 0.0, "guidance_end": 0.6, "resize_mode": "Crop and Resize", "low_vram": True}
    r = txt2img(server, [unit])
    assert r.status_code == 200, r.text
    served = _decoded(r.json()["images"][0])
    want = reference("a house", 4, control_image=image, controlnet_scale=0.7, control_start=0.0, control_end=0.6)
    assert np.abs(served - want).max() <= 1
    plain = reference("a house", 4)
    assert np.abs(served - plain).mean() > 1  # the ControlNet steered the image
    native = generate(server, controlnet=[{"model": "edges", "image": _b64(image), "scale": 0.7, "start": 0.0,
                                           "end": 0.6}])
    assert native.status_code == 200, native.text
    assert np.abs(_decoded(native.json()["images"][0]) - want).max() <= 1
    # A disabled unit, and none at all, run the model as it runs without ControlNets.
    off = txt2img(server, [dict(unit, enabled=False)])
    assert np.abs(_decoded(off.json()["images"][0]) - plain).max() <= 1


def test_without_width_and_height_units_take_the_models_size(server):
    image = _control_image(size=(32, 32), seed=5)
    r = txt2img(server, [{"image": _b64(image), "model": "edges", "resize_mode": "Just Resize"}], width=None,
                height=None)
    assert r.status_code == 200, r.text
    spec = server.worker.pipes["tiny"].spec
    resized = image.resize((spec.width, spec.height), Image.Resampling.BICUBIC)  # enlarged: bicubic
    want = reference("a house", 4, control_image=resized, height=spec.height, width=spec.width)
    assert np.abs(_decoded(r.json()["images"][0]) - want).max() <= 1


@pytest.mark.parametrize("mode, expected", [
    ("Just Resize", _columns((32, 32), (8, A, 0, 32), (8, B, 0, 32), (8, C, 0, 32), (8, D, 0, 32))),
    (1, _columns((32, 32), (16, B, 0, 32), (16, C, 0, 32))),  # crop and resize: the middle 32 columns
    # resize and fill: 32x16 in the middle rows; the rest the border pixels' median colour, A's
    ("Resize and Fill", Image.fromarray(np.where(
        (np.arange(32)[:, None, None] >= 8) & (np.arange(32)[:, None, None] < 24),
        np.asarray(_columns((32, 32), (8, A, 0, 32), (8, B, 0, 32), (8, C, 0, 32), (8, D, 0, 32))),
        np.array(A, np.uint8)).astype(np.uint8))),
])
def test_resize_modes_to_the_output_size(server, mode, expected):
    r = txt2img(server, [{"image": _b64(_stripes()), "model": "edges", "resize_mode": mode}])
    assert r.status_code == 200, r.text
    assert a1111_controlnet.resize_to(_stripes(), (32, 32), a1111_controlnet.resize_mode(mode, "m")).tobytes() \
        == expected.tobytes()
    want = reference("a house", 4, control_image=expected)
    assert np.abs(_decoded(r.json()["images"][0]) - want).max() <= 1


def test_canny_edges_as_opencv_draws_them(server):
    cv2 = pytest.importorskip("cv2")
    pixels = np.zeros((64, 64, 3), np.uint8)
    pixels[16:48, 20:44] = (255, 200, 40)
    image = Image.fromarray(pixels)
    unit = {"image": _b64(image), "model": "edges", "module": "canny", "threshold_a": 50, "threshold_b": 150,
            "processor_res": 64}
    r = txt2img(server, [unit], width=64, height=64)
    assert r.status_code == 200, r.text
    edges = Image.fromarray(cv2.Canny(pixels, 50, 150)).convert("RGB")
    assert np.asarray(edges).max() == 255  # there are edges
    want = reference("a house", 4, control_image=edges, height=64, width=64)
    assert np.abs(_decoded(r.json()["images"][0]) - want).max() <= 1


def test_canny_without_opencv_names_the_preprocessors_that_work(monkeypatch):
    monkeypatch.setattr(a1111_controlnet, "has_opencv", lambda: False)
    unit = {"image": "x", "model": "edges", "module": "canny"}
    with pytest.raises(UsageError, match=r"'canny' is not supported; supported: none \(canny needs OpenCV"):
        a1111_controlnet.read_units([unit], (32, 32), lambda data, what: _control_image())


def test_img2img_unit_without_an_image_takes_the_init_image(server):
    init = _control_image(seed=3)
    body = {"prompt": "a house", "steps": 3, "sampler_name": "DDIM", "seed": 4, "init_images": [_b64(init)],
            "denoising_strength": 0.6, "alwayson_scripts": {"ControlNet": {"args": [{"model": "edges",
                                                                                      "weight": 0.9}]}}}
    r = httpx.post(f"{server.url}/sdapi/v1/img2img", json=body, timeout=120)
    assert r.status_code == 200, r.text
    want = _pixels(_pipe((NET,))(["a house"], [""], seeds=[4], steps=3, scheduler="ddim", image=init, strength=0.6,
                                 control_image=init, controlnet_scale=0.9).images[0])
    assert np.abs(_decoded(r.json()["images"][0]) - want).max() <= 1


def test_requests_without_units_still_batch_on_a_controlnet_model(server):
    answers = {}

    def ask(k):
        answers[k] = generate(server, seed=30 + k)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [answers[k].json()["batch_images"] for k in range(2)] == [2, 2]


@pytest.mark.parametrize("unit, words", [
    ({"model": "edges", "image": "IMG", "colour": 1}, ["unknown key(s) colour"]),
    ({"model": "edges", "image": "IMG", "control_mode": "My prompt is more important"}, ["control_mode", "Balanced"]),
    ({"model": "edges", "image": "IMG", "guess_mode": True}, ["guess mode"]),
    ({"model": "edges", "image": "IMG", "module": "depth_midas"}, ["'depth_midas' is not supported", "none"]),
    ({"model": "depth", "image": "IMG"}, ["unknown ControlNet 'depth'", "edges"]),
    ({"model": "None", "image": "IMG"}, ["model: name a ControlNet"]),
    ({"model": "edges", "image": "IMG", "mask": "IMG"}, ["mask"]),
    ({"model": "edges", "image": {"image": "IMG", "mask": "IMG"}}, ["mask"]),
    ({"model": "edges", "image": "IMG", "resize_mode": "Stretch"}, ["'Stretch' is not a resize mode"]),
    ({"model": "edges", "image": "IMG", "hr_option": "Low res only"}, ["hr_option"]),
    ({"model": "edges"}, ["image: a control image is required"]),
    ({"model": "edges", "image": "IMG", "weight": "strong"}, ["weight must be a finite number"]),
    ({"model": "edges", "image": "IMG", "guidance_start": 0.8, "guidance_end": 0.4}, ["control_start"]),
])
def test_units_sdaccel_cannot_honour_are_a_400_naming_the_field(server, unit, words):
    image = _b64(_control_image())
    unit = {k: (image if v == "IMG" else {kk: image for kk in v} if isinstance(v, dict) else v)
            for k, v in unit.items()}
    r = txt2img(server, [unit])
    assert r.status_code == 400, r.text
    assert all(w in r.json()["error"]["message"] for w in words), r.json()


def test_other_scripts_are_refused_by_name(server):
    r = txt2img(server, [], alwayson_scripts={"ADetailer": {"args": [True]}, "controlnet": {"args": []}})
    assert r.status_code == 400 and "'ADetailer' not supported" in r.json()["error"]["message"]
    empty = txt2img(server, [])  # webuiapi sends ControlNet with no units when it has none
    assert empty.status_code == 200, empty.text


def test_webuiapi_controlnet_unit_end_to_end(server):
    webuiapi = pytest.importorskip("webuiapi")
    api = webuiapi.WebUIApi(host="127.0.0.1", port=server.port, sampler="DDIM", steps=3)
    image = _control_image(seed=7)
    unit = webuiapi.ControlNetUnit(image=image, module="none", model="edges [0123abcd]", weight=0.8,
                                   resize_mode="Just Resize", guidance_start=0.0, guidance_end=1.0)
    # eta: ddim's (webuiapi sends 1); a dict of its own: webuiapi writes the units into its default dict otherwise
    result = api.txt2img(prompt="a house", seed=4, width=32, height=32, cfg_scale=7.5, eta=0, alwayson_scripts={},
                         controlnet_units=[unit])
    want = reference("a house", 4, control_image=image, controlnet_scale=0.8)
    assert np.abs(_pixels(result.image) - want).max() <= 1
    assert api.controlnet_model_list() == ["edges"]


def test_several_controlnets_and_a_request_naming_one(other_net):
    s = InProcessServer({"tiny": MODEL}, controlnets={"edges": NET, "other": other_net}, loader=_loader)
    try:
        assert s.worker.model_controlnets == {"tiny": ["edges", "other"]}
        one, two = _control_image(seed=1), _control_image(seed=2)
        # Only the second: the first runs at scale 0, and the image is the second's alone.
        r = txt2img(s, [{"model": "other", "image": _b64(two), "weight": 0.8}])
        assert r.status_code == 200, r.text
        alone = reference("a house", 4, nets=(other_net,), control_image=two, controlnet_scale=0.8)
        assert np.abs(_decoded(r.json()["images"][0]) - alone).max() <= 1
        both = txt2img(s, [{"model": "other", "image": _b64(two), "weight": 0.8, "guidance_end": 0.5},
                           {"model": "edges", "image": _b64(one), "weight": 0.6}])
        want = reference("a house", 4, nets=(NET, other_net), control_image=[one, two], controlnet_scale=[0.6, 0.8],
                         control_start=[0.0, 0.0], control_end=[1.0, 0.5])
        assert np.abs(_decoded(both.json()["images"][0]) - want).max() <= 1
        assert np.abs(want - alone).mean() > 1
        twice = txt2img(s, [{"model": "other", "image": _b64(two)}, {"model": "other", "image": _b64(one)}])
        assert twice.status_code == 400 and "named by two units" in twice.json()["error"]["message"]
    finally:
        s.close()


def test_units_on_a_server_without_controlnets_are_refused():
    s = InProcessServer({"tiny": MODEL}, loader=_loader)
    try:
        r = txt2img(s, [{"model": "edges", "image": _b64(_control_image())}])
        assert r.status_code == 400 and "--controlnet" in r.json()["error"]["message"]
        assert httpx.get(f"{s.url}/controlnet/model_list").json() == {"model_list": []}
    finally:
        s.close()


def test_controlnets_go_beside_the_models_they_fit():
    plan = controlnet_plan({"sd": MODEL, "xl": "synthetic:sdxl-tiny"}, {"edges": NET})
    assert plan == {"sd": ["edges"], "xl": []}
    with pytest.raises(UsageError, match="fits none of the served models"):
        controlnet_plan({"xl": "synthetic:sdxl-tiny"}, {"edges": NET})
    assert parse_controlnets(["canny=synthetic:controlnet-sd15", "/m/control_v11p_sd15_canny.safetensors",
                              "lllyasviel/sd-controlnet-depth", "/m/cn-folder/"]) == {
        "canny": "synthetic:controlnet-sd15", "control_v11p_sd15_canny": "/m/control_v11p_sd15_canny.safetensors",
        "sd-controlnet-depth": "lllyasviel/sd-controlnet-depth", "cn-folder": "/m/cn-folder/"}
    with pytest.raises(UsageError, match="taken"):
        parse_controlnets(["a=synthetic:controlnet-sd15", "a=synthetic:controlnet-sd21"])


def test_pixel_perfect_resolution_follows_the_resize_mode():
    # A 640x480 image for a 512x512 output: covering scales its short side to 512, fitting to 384.
    assert a1111_controlnet.pixel_perfect_resolution((640, 480), (512, 512), 1) == 512
    assert a1111_controlnet.pixel_perfect_resolution((640, 480), (512, 512), 2) == 384


@pytest.mark.slow
def test_a_worker_process_loads_the_controlnets_and_merges_the_loras(tmp_path):
    """ProcessWorkers (`serve --cpu-workers`): the job's LoRA set and control image cross to the child process,
    which loads the ControlNet beside its model and merges the LoRA: the image of the same calls in this process."""
    from test_loras import attention_lora

    from sdaccel.serve.jobs import Job
    from sdaccel.serve.workers import ProcessWorkers

    lora = str(attention_lora(tmp_path / "style.safetensors", 4).resolve())
    pool = ProcessWorkers({"tiny": MODEL}, engine="eager", devices=["cpu"], controlnets={"edges": NET})
    pool.start()
    try:
        assert pool.wait_ready(300) and pool.model_controlnets == {"tiny": ["edges"]}
        image = _control_image(seed=9)
        job = Job("tiny", "a house", seed=6, loras=((lora, 0.7),),
                  settings=dict(SETTINGS, control_image=image, controlnet_scale=0.9))
        result = pool.submit(job).result(300)
    finally:
        pool.stop(drain=False, timeout=60)
    pipe = _pipe((NET,))
    pipe.set_loras({lora: 0.7})
    try:
        want = reference("a house", 6, control_image=image, controlnet_scale=0.9)
    finally:
        pipe.set_loras({})
    assert result.params[0]["loras"] == {lora: 0.7}
    assert np.abs(_pixels(result.images[0]) - want).max() <= 1
