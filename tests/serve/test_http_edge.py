"""The HTTP edge (sdaccel/serve/http_server.py) against slow and hostile clients: raw sockets against a real uvicorn
server in a thread of the test process, with small time limits (a head 0.5 s, a body 1 s)."""

from __future__ import annotations

import functools
import json
import select
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from serve_helpers import wait_for  # noqa: E402

from sdaccel.errors import UsageError  # noqa: E402
from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.http_server import BODY_BACKSTOP_S, EdgeConfig, EdgeServer  # noqa: E402
from sdaccel.serve.loadtest import free_port  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402

MODEL = "synthetic:sd15-tiny"
HEAD_S, BODY_S = 0.5, 1.0
SLACK_S = 3.0  # the CPU is shared: answers may come this much later than their limit


@functools.lru_cache(maxsize=1)
def _pipe():
    import sdaccel

    return sdaccel.load(MODEL, engine="eager", device="cpu")


class CountingWorker(Worker):
    """A Worker that counts the jobs submitted to it and records the shutdown calls it gets."""

    def __init__(self):
        super().__init__({"tiny": MODEL}, engine="eager", device="cpu", loader=lambda ref, **kw: _pipe(),
                         max_batch=1, batch_window_ms=0, max_queue=4)
        self.submitted = 0
        self.calls: list[tuple[str, float]] = []

    def submit(self, job):
        self.submitted += 1
        return super().submit(job)

    def begin_shutdown(self) -> None:
        self.calls.append(("begin_shutdown", time.monotonic()))
        super().begin_shutdown()

    def abort(self, reason: str = "the server is shutting down") -> None:
        self.calls.append(("abort", time.monotonic()))
        super().abort(reason)


class EdgeThread:
    """An EdgeServer on a free loopback port in a thread; `edge` goes to EdgeConfig."""

    def __init__(self, worker: Worker, stop_worker: bool = False, **edge):
        edge = dict(dict(header_timeout_s=HEAD_S, body_timeout_s=BODY_S, shutdown_timeout_s=30.0), **edge)
        self.worker, self.port = worker, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(worker, request_timeout_s=120, stop_worker_on_shutdown=stop_worker)
        self.server = EdgeServer(EdgeConfig(app, host="127.0.0.1", port=self.port, log_level="warning",
                                            lifespan="on", **edge), worker)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, "the server to start", timeout=30)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture(scope="module")
def worker():
    w = CountingWorker()
    w.start()
    assert w.wait_ready(300)
    yield w
    w.stop(True)


@pytest.fixture(scope="module")
def edge(worker):
    s = EdgeThread(worker)
    yield s
    s.close()


