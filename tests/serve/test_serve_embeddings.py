"""`sdaccel serve --embeddings DIR`: each served model loads the folder's files made for it, /sdapi/v1/embeddings
lists them as A1111 does (webuiapi's get_embeddings), and prompts on every API use them."""

from __future__ import annotations

import base64
import io
import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import numpy as np  # noqa: E402
from embedding_fixtures import a1111_pt, sdxl_file, vectors  # noqa: E402
from PIL import Image  # noqa: E402
from serve_helpers import serve_process  # noqa: E402

from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.loadtest import free_port  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402

SD_ENTRY = {"step": 120, "sd_checkpoint": "abcdef12", "sd_checkpoint_name": "base-model", "shape": 32, "vectors": 3}
XL_ENTRY = {"step": None, "sd_checkpoint": None, "sd_checkpoint_name": None, "shape": 80, "vectors": 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddings")
    a1111_pt(root / "mystyle.pt", vectors(3, 32, seed=1))
    sdxl_file(root / "xlstyle.safetensors", vectors(2, 32, seed=2), vectors(2, 48, seed=3))
    return root


@pytest.fixture(scope="module")
def server(folder):
    """An in-process Worker serving the tiny SD1.x and SDXL models with the folder, behind uvicorn in a thread."""
    worker = Worker({"sd": "synthetic:sd15-tiny", "xl": "synthetic:sdxl-tiny"}, engine="eager", device="cpu",
                    embeddings=str(folder))
    worker.start()
    assert worker.wait_ready(300)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(worker), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", port
    server.should_exit = True
    thread.join(60)


def test_the_endpoint_lists_the_current_checkpoints_embeddings(server):
    url, port = server
    webuiapi = pytest.importorskip("webuiapi")
    api = webuiapi.WebUIApi(host="127.0.0.1", port=port)
    assert api.get_embeddings() == {"loaded": {"mystyle": SD_ENTRY}, "skipped": {"xlstyle": XL_ENTRY}}
    assert httpx.post(f"{url}/sdapi/v1/options", json={"sd_model_checkpoint": "xl"}).status_code == 200
    try:
        assert httpx.get(f"{url}/sdapi/v1/embeddings").json() == {"loaded": {"xlstyle": XL_ENTRY},
                                                                  "skipped": {"mystyle": SD_ENTRY}}
    finally:
        httpx.post(f"{url}/sdapi/v1/options", json={"sd_model_checkpoint": "sd"})


def _pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"), dtype=np.int16)


def test_prompts_use_the_embeddings_on_every_api(server):
    url, _ = server
    body = {"steps": 2, "width": 32, "height": 32, "seed": 4}
    a1111 = httpx.post(f"{url}/sdapi/v1/txt2img", json=dict(body, prompt="a mystyle cat"), timeout=120).json()
    assert 'TI hashes: "mystyle: ' in json.loads(a1111["info"])["infotexts"][0]
    native = httpx.post(f"{url}/v1/generate", json=dict(body, prompt="a mystyle cat", model="sd"), timeout=120)
    plain = httpx.post(f"{url}/v1/generate", json=dict(body, prompt="a mystylish cat", model="sd"), timeout=120)
    assert native.status_code == plain.status_code == 200, native.text
    assert np.array_equal(_pixels(native.json()["images"][0]), _pixels(a1111["images"][0]))
    assert not np.array_equal(_pixels(native.json()["images"][0]), _pixels(plain.json()["images"][0]))
    assert not np.array_equal(_pixels(a1111["images"][0]), _pixels(
        httpx.post(f"{url}/sdapi/v1/txt2img", json=dict(body, prompt="a mystylish cat"), timeout=120).json()
        ["images"][0]))


def test_a_server_without_embeddings_lists_none_and_a_loading_one_says_so():
    idle = Worker({"sd": "synthetic:sd15-tiny"}, engine="eager", device="cpu")
    from fastapi.testclient import TestClient

    with TestClient(create_app(idle, stop_worker_on_shutdown=False)) as client:
        r = client.get("/sdapi/v1/embeddings")
        assert r.status_code == 503 and "still loading" in r.json()["error"]["message"]
        idle.start()
        assert idle.wait_ready(300)
        assert client.get("/sdapi/v1/embeddings").json() == {"loaded": {}, "skipped": {}}
    idle.stop()


@pytest.mark.slow
def test_serve_with_worker_processes_lists_them(folder, tmp_path):
    with serve_process(tmp_path, "--model", "synthetic:sd15-tiny", "--engine", "eager", "--cpu-workers", "1",
                       "--embeddings", str(folder)) as served:
        assert httpx.get(f"{served.url}/sdapi/v1/embeddings").json() == {"loaded": {"mystyle": SD_ENTRY},
                                                                         "skipped": {"xlstyle": XL_ENTRY}}
