"""LoRAs on the server: `--loras DIR` files named by `<lora:name:weight>` tags and /v1/generate's `loras`, each
image the one pipe.set_loras gives; LoRA sets batch apart; unknown and path-like names refused; /sdapi/v1/loras."""

from __future__ import annotations

import base64
import functools
import io
import json
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

import torch  # noqa: E402
from inprocess_server import InProcessServer  # noqa: E402
from PIL import Image  # noqa: E402

from sdaccel.serve.loras import LoraFolder  # noqa: E402

MODEL = "synthetic:sd15-tiny"
SETTINGS = dict(steps=2, scheduler="ddim", height=32, width=32)


@functools.lru_cache(maxsize=1)
def _pipe():
    import sdaccel

    return sdaccel.load(MODEL, engine="eager", device="cpu")


def attention_lora(path, seed, scale=0.3, rank=4):
    """A kohya LoRA on every attention projection of the tiny UNet, large enough to change its images clearly."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in _pipe().components.unet.named_modules():
        if isinstance(module, torch.nn.Linear) and ".attn" in name:
            key = "lora_unet_" + name.replace(".", "_")
            tensors[f"{key}.lora_down.weight"] = torch.randn(rank, module.in_features, generator=g) * scale
            tensors[f"{key}.lora_up.weight"] = torch.randn(module.out_features, rank, generator=g) * scale
            tensors[f"{key}.alpha"] = torch.tensor(float(rank))
    save_file(tensors, str(path))
    return path


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loras")
    attention_lora(folder / "style.safetensors", 1)
    attention_lora(folder / "detail.safetensors", 2)
    (folder / "notes.txt").write_text("not a LoRA")
    return folder


@pytest.fixture(scope="module")
def server(lora_dir):
    s = InProcessServer({"tiny": MODEL}, app_args=dict(loras=LoraFolder(lora_dir)), loader=lambda ref, **kw: _pipe(),
                        max_batch=8, batch_window_ms=400, max_queue=16)
    yield s
    s.close()


def reference(prompt: str, seed: int, loras: dict) -> np.ndarray:
    """The image of pipe.set_loras(loras) then the call the worker makes for one job (the worker is idle)."""
    pipe = _pipe()
    pipe.set_loras(loras)
    try:
        return _pixels(pipe([prompt], [""], seeds=[seed], **SETTINGS).images[0])
    finally:
        pipe.set_loras({})


def _pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def _decoded(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def generate(server, **body):
    return httpx.post(f"{server.url}/v1/generate", json={**SETTINGS, "prompt": "a red cube", **body}, timeout=120)


def txt2img(server, **body):
    body = {"prompt": "a red cube", "steps": 2, "sampler_name": "DDIM", "width": 32, "height": 32, **body}
    return httpx.post(f"{server.url}/sdapi/v1/txt2img", json=body, timeout=120)


def test_a_tag_gives_the_image_of_set_loras(server, lora_dir):
    r = generate(server, prompt="a red cube <lora:style:0.8>", seed=5)
    assert r.status_code == 200, r.text
    served = _pixels(_decoded(r.json()["images"][0]))
    want = reference("a red cube ", 5, {str(lora_dir / "style.safetensors"): 0.8})
    plain = reference("a red cube ", 5, {})
    assert np.abs(served - want).max() <= 1
    assert np.abs(served - plain).mean() > 3  # the LoRA changed the image
    params = r.json()["parameters"][0]
    assert params["prompt"] == "a red cube <lora:style:0.8>"  # as A1111's infotext keeps it
    assert params["loras"] == {str((lora_dir / "style.safetensors").resolve()): 0.8}
    png = _decoded(r.json()["images"][0]).info["parameters"]
    assert "LoRAs: style.safetensors:0.8" in png
    # The loras field is the same LoRA set: the same image.
    field = generate(server, prompt="a red cube ", seed=5, loras={"style": 0.8})
    assert np.abs(_pixels(_decoded(field.json()["images"][0])) - served).max() <= 1


def test_a1111_tags_and_weights_add(server, lora_dir):
    r = txt2img(server, prompt="a red cube <lora:style:0.5><lyco:style:0.3>, <lora:detail>", seed=7)
    assert r.status_code == 200, r.text
    want = reference("a red cube , ", 7, {str(lora_dir / "style.safetensors"): 0.8,
                                          str(lora_dir / "detail.safetensors"): 1.0})
    assert np.abs(_pixels(_decoded(r.json()["images"][0])) - want).max() <= 1
    assert json.loads(r.json()["info"])["prompt"] == "a red cube <lora:style:0.5><lyco:style:0.3>, <lora:detail>"


def test_openai_prompts_take_tags_too(server, lora_dir):
    r = httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "a red cube <lora:detail:0.9>", "seed": 8,
                                                                  "size": "32x32", "steps": 2, "scheduler": "ddim"},
                   timeout=120)
    assert r.status_code == 200, r.text
    want = reference("a red cube ", 8, {str(lora_dir / "detail.safetensors"): 0.9})
    assert np.abs(_pixels(_decoded(r.json()["data"][0]["b64_json"])) - want).max() <= 1


def test_different_lora_sets_in_one_batch_window_each_get_their_own_image(server, lora_dir):
    style, detail = str(lora_dir / "style.safetensors"), str(lora_dir / "detail.safetensors")
    asks = [("a red cube <lora:style:1>", 11, {style: 1.0}), ("a red cube <lora:detail:0.7>", 12, {detail: 0.7}),
            ("a red cube ", 13, {}), ("a red cube <lora:style:1>", 14, {style: 1.0})]
    answers: dict[int, httpx.Response] = {}

    def ask(k, prompt, seed):
        answers[k] = generate(server, prompt=prompt, seed=seed)

    threads = [threading.Thread(target=ask, args=(k, prompt, seed)) for k, (prompt, seed, _) in enumerate(asks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(answers[k].status_code == 200 for k in range(4)), [answers[k].text for k in range(4)]
    # The two jobs of one set shared a call; the others ran in calls of their own.
    assert [answers[k].json()["batch_images"] for k in range(4)] == [2, 1, 1, 2]
    for k, (prompt, seed, loras) in enumerate(asks):
        want = reference(prompt.split("<")[0], seed, loras)
        assert np.abs(_pixels(_decoded(answers[k].json()["images"][0])) - want).max() <= 1, k
    # After them a request without tags runs on the base weights again.
    after = generate(server, prompt="a red cube ", seed=13)
    assert np.abs(_pixels(_decoded(after.json()["images"][0])) - reference("a red cube ", 13, {})).max() <= 1


@pytest.mark.parametrize("prompt, words", [
    ("a cube <lora:nosuch:1>", ["unknown LoRA 'nosuch'", "served: detail, style"]),
    ("a cube <lora:../style:1>", ["'../style'", "not a path"]),
    ("a cube <lora:sub/style>", ["'sub/style'", "not a path"]),
    ("a cube <lora:style:0.5:1>", ["text encoder weight", "one weight"]),
    ("a cube <lora:style:1:1:8>", ["dyn"]),
    ("a cube <lora:style:x>", ["'x' is not a number"]),
    ("a cube <hypernet:style:1>", ["<hypernet:...> is not supported"]),
])
def test_bad_tags_are_a_400_naming_them(server, prompt, words):
    for r in (generate(server, prompt=prompt), txt2img(server, prompt=prompt)):
        assert r.status_code == 400, r.text
        assert all(w in r.json()["error"]["message"] for w in words), r.json()
    assert httpx.get(f"{server.url}/health").status_code == 200  # the server stays up


@pytest.mark.parametrize("loras, words", [({"nosuch": 1}, ["unknown LoRA 'nosuch'"]),
                                          ({"sub/style": 1}, ["'sub/style'", "not a path"]),
                                          ({"style": "much"}, ["loras.style", "number"])])
def test_bad_loras_field_is_a_4xx_naming_it(server, loras, words):
    r = generate(server, prompt="a cube", loras=loras)
    assert r.status_code in (400, 422), r.text
    assert all(w in r.json()["error"]["message"] for w in words), r.json()


def test_tags_are_text_with_prompt_syntax_none(server):
    r = generate(server, prompt="a cube <lora:nosuch:1>", prompt_syntax="none", seed=2)
    assert r.status_code == 200, r.text
    assert "loras" not in r.json()["parameters"][0]


def test_negative_prompt_tags_are_text_as_a1111_reads_them(server):
    r = txt2img(server, negative_prompt="<lora:nosuch:1>", seed=2)
    assert r.status_code == 200, r.text


def test_loras_listed_and_rescanned(server, lora_dir):
    listed = httpx.get(f"{server.url}/sdapi/v1/loras").json()
    assert [item["name"] for item in listed] == ["detail", "style"]
    assert listed[1] == {"name": "style", "alias": "style", "path": str((lora_dir / "style.safetensors").resolve()),
                         "metadata": {}}
    assert generate(server, prompt="a cube <lora:later:1>").status_code == 400
    attention_lora(lora_dir / "later.safetensors", 3)
    assert httpx.post(f"{server.url}/sdapi/v1/refresh-loras").status_code == 200
    assert "later" in [item["name"] for item in httpx.get(f"{server.url}/sdapi/v1/loras").json()]
    assert generate(server, prompt="a cube <lora:later:1>", seed=1).status_code == 200


def test_webuiapi_prompt_with_a_tag(server, lora_dir):
    webuiapi = pytest.importorskip("webuiapi")
    api = webuiapi.WebUIApi(host="127.0.0.1", port=server.port, sampler="DDIM", steps=2)
    result = api.txt2img(prompt="a red cube <lora:detail:0.6>", seed=21, width=32, height=32, cfg_scale=7.5,
                         eta=0, alwayson_scripts={})  # eta: ddim's (webuiapi sends 1); a dict of its own: webuiapi
    # writes the units of any call into its default dict, which its later calls would send
    want = reference("a red cube ", 21, {str(lora_dir / "detail.safetensors"): 0.6})
    assert np.abs(_pixels(result.image) - want).max() <= 1


def test_a_server_without_loras_refuses_tags():
    s = InProcessServer({"tiny": MODEL}, loader=lambda ref, **kw: _pipe())
    try:
        r = generate(s, prompt="a cube <lora:style:1>")
        assert r.status_code == 400 and "--loras" in r.json()["error"]["message"]
        assert httpx.get(f"{s.url}/sdapi/v1/loras").json() == []
    finally:
        s.close()


def test_lora_folder_serves_its_own_files_only(tmp_path):
    (tmp_path / "sub").mkdir()
    attention_lora(tmp_path / "sub" / "deep.safetensors", 1)
    attention_lora(tmp_path / "a.safetensors", 1)
    (tmp_path / "a.pt").write_bytes(b"")  # the same stem: the .safetensors file is served
    (tmp_path / "b.ckpt").write_bytes(b"")
    folder = LoraFolder(tmp_path)
    assert folder.names() == ["a", "b"]
    assert folder.resolve({"a": 0.5, "b": 0}) == ((str((tmp_path / "a.safetensors").resolve()), 0.5),)
    from sdaccel.errors import UsageError

    for name in ("deep", "sub/deep", "..", "a.safetensors"):
        with pytest.raises(UsageError):
            folder.resolve({name: 1.0})
    with pytest.raises(UsageError, match="finite"):
        folder.resolve({"a": float("nan")})
    with pytest.raises(UsageError, match="not a folder"):
        LoraFolder(tmp_path / "a.safetensors")
