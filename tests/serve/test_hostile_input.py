"""Bad input among good: a request the tokenizer cannot read, a number beyond its range or a value of the wrong
type gets its own 4xx, and the requests beside it get their images."""

from __future__ import annotations

import asyncio
import json

import pytest

httpx = pytest.importorskip("httpx")

from inprocess_server import InProcessServer  # noqa: E402

BODY = {"steps": 2, "width": 32, "height": 32, "scheduler": "ddim"}


@pytest.fixture(scope="module")
def server():
    srv = InProcessServer({"tiny": "synthetic:sd15-tiny"}, max_batch=4, batch_window_ms=300)
    yield srv
    srv.close()


def test_a_lone_surrogate_fails_alone_among_batched_requests(server):
    prompts = ["a cat", "a \ud800 dog", "a cow", "a hen"]

    async def together():
        async with httpx.AsyncClient(timeout=120) as client:
            # json.dumps writes the lone surrogate as the escape \ud800, as a client's JSON library would
            return await asyncio.gather(*(client.post(f"{server.url}/v1/generate", content=json.dumps(
                {"prompt": p, "seed": i, **BODY}), headers={"content-type": "application/json"})
                for i, p in enumerate(prompts)))

    answers = asyncio.run(together())
    assert [a.status_code for a in answers] == [200, 400, 200, 200]
    assert "prompt is not valid text" in answers[1].json()["error"]["message"]
    assert all(len(answers[i].json()["images"]) == 1 for i in (0, 2, 3))


@pytest.mark.parametrize("path, body, field", [
    ("/v1/generate", {"prompt": "x", "guidance": 1e308}, "guidance"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "cfg_scale": 1e308}, "guidance"),
    ("/v1/images/generations", {"prompt": "x", "size": "32x32", "guidance": 1e308}, "guidance"),
    ("/v1/generate", {"prompt": "x", "n": False}, "n"),
    ("/v1/generate", {"prompt": "x", "steps": "2"}, "steps"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "batch_size": True}, "batch_size"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "seed": "5"}, "seed"),
])
def test_numbers_beyond_range_and_values_of_another_type_are_4xx(server, path, body, field):
    base = {"/v1/generate": BODY, "/sdapi/v1/txt2img": {"steps": 2, "width": 32, "height": 32, "sampler_name": "DDIM"},
            "/v1/images/generations": {"steps": 2}}[path]
    r = httpx.post(f"{server.url}{path}", json={**base, **body}, timeout=120)
    assert 400 <= r.status_code < 500 and field in r.json()["error"]["message"], r.text
    assert httpx.post(f"{server.url}/v1/generate", json={"prompt": "after", **BODY}, timeout=120).status_code == 200


@pytest.mark.parametrize("path, body, flag", [
    ("/v1/generate", {"prompt": "x", "steps": 151}, "--max-steps"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "steps": 151}, "--max-steps"),
    ("/v1/generate", {"prompt": "x", "width": 2056}, "--max-side"),
    ("/v1/generate", {"prompt": "x", "n": 9}, "--max-images"),
])
def test_the_servers_bounds_are_the_one_rule_naming_its_flag(server, path, body, flag):
    r = httpx.post(f"{server.url}{path}", json=body, timeout=120)
    assert r.status_code == 400 and f"on this server ({flag})" in r.json()["error"]["message"], r.text


def test_serve_bounds_beyond_the_librarys_are_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "sdaccel", "serve", "--max-steps", "2000"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "sdaccel: error: --max-steps/--max-side/--max-images: the step limit must be from 1 to 1000, got 2000"]
