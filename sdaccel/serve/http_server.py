"""The HTTP edge of `sdaccel serve`: uvicorn's h11 protocol and server with the time limits a server on an open
network needs, so that slow or hostile clients hold neither connections nor the shutdown.

- A connection that has not sent a complete request head within `header_timeout_s` of opening (or, kept alive,
  of the first byte of its next request) gets a 408 JSON error and is closed. uvicorn alone bounds neither: its
  keep-alive timer stops at the first byte, and a new connection has none.
- A request body that has not arrived within `body_timeout_s` of the head: the app's Gate (middleware.py) answers
  408 to the handler reading it, from the timeout this protocol puts in the request's scope (BODY_TIMEOUT_KEY);
  a body nothing reads (the response already sent, or a route that never reads it) has its connection closed
  here a moment later.
- More than `limit_concurrency` open connections or running requests: a request gets a 503 JSON error at once.
- Shutdown (SIGTERM, SIGINT): stop accepting, `worker.begin_shutdown()` (new requests 503), let running requests
  finish for up to `shutdown_timeout_s`, then `worker.abort()` (running jobs stop between steps, queued ones fail:
  their handlers answer 503) and, ABORT_GRACE_S later, answer 503 to whatever request still has no answer and
  close every connection. A request whose body is still arriving at the deadline is answered 503 at once.

The h11 protocol always, as httptools may be absent and the timers follow h11's connection states; no websockets
(the app has no websocket route). This leans on uvicorn's H11Protocol and Server internals (their `conn`, `cycle`,
`server_state`, `servers`, `lifespan`), as uvicorn 0.55 has them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from ..errors import UsageError
from .middleware import BODY_TIMEOUT_KEY
from .worker_api import WorkerBase

log = logging.getLogger("uvicorn.error")
BODY_BACKSTOP_S = 1.0  # how long after the Gate's 408 was due a body still arriving closes its connection here
ABORT_GRACE_S = 5.0  # how long after worker.abort() the handlers have to answer before their connections close
SHUTTING_DOWN = "the server is shutting down"


def check_edge_settings(header_timeout_s: float, body_timeout_s: float, shutdown_timeout_s: float,
                        limit_concurrency: int) -> None:
    """The edge's settings, refused by their flag's name (UsageError)."""
    for flag, seconds in (("--header-timeout", header_timeout_s), ("--body-timeout", body_timeout_s),
                          ("--shutdown-timeout", shutdown_timeout_s)):
        if not seconds > 0 or seconds == float("inf"):
            raise UsageError(f"{flag} must be a number of seconds > 0, got {seconds}")
    if limit_concurrency < 0:
        raise UsageError(f"--limit-concurrency must be >= 0 (0: no limit), got {limit_concurrency}")


class EdgeConfig(uvicorn.Config):
    """uvicorn's Config with the edge's limits, serving over EdgeProtocol. `limit_concurrency` 0 or None: none."""

    def __init__(self, app, *, header_timeout_s: float = 10.0, body_timeout_s: float = 30.0,
                 shutdown_timeout_s: float = 30.0, limit_concurrency: int | None = 512, **kwargs):
        check_edge_settings(header_timeout_s, body_timeout_s, shutdown_timeout_s, limit_concurrency or 0)
        super().__init__(app, http=EdgeProtocol, ws="none", limit_concurrency=limit_concurrency or None,
                         timeout_graceful_shutdown=shutdown_timeout_s, **kwargs)
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s


def _error_body(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


class EdgeProtocol(H11Protocol):
    """uvicorn's h11 protocol with a time limit on each request head and body, and a JSON 503 past the concurrency
    limit (EdgeConfig's settings)."""

    config: EdgeConfig

    def __init__(self, config: EdgeConfig, server_state, app_state, _loop=None):
        super().__init__(config, server_state, app_state, _loop)
        self.limit_concurrency = None  # uvicorn's plain-text 503 is replaced by the JSON one in _serve
        self._app, self.app = self.app, self._serve
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------------------------- the timers

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that sends nothing is closed too

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        self._follow_states()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next cycle and read a pipelined head
        if self._head_timer is None and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm_head_timer()  # part of the next head came with the last request
        self._follow_states()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.config.header_timeout_s, self._head_overdue)

    def _follow_states(self) -> None:
        """Stop the head timer once a head has arrived; time a body from its head until it is complete."""
        state = self.conn.their_state
        if state is not h11.IDLE and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if state is h11.SEND_BODY and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.config.body_timeout_s + BODY_BACKSTOP_S,
                                                    self._body_overdue)
        elif state is not h11.SEND_BODY and self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE:
            self.answer_and_close(408, f"the request head did not arrive within {self.config.header_timeout_s:g} "
                                       f"s", "timeout_error")

    def _body_overdue(self) -> None:
        self._body_timer = None
        if self.conn.their_state is h11.SEND_BODY:
            self.answer_and_close(408, f"the request body did not arrive within {self.config.body_timeout_s:g} "
                                       f"s", "timeout_error")

    # -------------------------------------------------------------------------------------- answering

    def receiving_body(self) -> bool:
        """A request's body is still arriving."""
        return self.cycle is not None and self.conn.their_state is h11.SEND_BODY

    def answer_and_close(self, status: int, message: str, kind: str) -> None:
        """Answer the connection's request with a JSON error, unless a response was already begun, and close it.
        The app's handler of that request, if one runs, then reads a disconnect and its answer is dropped."""
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # nothing of a response written yet
            body = _error_body(message, kind)
            headers = [*self.server_state.default_headers, (b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
            try:
                for event in (h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status]),
                              h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:  # the connection is in no state to answer: it is closed all the same
                pass
        self.transport.close()

    # ----------------------------------------------------------------------------------------- the app

    async def _serve(self, scope, receive, send) -> None:
        """The app, with the body's time limit in the scope and the JSON 503 past the concurrency limit (counted
        as uvicorn counts it: this connection and this request included)."""
        if scope["type"] == "http":
            scope.setdefault("extensions", {})[BODY_TIMEOUT_KEY] = self.config.body_timeout_s
        limit = self.config.limit_concurrency
        if limit and (len(self.connections) > limit or len(self.tasks) > limit):
            log.warning("over the concurrency limit (%d): answered 503", limit)
            body = _error_body(f"the server is at its limit of {limit} connections and requests; try again",
                               "server_unavailable")
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()), (b"retry-after", b"1"),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self._app(scope, receive, send)


