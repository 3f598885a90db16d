"""The API key of `sdaccel serve`: at least 16 characters, taken from $SDACCEL_API_KEY (so no command line shows it),
and the open probes (/health, /ready) telling a client without it nothing beyond their status."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from serve_helpers import serve_process  # noqa: E402

from sdaccel.cli import main as cli  # noqa: E402
from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402

MODEL = "synthetic:sd15-tiny"
KEY = "a-long-enough-test-key-0123"


@pytest.mark.parametrize("args, env, source", [
    (["--api-key", "short-key"], None, "--api-key"),
    ([], "0123456789abcde", "$SDACCEL_API_KEY"),  # 15 characters
    (["--api-key", " padded-key-0123456789 "], None, "--api-key"),
])
def test_a_short_or_padded_key_is_refused_in_one_line(args, env, source, monkeypatch, capsys):
    monkeypatch.delenv("SDACCEL_API_KEY", raising=False)
    if env is not None:
        monkeypatch.setenv("SDACCEL_API_KEY", env)
    assert cli.main(["serve", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"sdaccel: error: {source}: ")
    assert "at least 16 characters" in err[0] or "whitespace" in err[0]


def test_the_help_says_the_command_line_shows_the_key(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "visible to other users in ps" in text and "prefer $SDACCEL_API_KEY" in text


@pytest.mark.slow
def test_the_key_from_the_environment_guards_the_server_and_stays_off_its_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SDACCEL_API_KEY", KEY)
    with serve_process(tmp_path, "--model", MODEL, "--engine", "eager", "--device", "cpu") as served:
        url = served.url
        assert httpx.get(f"{url}/sdapi/v1/sd-models").status_code == 401
        assert httpx.get(f"{url}/sdapi/v1/sd-models", headers={"X-API-Key": KEY}).status_code == 200
        assert KEY.encode() not in Path(f"/proc/{served.proc.pid}/cmdline").read_bytes()
        assert httpx.get(f"{url}/ready").json() == {"status": "ready"}


def _probe(app, path: str, headers: dict | None = None):
    async def get():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.get(path, headers=headers or {})

    return asyncio.run(get())


class _Pipe:
    """Enough of a pipeline for a Worker to load."""


def test_the_probes_tell_a_client_without_the_key_only_their_status():
    gate = threading.Event()
    worker = Worker({"secret-model": MODEL}, loader=lambda ref, **kw: gate.wait(30) and _Pipe())
    worker.start()
    app = create_app(worker, api_key=KEY, stop_worker_on_shutdown=False)
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        loading = _probe(app, "/ready")
        assert loading.status_code == 503 and loading.json() == {"status": "not_ready"}
        loading = _probe(app, "/ready", auth)
        assert loading.status_code == 503 and "loading" in loading.json()["error"]["message"]
        gate.set()
        assert worker.wait_ready(30)
        for path, status in (("/ready", "ready"), ("/health", "ok")):
            response = _probe(app, path)
            assert response.status_code == 200 and response.json() == {"status": status}
            response = _probe(app, path, {"X-API-Key": "wrong"})
            assert response.status_code == 200 and response.json() == {"status": status}
        ready = _probe(app, "/ready", auth).json()
        assert ready["models"] == ["secret-model"] and ready["workers"] == {"0": "ready"}
        assert _probe(app, "/health", auth).json() == {"status": "ok", "workers": {"0": "ready"}}
    finally:
        gate.set()
        worker.stop()


def test_a_failure_is_told_only_to_a_client_with_the_key():
    def fail(ref, **kwargs):
        raise OSError("/srv/models/secret-model.safetensors: no such file")

    worker = Worker({"tiny": MODEL}, loader=fail)
    worker.start()
    with pytest.raises(OSError):
        worker.wait_ready(30)
    app = create_app(worker, api_key=KEY, stop_worker_on_shutdown=False)
    for path, status in (("/ready", "not_ready"), ("/health", "unhealthy")):
        response = _probe(app, path)
        assert response.status_code == 503 and response.json() == {"status": status}
        response = _probe(app, path, {"Authorization": f"Bearer {KEY}"})
        assert response.status_code == 503 and "secret-model.safetensors" in response.json()["error"]["message"]
    no_key = create_app(worker, stop_worker_on_shutdown=False)  # no key set: every client gets the detail
    assert "secret-model.safetensors" in _probe(no_key, "/ready").json()["error"]["message"]
