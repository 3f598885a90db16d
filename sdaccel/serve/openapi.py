"""The OpenAPI schema of `sdaccel serve` (GET /openapi.json, /docs): every status each route can answer, declared
once here (ROUTES), each refusal with the one error body (schemas.ErrorBody: {error: {message, type}}), the 422 of
a body or parameter of the wrong type included (the server answers it with that body, not FastAPI's {detail: [...]}).

Besides a route's own statuses, every route can get the edge's (EDGE): 408 for a request head or body that arrives
too slowly (http_server.py, middleware.Gate), 413 for a body over the limit (the Gate, on any request), 503 past the
connection limit or while shutting down (http_server.py); and 401 on every path but the open ones when the server
has an API key (documented whether or not one is set: the schema does not change with it). 499 (a client that went
away) is logged, never sent.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from .middleware import OPEN_PATHS
from .schemas import ErrorBody, ProbeBody

REASONS = {
    400: "Bad request: a setting out of range or over the server's limits, a field, option or query parameter "
         "sdaccel does not honour, an image or body it cannot read",
    401: "Missing or wrong API key (a server started with --api-key): send 'Authorization: Bearer KEY' or "
         "'X-API-Key: KEY'",
    404: "Unknown model: the request names a model this server does not serve",
    408: "The request's head or body arrived too slowly (--header-timeout, --body-timeout)",
    413: "The request body is over the server's limit",
    422: "The body or a query parameter does not have the declared type or shape",
    429: "The queue is full: retry after Retry-After seconds",
    503: "Unavailable: loading, shutting down, no worker alive, over the connection limit, or the request's time "
         "budget (--timeout) ran out; Retry-After (seconds) where the server knows when to retry",
}

EDGE = (408, 413, 503)  # any request: too slow, too large, over the connection limit or shutting down
BODY = (400, 422)  # a route reading a JSON body: unreadable or refused (400), of a wrong type or shape (422)
GENERATION = (*BODY, 404, 429)  # and the worker's: an unknown model, a full queue

# (method, path) -> the statuses it answers besides 200 and EDGE's (and 401): every route of the app is here.
ROUTES: dict[tuple[str, str], tuple[int, ...]] = {
    ("POST", "/v1/generate"): GENERATION,
    ("POST", "/v1/images/generations"): GENERATION,
    ("POST", "/sdapi/v1/txt2img"): GENERATION,
    ("POST", "/sdapi/v1/img2img"): GENERATION,
    ("GET", "/sdapi/v1/sd-models"): (),
    ("GET", "/sdapi/v1/options"): (),
    ("POST", "/sdapi/v1/options"): (*BODY, 404),  # an unknown checkpoint
    ("GET", "/sdapi/v1/embeddings"): (),  # 503 while the models load
    ("GET", "/sdapi/v1/upscalers"): (),
    ("GET", "/sdapi/v1/latent-upscale-modes"): (),
    ("GET", "/sdapi/v1/samplers"): (),
    ("GET", "/sdapi/v1/schedulers"): (),
    ("GET", "/sdapi/v1/prompt-styles"): (),
    ("GET", "/sdapi/v1/sd-vae"): (),
    ("GET", "/sdapi/v1/memory"): (),
    ("POST", "/sdapi/v1/png-info"): BODY,
    ("GET", "/sdapi/v1/progress"): (400, 422),  # an unknown query parameter; skip_current_image not a boolean
    ("POST", "/sdapi/v1/interrupt"): (400,),  # a query parameter (it takes none)
    ("POST", "/sdapi/v1/skip"): (400,),
    ("GET", "/sdapi/v1/loras"): (),
    ("POST", "/sdapi/v1/refresh-loras"): (),
    ("GET", "/controlnet/model_list"): (),
    ("GET", "/controlnet/module_list"): (),
    ("GET", "/health"): (),  # 503: no worker can serve
    ("GET", "/ready"): (),  # 503: none is ready yet
    ("GET", "/metrics"): (),
}

_ERROR = {"$ref": "#/components/schemas/ErrorBody"}
_PROBE = {"$ref": "#/components/schemas/ProbeBody"}
# Routes whose answers are not the defaults (JSON for 200, ErrorBody for the rest): (method, path) -> {status:
# {media type: schema}}.
CONTENT: dict[tuple[str, str], dict[int, dict[str, dict[str, Any]]]] = {
    ("POST", "/v1/generate"): {200: {"application/json": {"schema": {}},  # response_format "png": the image
                                     "image/png": {"schema": {"type": "string", "format": "binary"}}}},
    ("GET", "/metrics"): {200: {"text/plain": {"schema": {"type": "string"}}}},  # Prometheus' text format
    # the probe's own answer; a 503 of the edge is the error body
    ("GET", "/health"): {200: {"application/json": {"schema": _PROBE}},
                         503: {"application/json": {"schema": {"anyOf": [_PROBE, _ERROR]}}}},
    ("GET", "/ready"): {200: {"application/json": {"schema": _PROBE}},
                        503: {"application/json": {"schema": {"anyOf": [_PROBE, _ERROR]}}}},
}

_RETRY_AFTER = {"description": "Seconds to wait before retrying", "schema": {"type": "integer", "minimum": 0}}
HEADERS: dict[int, dict[str, dict[str, Any]]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "required": True, "schema": {"type": "string"}}},
    429: {"Retry-After": dict(_RETRY_AFTER, required=True)},
    503: {"Retry-After": dict(_RETRY_AFTER, required=False)},
}


def route_statuses(method: str, path: str) -> tuple[int, ...]:
    """Every status the route answers, 200 first: its own (ROUTES), the edge's, and 401 off the open paths."""
    own = ROUTES.get((method, path))
    if own is None:
        raise KeyError(f"{method} {path} is not in sdaccel.serve.openapi.ROUTES: declare the statuses it answers")
    key = () if path in OPEN_PATHS else (401,)
    return (200, *sorted(set(own) | set(EDGE) | set(key)))


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (FastAPI's) with every operation's statuses (route_statuses), each error with ErrorBody; FastAPI's
    own 422 body (HTTPValidationError), which this server never sends, dropped."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (ErrorBody, ProbeBody):
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            key = (method.upper(), path)
            content = CONTENT.get(key, {})
            answers = {"200": operation["responses"].get("200", {"description": "Successful Response"})}
            if 200 in content:
                answers["200"]["content"] = content[200]
            for status in route_statuses(*key)[1:]:
                answers[str(status)] = {"description": REASONS[status],
                                        "content": content.get(status, {"application/json": {"schema": _ERROR}}),
                                        **({"headers": HEADERS[status]} if status in HEADERS else {})}
            operation["responses"] = answers
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    return schema


def install_openapi(app: FastAPI) -> None:
    """The app's /openapi.json made by document_errors (once, on the first call, as FastAPI caches its own)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_errors(generate())
        return app.openapi_schema

    app.openapi = openapi
