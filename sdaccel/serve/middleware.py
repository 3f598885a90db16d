"""The HTTP layer's edges: the JSON error body every refusal gets, the exception handlers that map the worker's and
pipeline's errors to statuses, and the ASGI middleware in front of every route (API key, body size limit, request
metrics, one JSON log line per request, the time limit on a request's body)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import math
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ..errors import UsageError
from .jobs import CancelledJobError, DeadlineExceededError, NoWorkerError, QueueFullError
from .metrics import Metrics
from .schemas import Limits

log = logging.getLogger("sdaccel.serve.http")
OPEN_PATHS = ("/", "/health", "/ready")  # without the API key: the page (its calls send the key), probes
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away: logged and counted, never sent
# scope["extensions"][BODY_TIMEOUT_KEY]: seconds a request's body may take after its head (the server's
# --body-timeout, http_server.py); past it the Gate answers 408 and the connection closes
BODY_TIMEOUT_KEY = "sdaccel.body_timeout_s"

class ApiError(Exception):
    """A request the server refuses: its status, message and error type, as the JSON error body says."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def error_response(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status, headers=headers)




class ClientGone(Exception):
    """The client disconnected while its jobs waited or ran."""



def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.kind, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
        return error_response(422, "; ".join(parts) or "invalid request", "invalid_request_error")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        kind = {401: "authentication_error", 404: "not_found_error", 408: "timeout_error",
                413: "request_too_large"}.get(
            exc.status_code, "invalid_request_error")
        return error_response(exc.status_code, str(exc.detail), kind, getattr(exc, "headers", None))

    @app.exception_handler(UsageError)
    async def usage_error(request: Request, exc: UsageError):
        return error_response(400, str(exc), "invalid_request_error")

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, exc: QueueFullError):
        return error_response(429, str(exc), "rate_limit_error", {"Retry-After": str(math.ceil(exc.retry_after_s))})

    @app.exception_handler(DeadlineExceededError)
    async def deadline(request: Request, exc: DeadlineExceededError):
        return error_response(503, str(exc), "timeout_error")

    @app.exception_handler(CancelledJobError)
    async def cancelled(request: Request, exc: CancelledJobError):
        return error_response(503, str(exc), "server_unavailable")

    @app.exception_handler(NoWorkerError)
    async def no_worker(request: Request, exc: NoWorkerError):
        return error_response(503, str(exc), "server_unavailable",
                              {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(RuntimeError)
    async def unavailable(request: Request, exc: RuntimeError):
        # The worker refuses jobs while it stops or after it failed to load; a job's own failure is a 500.
        status = 503 if "shutting down" in str(exc) or "failed to start" in str(exc) else 500
        return error_response(status, str(exc), "server_unavailable" if status == 503 else "server_error")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.error("unexpected error on %s: %r", request.url.path, exc, exc_info=exc)
        return error_response(500, f"internal error: {exc.__class__.__name__}", "server_error")


# ----------------------------------------------------------------------------------------------- the gate

_ENDPOINTS = ("/v1/generate", "/v1/images/generations", "/sdapi/v1/txt2img", "/sdapi/v1/img2img",
              "/sdapi/v1/sd-models", "/sdapi/v1/options", "/sdapi/v1/progress", "/health", "/ready", "/metrics", "/")


class Gate:
    """ASGI middleware in front of every route: the API key, the body size limit and time limit (the server's, in
    the scope: BODY_TIMEOUT_KEY), the request metrics and one JSON log line per request."""

    def __init__(self, app, api_key: str | None, limits: Limits, metrics: Metrics):
        self.app, self.limits, self.metrics = app, limits, metrics
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = [500]
        state = scope.setdefault("state", {})

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        received = [0]
        body_timeout = scope.get("extensions", {}).get(BODY_TIMEOUT_KEY)
        body_deadline = [None if body_timeout is None else time.monotonic() + body_timeout]  # None: body complete

        async def receive_counted():
            if body_deadline[0] is None:
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, body_deadline[0] - time.monotonic()))
                except asyncio.TimeoutError:
                    raise HTTPException(408, f"the request body did not arrive within {body_timeout:g} s",
                                        headers={"Connection": "close"}) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_deadline[0] = None  # later reads only watch for the client going away
            if message["type"] == "http.request":
                received[0] += len(message.get("body", b""))
                if received[0] > self.limits.max_body_bytes:
                    raise HTTPException(413, f"the request body is over {self.limits.max_body_bytes} bytes")
            return message

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send_status)
            else:
                await self.app(scope, receive_counted, send_status)
        finally:
            seconds = time.perf_counter() - started
            path = scope["path"]
            self.metrics.request_done(path if path in _ENDPOINTS else "other", status[0], seconds)
            log.info(json.dumps({"method": scope["method"], "path": path, "status": status[0],
                                 "ms": round(seconds * 1000, 1), "images": state.get("images", 0)}))

    def _refusal(self, scope) -> Response | None:
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        if self.key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(headers):
            return error_response(401, "missing or wrong API key: send 'Authorization: Bearer KEY' or 'X-API-Key: "
                                       "KEY'", "authentication_error", {"WWW-Authenticate": "Bearer"})
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limits.max_body_bytes:
            return error_response(413, f"the request body is {int(length)} bytes; the limit is "
                                       f"{self.limits.max_body_bytes}", "request_too_large")
        return None

    def _authorized(self, headers: dict[str, bytes]) -> bool:
        return has_key(headers, self.key)


def has_key(headers: dict[str, bytes], key: bytes) -> bool:
    """The request's headers ({lower-case name: value}) carry `key`: as a Bearer token, as Basic auth's password,
    or as X-API-Key; compared in constant time."""
    given = []
    auth = headers.get("authorization", b"")
    scheme, _, value = auth.partition(b" ")
    if scheme.lower() == b"bearer":
        given.append(value.strip())
    elif scheme.lower() == b"basic":  # A1111 clients' --api-auth: any user name, the key as password
        try:
            given.append(base64.b64decode(value.strip(), validate=True).partition(b":")[2])
        except (binascii.Error, ValueError):
            pass
    if "x-api-key" in headers:
        given.append(headers["x-api-key"].strip())
    return any(hmac.compare_digest(candidate, key) for candidate in given)
