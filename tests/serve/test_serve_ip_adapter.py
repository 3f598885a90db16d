"""IP-Adapter image prompts on the server: `sdaccel serve --ip-adapter NAME=REF`, /v1/generate's `ip_adapter` units
and the ControlNet extension's IP-Adapter units in A1111's alwayson_scripts, each image the one sdaccel's own
IP-Adapter call gives; batching only jobs with the same image prompts; what is refused."""

from __future__ import annotations

import base64
import functools
import io
import json
import pickle
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from inprocess_server import InProcessServer  # noqa: E402
from PIL import Image  # noqa: E402

from sdaccel.errors import UsageError  # noqa: E402
from sdaccel.serve.a1111_ip_adapter import CLIP_MODULES  # noqa: E402
from sdaccel.serve.ip_adapters import PromptImages, ip_adapter_plan, parse_ip_adapters  # noqa: E402

MODEL = "synthetic:sd15-tiny"
STYLE = "synthetic:ip-adapter-sd15-tiny"
PLUS = "synthetic:ip-adapter-plus-sd15-tiny"
SETTINGS = dict(steps=2, scheduler="ddim", height=32, width=32)


@functools.lru_cache(maxsize=4)
def _pipe(adapters: tuple = ()):
    import sdaccel

    return sdaccel.load(MODEL, engine="eager", device="cpu", ip_adapter=list(adapters) or None)


def _loader(ref, ip_adapter=None, **kwargs):
    return _pipe(tuple(ip_adapter or ()))


@pytest.fixture(scope="module")
def server():
    s = InProcessServer({"tiny": MODEL}, ip_adapters={"style": STYLE}, loader=_loader, max_batch=8,
                        batch_window_ms=400, max_queue=16)
    yield s
    s.close()


def reference(prompt: str, seed: int, adapters: tuple = (STYLE,), **prompts) -> np.ndarray:
    """sdaccel's own call on the same model and seed, as the worker calls it for one job."""
    return _pixels(_pipe(adapters)([prompt], [""], seeds=[seed], **SETTINGS, **prompts).images[0])