def read_response(sock: socket.socket, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response read off a raw socket: (status, {lower-case header: value}, body)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside a response body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket, timeout: float = 10) -> bool:
    """The server closed the connection (within `timeout`)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def trickle(sock: socket.socket, data: bytes, every: float, limit: float) -> float:
    """Send `data` (cycled) a byte every `every` seconds until the server answers; seconds that took. Fails after
    `limit` seconds without an answer."""
    started = time.monotonic()
    i = 0
    while True:
        try:
            sock.sendall(data[i % len(data):i % len(data) + 1])
        except OSError:  # the server closed the connection under the sender
            break
        i += 1
        if select.select([sock], [], [], every)[0]:
            break
        assert time.monotonic() - started < limit, f"no answer to a trickle within {limit} s"
    return time.monotonic() - started


def assert_timeout_408(sock: socket.socket, words: str) -> None:
    status, headers, body = read_response(sock)
    error = json.loads(body)["error"]
    assert status == 408 and headers["connection"] == "close", (status, headers, body)
    assert error["type"] == "timeout_error" and words in error["message"], error
    assert closed_by_server(sock)


# ------------------------------------------------------------------------------------------------ the head


def test_a_trickled_head_is_408_and_closed_while_others_are_served(edge):
    sock = edge.connect()
    took = trickle(sock, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100, every=0.05,
                   limit=HEAD_S + SLACK_S + 5)
    assert HEAD_S - 0.1 <= took < HEAD_S + SLACK_S
    assert_timeout_408(sock, "request head")
    assert httpx.get(f"{edge.url}/health").status_code == 200


def test_a_silent_connection_is_408_and_closed(edge):
    sock = edge.connect()
    started = time.monotonic()
    assert_timeout_408(sock, "request head")
    assert HEAD_S - 0.1 <= time.monotonic() - started < HEAD_S + SLACK_S


def test_the_next_head_on_a_kept_alive_connection_is_timed_too(edge):
    sock = edge.connect()
    for _ in range(2):  # quick whole requests on one connection are served
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = read_response(sock)
        assert status == 200 and json.loads(body)["status"] == "ok"
    time.sleep(HEAD_S + 0.3)  # idle between requests: uvicorn's keep-alive (5 s) applies, not the head's limit
    # uvicorn stops its keep-alive timer at the next request's first byte: a trickle after it is timed from there
    took = trickle(sock, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100, every=0.05,
                   limit=HEAD_S + SLACK_S + 10)
    assert took < HEAD_S + SLACK_S
    assert_timeout_408(sock, "request head")


# ------------------------------------------------------------------------------------------------ the body


def test_a_body_that_never_completes_is_408_and_the_worker_never_sees_the_job(edge, worker):
    submitted = worker.submitted
    sock = edge.connect()
    body = json.dumps({"prompt": "x", "steps": 2, "width": 32, "height": 32}).encode()
    sock.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % (len(body) + 10) + body)  # 10 bytes short, for ever
    started = time.monotonic()
    assert_timeout_408(sock, "request body")
    assert BODY_S - 0.1 <= time.monotonic() - started < BODY_S + SLACK_S
    assert worker.submitted == submitted
    # a whole body reaches the worker's submit (whose checks refuse a lone surrogate: no job runs)
    r = httpx.post(f"{edge.url}/v1/generate", headers={"Content-Type": "application/json"},
                   content=b'{"prompt": "\\ud800", "steps": 2, "width": 32, "height": 32}')
    assert r.status_code == 400 and worker.submitted == submitted + 1


def test_a_trickled_body_is_408_too(edge):
    sock = edge.connect()
    sock.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100000\r\n\r\n")
    took = trickle(sock, b" ", every=0.05, limit=BODY_S + SLACK_S + 5)  # JSON whitespace, a byte at a time
    assert BODY_S - 0.1 <= took < BODY_S + SLACK_S
    assert_timeout_408(sock, "request body")


def test_a_body_nothing_reads_does_not_hold_its_connection(edge):
    sock = edge.connect()
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    status, _, _ = read_response(sock)  # answered without reading the body
    assert status == 200
    started = time.monotonic()
    took = trickle(sock, b"a", every=0.05, limit=BODY_S + BODY_BACKSTOP_S + SLACK_S + 5)
    assert took < BODY_S + BODY_BACKSTOP_S + SLACK_S and time.monotonic() - started < 10
    assert closed_by_server(sock)


# -------------------------------------------------------------------------------------- the concurrency limit


def test_past_the_concurrency_limit_requests_are_503_json(worker):
    s = EdgeThread(worker, header_timeout_s=30.0, limit_concurrency=3)
    try:
        idle = [s.connect() for _ in range(3)]  # 3 open connections, then the 4th asks
        wait_for(lambda: len(s.server.server_state.connections) == 3, "the server to take the connections")
        r = httpx.get(f"{s.url}/health")
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_unavailable"
        assert r.headers["retry-after"] == "1" and "limit of 3" in r.json()["error"]["message"]
        for sock in idle:
            sock.close()
        wait_for(lambda: len(s.server.server_state.connections) == 0, "the connections to close")
        assert httpx.get(f"{s.url}/health").status_code == 200
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------- the shutdown


def test_shutdown_is_bounded_by_slow_clients_and_answers_them_503():
    w = CountingWorker()
    w.start()
    assert w.wait_ready(300)
    s = EdgeThread(w, stop_worker=True, header_timeout_s=60.0, body_timeout_s=60.0, shutdown_timeout_s=1.0)
    slow_head = s.connect()
    slow_head.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
    slow_body = s.connect()
    slow_body.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{")  # never finished
    wait_for(lambda: len(s.server.server_state.tasks) == 1, "the body's request to start")
    started = time.monotonic()
    s.server.should_exit = True
    s.thread.join(1.0 + 10)
    took = time.monotonic() - started
    assert not s.thread.is_alive() and took < 1.0 + SLACK_S + 2, took
    assert closed_by_server(slow_head, timeout=1)  # a head not finished is no request: closed unanswered
    status, headers, body = read_response(slow_body, timeout=1)
    assert status == 503 and json.loads(body)["error"] == {"message": "the server is shutting down",
                                                           "type": "server_unavailable"}
    names = [name for name, _ in w.calls]
    assert names == ["begin_shutdown", "abort"], names
    assert w.calls[1][1] - w.calls[0][1] >= 1.0 - 0.1  # the requests had their shutdown timeout first
    assert w.submitted == 0
    assert not w._thread.is_alive()  # the app's lifespan stopped the worker after


def test_the_edge_settings_are_checked():
    app = create_app(Worker({"tiny": MODEL}), stop_worker_on_shutdown=False)
    for bad in (dict(header_timeout_s=0), dict(body_timeout_s=-1), dict(shutdown_timeout_s=float("nan")),
                dict(limit_concurrency=-1)):
        with pytest.raises(UsageError, match="--"):
            EdgeConfig(app, **bad)
