"""`sdaccel serve` as a process of its own against slow and hostile clients: slowloris heads, a body that never
completes during a SIGTERM, a SIGTERM during a long job with another queued behind it. Every request the server took
gets an answer, and the server exits 0 within its shutdown bound (bounds generous: the CPU is shared)."""

from __future__ import annotations

import json
import select
import signal
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from serve_helpers import serve_process, wait_for  # noqa: E402
from test_http_edge import closed_by_server, read_response  # noqa: E402

MODEL = "synthetic:sd15-tiny"
SERVE = ("--model", MODEL, "--device", "cpu", "--engine", "eager")
MARGIN_S = 10.0  # what the bounds allow beyond the server's own limits, on a busy CPU
SMALL = {"prompt": "x", "steps": 2, "width": 32, "height": 32, "scheduler": "ddim"}
LONG = {"prompt": "long", "steps": 150, "width": 64, "height": 64, "scheduler": "ddim"}  # a minute or more on CPU


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _exit_within(served, seconds: float) -> float:
    """Seconds the server took to exit 0 after now; fails if it is still running after `seconds`."""
    started = time.monotonic()
    rc = served.proc.wait(seconds)
    assert rc == 0, served.log.read_text()[-3000:]
    return time.monotonic() - started


def _post_in_thread(url: str, body: dict) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def post():
        try:
            result["response"] = httpx.post(f"{url}/v1/generate", json=body, timeout=300)
        except httpx.HTTPError as exc:  # a dropped connection or a hang is a failure the test reports
            result["error"] = repr(exc)

    thread = threading.Thread(target=post)
    thread.start()
    return thread, result


def _assert_503_shutting_down(result: dict) -> None:
    assert "response" in result, result
    r = result["response"]
    assert r.status_code == 503, (r.status_code, r.text)
    assert r.json()["error"]["type"] == "server_unavailable" and "shutting down" in r.json()["error"]["message"]


@pytest.mark.slow
def test_slowloris_heads_are_408_while_normal_requests_are_served(tmp_path):
    header_s = 2.0
    with serve_process(tmp_path, *SERVE, "--header-timeout", str(header_s)) as served:
        port = _port(served.url)
        slow = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(50)]
        opened = time.monotonic()
        for sock in slow:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        normal, normal_result = _post_in_thread(served.url, SMALL)  # meanwhile
        answered: dict[socket.socket, float] = {}
        while len(answered) < len(slow):  # a header byte to each every 0.2 s until the server answers it
            assert time.monotonic() - opened < header_s + MARGIN_S + 20, f"{len(answered)} of 50 answered"
            waiting = [sock for sock in slow if sock not in answered]
            for sock in waiting:
                try:
                    sock.sendall(b"a")
                except OSError:
                    answered[sock] = time.monotonic()
            for sock in select.select(waiting, [], [], 0.2)[0]:
                answered.setdefault(sock, time.monotonic())
        for sock in slow:
            assert answered[sock] - opened < header_s + MARGIN_S
            status, headers, body = read_response(sock)
            assert status == 408 and json.loads(body)["error"]["type"] == "timeout_error"
            assert closed_by_server(sock)
        normal.join(300)
        assert normal_result["response"].status_code == 200, normal_result
        assert httpx.post(f"{served.url}/v1/generate", json=SMALL, timeout=300).status_code == 200  # after


@pytest.mark.slow
def test_a_body_never_completed_does_not_hold_a_sigterm(tmp_path):
    shutdown_s = 2.0
    with serve_process(tmp_path, *SERVE, "--shutdown-timeout", str(shutdown_s), "--body-timeout", "600") as served:
        sock = socket.create_connection(("127.0.0.1", _port(served.url)), timeout=30)
        sock.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"prompt\": ")  # and nothing more
        time.sleep(0.5)
        served.proc.send_signal(signal.SIGTERM)
        took = _exit_within(served, shutdown_s + MARGIN_S + 30)
        assert took < shutdown_s + MARGIN_S, (took, served.log.read_text()[-3000:])
        status, _, body = read_response(sock, timeout=1)  # the request was answered before the exit
        assert status == 503 and "shutting down" in json.loads(body)["error"]["message"]


@pytest.mark.slow
def test_sigterm_during_a_long_job_answers_it_and_the_queued_one_503(tmp_path):
    shutdown_s = 2.0
    with serve_process(tmp_path, *SERVE, "--shutdown-timeout", str(shutdown_s), "--max-batch", "1",
                       "--batch-window-ms", "0", "--max-job-seconds", "0") as served:  # LONG is long: let it run
        running, running_result = _post_in_thread(served.url, LONG)
        wait_for(lambda: httpx.get(f"{served.url}/sdapi/v1/progress").json()["state"]["job_count"] > 0,
                 "the long job to start")
        queued, queued_result = _post_in_thread(served.url, dict(LONG, prompt="queued"))
        wait_for(lambda: "sdaccel_queue_depth 1.0" in httpx.get(f"{served.url}/metrics").text,
                 "the second job to queue")
        served.proc.send_signal(signal.SIGTERM)
        took = _exit_within(served, shutdown_s + MARGIN_S + 60)
        # the requests' shutdown time, then the step boundary and the handlers' answers (ABORT_GRACE_S at most)
        assert took < shutdown_s + 5 + MARGIN_S, (took, served.log.read_text()[-3000:])
        running.join(30)
        queued.join(30)
        _assert_503_shutting_down(running_result)
        _assert_503_shutting_down(queued_result)
        lines = [json.loads(line) for line in served.log.read_text().splitlines() if line.startswith("{")]
        assert [line["status"] for line in lines if line.get("path") == "/v1/generate"] == [503, 503]