def _pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def _picture(seed: int, size=(40, 48)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _b64(image: Image.Image, fmt="PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


def _decoded(b64: str) -> np.ndarray:
    return _pixels(Image.open(io.BytesIO(base64.b64decode(b64))))


def generate(server, **body):
    return httpx.post(f"{server.url}/v1/generate", json={**SETTINGS, "prompt": "a house", "seed": 4, **body},
                      timeout=120)


def test_an_image_prompt_steers_the_image_as_sdaccels_call_does(server):
    image = _picture(1)
    r = generate(server, ip_adapter=[{"name": "style", "image": _b64(image), "scale": 0.7}])
    assert r.status_code == 200, r.text
    served = _decoded(r.json()["images"][0])
    want = reference("a house", 4, ip_adapter_image=image, ip_adapter_scale=0.7)
    assert np.abs(served - want).max() <= 1
    assert r.json()["parameters"][0]["ip_adapters"] == {STYLE: 0.7}
    plain = generate(server)  # the same pipeline without an image prompt: the model alone
    assert "ip_adapters" not in plain.json()["parameters"][0]
    assert np.abs(_decoded(plain.json()["images"][0]) - reference("a house", 4)).max() <= 1
    assert np.abs(served - _decoded(plain.json()["images"][0])).mean() > 1
    again = generate(server, ip_adapter=[{"name": "style", "image": _b64(image), "scale": 0.7}])
    assert np.array_equal(_decoded(again.json()["images"][0]), served)
    jpeg = generate(server, ip_adapter=[{"name": "style", "image": _b64(image, "JPEG")}])  # scale 1 by default
    assert jpeg.status_code == 200 and jpeg.json()["parameters"][0]["ip_adapters"] == {STYLE: 1.0}


@pytest.mark.parametrize("units, status, words", [
    ([{"name": "sketch", "image": "IMG"}], 400, ["unknown IP-Adapter 'sketch'", "style"]),
    ([{"name": "style", "image": "IMG"}, {"name": "style", "image": "IMG"}], 400, ["'style' is named by two units"]),
    ([{"name": "style", "image": "not base64!"}], 400, ["ip_adapter[0].image: not valid base64"]),
    ([{"name": "style", "image": base64.b64encode(b"no image").decode()}], 400, ["ip_adapter[0].image: not an image"]),
    ([{"name": "style", "image": "IMG", "scale": 1e9}], 400, ["ip_adapter[0].scale", "-10 to 10"]),
    ([{"name": "style", "image": "IMG", "scale": "NaN"}], 422, ["scale"]),  # a string, as every number field
    ([{"name": "style", "image": "IMG", "scale": True}], 422, ["scale"]),
    ([{"name": "style", "image": "IMG", "weight": 1}], 422, ["weight"]),
])
def test_bad_units_are_refused_naming_the_field(server, units, status, words):
    image = _b64(_picture(2))
    units = [{k: image if v == "IMG" else v for k, v in unit.items()} for unit in units]
    r = generate(server, ip_adapter=units)
    assert r.status_code == status, r.text
    assert all(w in r.json()["error"]["message"] for w in words), r.json()


def test_a_nan_scale_is_refused(server):
    # Python's JSON reader takes the NaN literal: the scale is then a float, refused as not finite.
    body = json.dumps({**SETTINGS, "prompt": "a house", "ip_adapter": [
        {"name": "style", "image": _b64(_picture(2)), "scale": float("nan")}]})
    assert "NaN" in body
    r = httpx.post(f"{server.url}/v1/generate", content=body, headers={"content-type": "application/json"},
                   timeout=120)
    assert r.status_code == 400 and "ip_adapter[0].scale" in r.json()["error"]["message"], r.text


def test_an_image_over_the_size_limit_is_refused_before_it_loads(server):
    big = Image.new("RGB", (8193, 1), 0)
    r = generate(server, ip_adapter=[{"name": "style", "image": _b64(big)}])
    assert r.status_code == 400 and "larger than" in r.json()["error"]["message"], r.text


def _queued_together(server, bodies: list[dict]) -> list:
    """The answers to `bodies`, sent at once while the worker's running call is held at its first step, so that all
    of them wait in its queue together and each call it makes next takes every queued job its batch key admits."""
    import time

    answers: dict[int, httpx.Response] = {}
    send = lambda k, body: answers.__setitem__(k, generate(server, **body))  # noqa: E731
    gate, progress = threading.Event(), server.worker.progress
    step = progress.step

    def held(*args, **kwargs):
        gate.wait(60)
        return step(*args, **kwargs)

    progress.step = held  # the worker passes progress.step as each call's callback
    threads = [threading.Thread(target=send, args=(-1, dict(steps=3, seed=1)))]
    try:
        threads[0].start()
        deadline = time.monotonic() + 60
        while not server.worker.busy():
            assert time.monotonic() < deadline, "the holding call did not start"
            time.sleep(0.01)
        threads += [threading.Thread(target=send, args=(k, body)) for k, body in enumerate(bodies)]
        for t in threads[1:]:
            t.start()
        while server.worker.queue_depth() < len(bodies):
            assert time.monotonic() < deadline, "the requests did not reach the queue"
            time.sleep(0.01)
    finally:
        progress.step = step
        gate.set()
    for t in threads:
        t.join(120)
    assert all(a.status_code == 200 for a in answers.values()), [a.text for a in answers.values()]
    return [answers[k].json() for k in range(len(bodies))]


def test_concurrent_requests_with_other_image_prompts_never_share_a_call(server):
    one, two = _picture(3), _picture(4)
    bodies = [dict(seed=10, ip_adapter=[{"name": "style", "image": _b64(one), "scale": 0.9}]),
              dict(seed=10, ip_adapter=[{"name": "style", "image": _b64(two), "scale": 0.9}]),
              dict(seed=10, ip_adapter=[{"name": "style", "image": _b64(one), "scale": 0.4}]),
              dict(seed=10)]
    answers = _queued_together(server, bodies)
    assert [a["batch_images"] for a in answers] == [1, 1, 1, 1]
    # Each the image it gets alone, one request at a time.
    for body, answer in zip(bodies, answers):
        alone = generate(server, **body).json()
        assert np.abs(_decoded(answer["images"][0]) - _decoded(alone["images"][0])).max() <= 1
    assert np.abs(_decoded(answers[0]["images"][0]) - _decoded(answers[1]["images"][0])).mean() > 1


def test_concurrent_requests_with_the_same_image_prompt_share_a_call(server):
    image = _picture(5)
    unit = [{"name": "style", "image": _b64(image), "scale": 0.8}]
    answers = _queued_together(server, [dict(seed=20, ip_adapter=unit), dict(seed=21, ip_adapter=unit)])
    assert [a["batch_images"] for a in answers] == [2, 2]
    for seed, answer in zip((20, 21), answers):
        want = reference("a house", seed, ip_adapter_image=image, ip_adapter_scale=0.8)
        assert np.abs(_decoded(answer["images"][0]) - want).max() <= 1


def test_image_prompts_are_keyed_by_their_pixels_and_cross_processes():
    one, two = _picture(6), _picture(6)
    assert one is not two and repr(PromptImages([one])) == repr(PromptImages([two]))
    assert repr(PromptImages([one])) != repr(PromptImages([_picture(7)]))
    copy = pickle.loads(pickle.dumps(PromptImages([one])))
    assert isinstance(copy, PromptImages) and repr(copy) == repr(PromptImages([one]))
    assert np.array_equal(np.asarray(copy[0]), np.asarray(one))


def a1111(server, units, path="txt2img", **body):
    body = {"prompt": "a house", "steps": 2, "sampler_name": "DDIM", "width": 32, "height": 32, "seed": 4,
            "alwayson_scripts": {"controlnet": {"args": units}}, **body}
    return httpx.post(f"{server.url}/sdapi/v1/{path}", json=body, timeout=120)


def test_an_a1111_ip_adapter_unit_is_the_image_prompt(server):
    image = _picture(8)
    # as webuiapi's ControlNetUnit sends one
    unit = {"image": _b64(image), "mask": None, "module": "ip-adapter_clip_sd15", "model": "style [6a3f6166]",
            "weight": 0.6, "resize_mode": "Crop and Resize", "low_vram": False, "processor_res": 512,
            "threshold_a": 64, "threshold_b": 64, "guidance_start": 0.0, "guidance_end": 1.0,
            "control_mode": 0, "pixel_perfect": False}
    r = a1111(server, [unit])
    assert r.status_code == 200, r.text
    want = reference("a house", 4, ip_adapter_image=image, ip_adapter_scale=0.6)
    assert np.abs(_decoded(r.json()["images"][0]) - want).max() <= 1
    assert np.abs(want - reference("a house", 4)).mean() > 1
    lists = httpx.get(f"{server.url}/controlnet/model_list").json(), \
        httpx.get(f"{server.url}/controlnet/module_list").json()
    assert lists[0] == {"model_list": ["style"]}
    assert set(CLIP_MODULES) <= set(lists[1]["module_list"]) and set(CLIP_MODULES) <= set(lists[1]["module_detail"])


@pytest.mark.parametrize("change, words", [
    ({"guidance_end": 0.5}, ["args[0].guidance_end", "only 1"]),
    ({"pixel_perfect": True}, ["args[0].pixel_perfect"]),
    ({"resize_mode": "Just Resize"}, ["args[0].resize_mode", "Crop and Resize"]),
    ({"control_mode": "ControlNet is more important"}, ["args[0].control_mode"]),
    ({"module": "ip-adapter_face_id"}, ["args[0].module", "ip-adapter_face_id"]),
    ({"model": "ip-adapter_sd15 [6a3f6166]"}, ["unknown IP-Adapter 'ip-adapter_sd15 [6a3f6166]'", "style"]),
    ({"weight": True}, ["args[0].weight"]),
    ({"image": None}, ["image"]),
])
def test_a1111_ip_adapter_fields_sdaccel_cannot_honour_are_refused(server, change, words):
    unit = {"image": _b64(_picture(8)), "module": "ip-adapter_clip_h", "model": "style", **change}
    r = a1111(server, [unit])
    assert r.status_code == 400, r.text
    assert all(w in r.json()["error"]["message"] for w in words), r.json()


def test_adapters_no_request_names_run_at_scale_zero():
    """Two adapters served, a request naming the first: the second (Plus) adds nothing, the image is the first's
    alone (the same weights: each synthetic adapter is seeded by its place)."""
    s = InProcessServer({"tiny": MODEL}, ip_adapters={"style": STYLE, "plus": PLUS}, loader=_loader)
    try:
        assert s.worker.model_ip_adapters == {"tiny": ["style", "plus"]}
        image = _picture(9)
        r = generate(s, ip_adapter=[{"name": "style", "image": _b64(image), "scale": 0.8}])
        assert r.status_code == 200, r.text
        assert r.json()["parameters"][0]["ip_adapters"] == {STYLE: 0.8, PLUS: 0.0}
        alone = reference("a house", 4, ip_adapter_image=image, ip_adapter_scale=0.8)
        assert np.abs(_decoded(r.json()["images"][0]) - alone).max() <= 1
        both = generate(s, ip_adapter=[{"name": "plus", "image": _b64(_picture(10)), "scale": 0.5},
                                       {"name": "style", "image": _b64(image), "scale": 0.8}])
        want = reference("a house", 4, adapters=(STYLE, PLUS), ip_adapter_image=[image, _picture(10)],
                         ip_adapter_scale=[0.8, 0.5])
        assert np.abs(_decoded(both.json()["images"][0]) - want).max() <= 1
        assert np.abs(want - alone).mean() > 1
    finally:
        s.close()


def test_image_prompts_on_a_server_without_ip_adapters_are_refused():
    s = InProcessServer({"tiny": MODEL}, loader=_loader)
    try:
        r = generate(s, ip_adapter=[{"name": "style", "image": _b64(_picture(1))}])
        assert r.status_code == 400 and "--ip-adapter" in r.json()["error"]["message"], r.text
        unit = {"image": _b64(_picture(1)), "module": "ip-adapter_clip_sd15", "model": "ip-adapter_sd15 [6a3f6166]"}
        r = a1111(s, [unit])
        assert r.status_code == 400 and "--ip-adapter" in r.json()["error"]["message"], r.text
        assert httpx.get(f"{s.url}/controlnet/module_list").json()["module_list"][0] == "none"
        assert "ip-adapter_clip_h" not in httpx.get(f"{s.url}/controlnet/module_list").json()["module_list"]
    finally:
        s.close()


def test_ip_adapters_go_beside_the_models_they_fit(tmp_path):
    assert ip_adapter_plan({"sd": MODEL, "xl": "synthetic:sdxl-tiny"}, {"style": STYLE}) == {"sd": ["style"],
                                                                                            "xl": []}
    with pytest.raises(UsageError, match="fits none of the served models.*80"):
        ip_adapter_plan({"xl": "synthetic:sdxl-tiny"}, {"style": STYLE})
    with pytest.raises(UsageError, match="unknown IP-Adapter architecture"):
        ip_adapter_plan({"sd": MODEL}, {"x": "synthetic:ip-adapter-nosuch"})
    # a file's width is read from its header
    from safetensors.torch import save_file
    import torch

    file = tmp_path / "ip-adapter_xl.safetensors"
    save_file({"ip_adapter.1.to_k_ip.weight": torch.zeros(8, 80), "image_proj.proj.weight": torch.zeros(4, 4)},
              str(file))
    assert ip_adapter_plan({"sd": MODEL, "xl": "synthetic:sdxl-tiny"}, {"xl": str(file)}) == {"sd": [],
                                                                                            "xl": ["xl"]}
    assert parse_ip_adapters(["style=synthetic:ip-adapter-sd15", "/m/ip-adapter_sd15.safetensors",
                              "h94/IP-Adapter/models/ip-adapter-plus_sd15.bin"]) == {
        "style": "synthetic:ip-adapter-sd15", "ip-adapter_sd15": "/m/ip-adapter_sd15.safetensors",
        "ip-adapter-plus_sd15": "h94/IP-Adapter/models/ip-adapter-plus_sd15.bin"}
    with pytest.raises(UsageError, match="taken"):
        parse_ip_adapters(["a=synthetic:ip-adapter-sd15", "a=synthetic:ip-adapter-plus-sd15"])


@pytest.mark.parametrize("args, message", [
    (["--ip-image-encoder", "enc"], "--ip-image-encoder is the image encoder of an IP-Adapter: give --ip-adapter"),
    (["--ip-adapter", "synthetic:ip-adapter-sdxl-tiny"], "--ip-adapter ip-adapter-sdxl-tiny "
                                                         "(synthetic:ip-adapter-sdxl-tiny) fits none of the served"),
    (["--ip-adapter", STYLE, "--ip-image-encoder", "no-such-folder"], "--ip-image-encoder no-such-folder: no such"),
])
def test_bad_ip_adapter_flags_are_refused_up_front(args, message, capsys, tmp_path, monkeypatch):
    from sdaccel.cli import main as cli

    monkeypatch.chdir(tmp_path)
    code = cli.main(["serve", "--model", MODEL, "--device", "cpu", "--port", "0", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert message in err[-1] and len(err) == 1


@pytest.mark.slow
def test_a_worker_process_loads_the_ip_adapters():
    """ProcessWorkers (`serve --cpu-workers`): the child loads the adapters beside its model and the job's image
    prompt crosses to it: the image of the same call in this process."""
    from sdaccel.serve.jobs import Job
    from sdaccel.serve.workers import ProcessWorkers

    pool = ProcessWorkers({"tiny": MODEL}, engine="eager", devices=["cpu"], ip_adapters={"style": STYLE})
    pool.start()
    try:
        assert pool.wait_ready(300) and pool.model_ip_adapters == {"tiny": ["style"]}
        image = _picture(11)
        job = Job("tiny", "a house", seed=6, settings=dict(SETTINGS, ip_adapter_image=PromptImages([image]),
                                                           ip_adapter_scale=[0.9]))
        result = pool.submit(job).result(300)
    finally:
        pool.stop(drain=False, timeout=60)
    want = reference("a house", 6, ip_adapter_image=image, ip_adapter_scale=0.9)
    assert result.params[0]["ip_adapters"] == {STYLE: 0.9}
    assert np.abs(_pixels(result.images[0]) - want).max() <= 1