class EdgeServer(uvicorn.Server):
    """uvicorn's Server with a bounded shutdown that stops `worker`'s jobs (the module docstring says how). The
    app's lifespan stops the worker afterwards, as under uvicorn's own Server."""

    config: EdgeConfig

    def __init__(self, config: EdgeConfig, worker: WorkerBase):
        super().__init__(config)
        self.worker = worker

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        log.info("Shutting down")
        for server in self.servers:
            server.close()  # no new connections
        for sock in sockets or []:
            sock.close()
        self.worker.begin_shutdown()  # requests on open connections: 503
        for connection in list(self.server_state.connections):
            if not connection.transport.is_closing():  # one closing may be past answering (h11 would refuse)
                connection.shutdown()  # idle connections close, busy ones after their response
        limit = self.config.timeout_graceful_shutdown
        if not await self._settled(limit):
            running = len(self.server_state.tasks)
            log.warning("%d request(s) still running after %g s: stopping their jobs", running, limit)
            for connection in self._edge_connections():
                if connection.receiving_body():
                    connection.answer_and_close(503, SHUTTING_DOWN, "server_unavailable")
            self.worker.abort(SHUTTING_DOWN)  # their handlers answer 503
            if not await self._settled(ABORT_GRACE_S):
                log.error("closing %d connection(s) without their app's answer", len(self.server_state.connections))
                for connection in self._edge_connections():
                    connection.answer_and_close(503, SHUTTING_DOWN, "server_unavailable")
                for task in list(self.server_state.tasks):
                    task.cancel()
                if self.server_state.tasks:
                    await asyncio.wait(list(self.server_state.tasks), timeout=1.0)
        for server in self.servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 1.0)
            except asyncio.TimeoutError:
                pass
        if not self.force_exit:
            await self.lifespan.shutdown()

    def _edge_connections(self) -> list[EdgeProtocol]:
        return [c for c in list(self.server_state.connections) if isinstance(c, EdgeProtocol)]

    async def _settled(self, seconds: float) -> bool:
        """Wait up to `seconds` for every connection to close and every request to finish; False if some remain
        (or a second Ctrl+C asked to stop waiting)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        state = self.server_state
        while state.connections or state.tasks:
            if self.force_exit or loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True
