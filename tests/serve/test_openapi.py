"""`sdaccel serve`'s OpenAPI schema: every route documents the statuses it can answer, each error with the one error
body ({error: {message, type}}), and a request that gets each status gets what the schema says for its route
(status, media type, body, headers); and A1111 values that were a 500 or were accepted without effect are 400s.
Fast: the app on a Worker that is never started (no model loads), whose queue answers as each case needs."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future

import pytest

pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")

from fastapi import FastAPI  # noqa: E402

from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.jobs import DeadlineExceededError, NoWorkerError, QueueFullError  # noqa: E402
from sdaccel.serve.middleware import BODY_TIMEOUT_KEY  # noqa: E402
from sdaccel.serve.openapi import install_openapi  # noqa: E402
from sdaccel.serve.schemas import Limits  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402

KEY = "k-123"
GENERATION = {("post", "/v1/generate"), ("post", "/v1/images/generations"), ("post", "/sdapi/v1/txt2img"),
              ("post", "/sdapi/v1/img2img")}


class QueueStub(Worker):
    """The in-process Worker, never started: `ready` as given, and every job that passes its checks answered by
    `refuse` (raised at submit) or `fail` (its future's error)."""

    def __init__(self, *, ready: bool = True, refuse: BaseException | None = None,
                 fail: BaseException | None = None):
        super().__init__({"tiny": "synthetic:sd15-tiny", "other": "synthetic:sd15-tiny"})
        self.is_ready, self.refuse, self.fail = ready, refuse, fail or QueueFullError(1)

    def ready(self) -> bool:
        return self.is_ready

    def _enqueue(self, job) -> Future:
        if self.refuse is not None:
            raise self.refuse
        future = Future()
        future.set_exception(self.fail)
        return future


def app_on(worker=None, **kwargs) -> FastAPI:
    return create_app(worker or QueueStub(), limits=Limits(max_body_bytes=4096, max_n=2), **kwargs)


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)


def call(app, method: str, path: str, body=None, *, query: str = "", headers: dict[str, str] | None = None,
         stall: bool = False, body_timeout_s: float | None = None) -> Answer:
    """The app's answer to one request, as the server's edge hands it over (its body-time limit in the scope);
    `stall`: the client sends its head, then nothing."""
    raw = b"" if body is None else json.dumps(body).encode()
    head = {"content-type": "application/json", "content-length": str(len(raw)), **(headers or {})}
    messages = [] if stall else [{"type": "http.request", "body": raw, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a client that sends nothing more (and stays connected)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query.encode(),
             "headers": [(k.lower().encode(), v.encode()) for k, v in head.items()],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80), "state": {},
             "extensions": {} if body_timeout_s is None else {BODY_TIMEOUT_KEY: body_timeout_s}}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return Answer(start["status"], {k.decode().lower(): v.decode() for k, v in start.get("headers", [])},
                  b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


def assert_documented(spec: dict, method: str, path: str, answer: Answer) -> None:
    """The answer is one the schema documents for the operation: its status, its media type, its body against the
    documented schema, the headers the schema requires."""
    responses = spec["paths"][path][method.lower()]["responses"]
    assert str(answer.status) in responses, f"{method} {path}: {answer.status} is not documented ({list(responses)})"
    documented = responses[str(answer.status)]
    media = answer.headers.get("content-type", "").split(";")[0].strip()
    assert media in documented["content"], f"{method} {path} {answer.status}: {media} not in {documented['content']}"
    schema = documented["content"][media]["schema"]
    if media == "application/json":
        root = {**schema, "components": spec["components"]}  # its $refs resolve against the document's components
        jsonschema.Draft202012Validator(root).validate(answer.json())
    for name, header in documented.get("headers", {}).items():
        value = answer.headers.get(name.lower())
        assert value is not None or not header.get("required"), f"{answer.status}: the {name} header is missing"
        if value is not None and header["schema"].get("type") == "integer":
            assert value.isdigit(), f"{name}: {value!r}"


@pytest.fixture(scope="module")
def spec():
    return app_on().openapi()


# ------------------------------------------------------------------------------------------------ the schema

def test_every_route_documents_the_edge_statuses_and_401_with_the_error_body(spec):
    operations = [(m, p, op) for p, ops in spec["paths"].items() for m, op in ops.items()]
    assert len(operations) >= 26
    for method, path, op in operations:
        statuses = set(op["responses"])
        assert {"200", "408", "413", "503"} <= statuses, (method, path, statuses)
        assert ("401" in statuses) == (path not in ("/health", "/ready")), (method, path)
        for status, response in op["responses"].items():
            if status != "200" and (method, path) not in (("get", "/health"), ("get", "/ready")):
                assert response["content"] == {"application/json": {"schema": {
                    "$ref": "#/components/schemas/ErrorBody"}}}, (method, path, status)
    assert spec["components"]["schemas"]["ErrorBody"]["required"] == ["error"]
    assert set(spec["components"]["schemas"]["ErrorDetail"]["required"]) == {"message", "type"}
    assert "HTTPValidationError" not in json.dumps(spec)  # FastAPI's {detail: [...]}: never sent here


def test_generation_routes_document_every_refusal_and_retry_after(spec):
    for method, path in GENERATION:
        responses = spec["paths"][path][method]["responses"]
        assert set(responses) == {"200", "400", "401", "404", "408", "413", "422", "429", "503"}, path
        assert responses["429"]["headers"]["Retry-After"]["required"] is True
        assert "Retry-After" in responses["503"]["headers"]
        assert responses["401"]["headers"]["WWW-Authenticate"]["required"] is True
    assert set(spec["paths"]["/v1/generate"]["post"]["responses"]["200"]["content"]) == {"application/json",
                                                                                        "image/png"}
    assert set(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    # a route without parameters or body cannot answer 422
    assert "422" not in spec["paths"]["/sdapi/v1/samplers"]["get"]["responses"]
    assert "422" in spec["paths"]["/sdapi/v1/progress"]["get"]["responses"]


def test_a_route_missing_from_the_table_fails_the_schema_by_name():
    app = app_on()

    @app.get("/sdapi/v1/new-thing")
    async def new_thing():
        return {}

    with pytest.raises(KeyError, match="GET /sdapi/v1/new-thing"):
        app.openapi()


def test_the_table_names_only_routes_the_app_has(spec):
    from sdaccel.serve.openapi import ROUTES

    operations = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    assert set(ROUTES) == operations


def test_install_openapi_documents_a_bare_app():
    app = FastAPI()
    install_openapi(app)
    assert app.openapi()["components"]["schemas"]["ErrorBody"]["properties"]["error"]


# --------------------------------------------------------------------------- each status as the schema says


def case(status, method, path, body=None, worker=None, app_args=None, **request_args):
    """One request and the status it gets: `worker` makes the app's QueueStub, `app_args` go to create_app,
    `request_args` to call."""
    return pytest.param(status, method, path, body, worker, app_args or {}, request_args,
                        id=f"{status}-{method}-{path}")


STATUS_CASES = [
    case(200, "GET", "/health"),
    case(200, "GET", "/metrics"),
    case(200, "GET", "/ready"),
    case(400, "POST", "/v1/generate", {"prompt": "x", "n": 3}),  # over max_n
    case(400, "POST", "/v1/images/generations", {"prompt": "x", "quality": "hd"}),
    case(400, "POST", "/sdapi/v1/txt2img", {"prompt": "x", "tiling": True}),
    case(400, "POST", "/sdapi/v1/img2img", {"prompt": "x", "init_images": []}),
    case(400, "POST", "/sdapi/v1/options", {"sd_vae": "other.pt"}),
    case(400, "POST", "/sdapi/v1/png-info", {"image": "!!"}),
    case(400, "GET", "/sdapi/v1/progress", query="x=1"),
    case(400, "POST", "/sdapi/v1/interrupt", query="x=1"),
    case(401, "GET", "/metrics", app_args={"api_key": KEY}),
    case(401, "POST", "/sdapi/v1/txt2img", {"prompt": "x"}, app_args={"api_key": KEY}),
    case(404, "POST", "/v1/generate", {"prompt": "x", "model": "nope"}),
    case(404, "POST", "/v1/images/generations", {"prompt": "x", "model": "nope"}),
    case(404, "POST", "/sdapi/v1/options", {"sd_model_checkpoint": "nope"}),
    case(408, "POST", "/v1/generate", stall=True, body_timeout_s=0.05),
    case(413, "POST", "/sdapi/v1/txt2img", headers={"content-length": "5000"}),
    case(413, "GET", "/health", headers={"content-length": "5000"}),
    case(422, "POST", "/v1/generate", {"prompt": 5}),
    case(422, "POST", "/sdapi/v1/txt2img", headers={"content-type": "text/plain"}),
    case(422, "GET", "/sdapi/v1/progress", query="skip_current_image=maybe"),
    case(429, "POST", "/sdapi/v1/txt2img", {"prompt": "x"}, lambda: QueueStub(refuse=QueueFullError(2.5))),
    case(503, "POST", "/v1/generate", {"prompt": "x"},
         lambda: QueueStub(refuse=RuntimeError("the server is shutting down"))),
    case(503, "POST", "/v1/images/generations", {"prompt": "x"},
         lambda: QueueStub(refuse=NoWorkerError("every worker process exited", 2))),
    case(503, "POST", "/v1/generate", {"prompt": "x"},
         lambda: QueueStub(fail=DeadlineExceededError("waited past its deadline"))),
    case(503, "GET", "/ready", worker=lambda: QueueStub(ready=False)),
    case(503, "GET", "/ready", worker=lambda: QueueStub(ready=False), app_args={"api_key": KEY}),  # status only
    case(503, "GET", "/sdapi/v1/embeddings", worker=lambda: QueueStub(ready=False)),
]


@pytest.mark.parametrize("status, method, path, body, worker, app_args, request_args", STATUS_CASES)
def test_each_status_is_answered_as_the_schema_documents(status, method, path, body, worker, app_args,
                                                        request_args):
    app = app_on(worker() if worker else None, **app_args)
    answer = call(app, method, path, body, **request_args)
    assert answer.status == status, answer.body[:300]
    assert_documented(app.openapi(), method, path, answer)
    if status == 429:
        assert answer.headers["retry-after"] == "3"
    if status == 401:
        assert answer.headers["www-authenticate"] == "Bearer"


# ------------------------------------------------------------------------- values that were a 500 or slipped by

def test_an_empty_checkpoint_hash_names_no_model():
    """' [00]' is a title's hash without its name: an unknown checkpoint (404), not the default model."""
    answer = call(app_on(), "POST", "/sdapi/v1/txt2img",
                  {"prompt": "x", "override_settings": {"sd_model_checkpoint": " [00]"}})
    assert answer.status == 404 and "unknown model" in answer.json()["error"]["message"], answer.body


@pytest.mark.parametrize("checkpoint", [5, ["tiny"], {"title": "tiny"}], ids=["int", "list", "dict"])
def test_a_checkpoint_that_is_not_a_title_is_a_400_naming_it(checkpoint):
    """override_settings.sd_model_checkpoint of another type than a string: a 400 naming the field (it was a 500,
    a TypeError in the title's lookup)."""
    app = app_on()
    answer = call(app, "POST", "/sdapi/v1/txt2img",
                  {"prompt": "x", "override_settings": {"sd_model_checkpoint": checkpoint}})
    assert answer.status == 400, answer.body
    assert "override_settings.sd_model_checkpoint" in answer.json()["error"]["message"]
    assert_documented(app.openapi(), "POST", "/sdapi/v1/txt2img", answer)


@pytest.mark.parametrize("blur", [1e300, -3, float("nan")], ids=["huge", "negative", "nan"])
def test_an_inpainting_mask_blur_out_of_range_is_a_400(blur):
    """A1111 img2img's mask_blur beyond 0..1024 (the pipeline's range): 1e300 was a 500 (PIL's blur radius
    overflowed), -3 and NaN ran without a blur."""
    image = _png("RGB", (32, 32), (200, 10, 10))
    answer = call(app_on(), "POST", "/sdapi/v1/img2img", {"prompt": "x", "init_images": [image],
                                                          "mask": _png("L", (32, 32), 255), "mask_blur": blur})
    assert answer.status == 400, answer.body
    assert answer.json()["error"]["message"].startswith("mask_blur must be a number of pixels from 0 to 1024")


def test_a_subseed_past_the_range_for_the_batch_is_refused_before_any_job_is_queued():
    """A1111's images take subseed, subseed + 1, ...: the last one past the range is the request's 400, naming the
    count, before its first job is queued."""
    worker = QueueStub()
    submitted = []
    worker._enqueue = lambda job: submitted.append(job) or Future()
    answer = call(app_on(worker), "POST", "/sdapi/v1/txt2img",
                  {"prompt": "x", "batch_size": 2, "subseed_strength": 0.5, "subseed": 2**63 - 2, "seed": 1})
    assert answer.status == 400 and "for 2 images" in answer.json()["error"]["message"], answer.body
    assert submitted == []


def _png(mode: str, size: tuple[int, int], color) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_a_clip_skip_option_the_checkpoint_cannot_run_is_refused_when_set():
    """POST /options CLIP_stop_at_last_layers past the checkpoint's text encoder layers (the tiny model has 2): a
    400 then, the option unchanged, rather than a 200 that makes every later txt2img a 400."""
    app = app_on()
    answer = call(app, "POST", "/sdapi/v1/options", {"CLIP_stop_at_last_layers": 12})
    assert answer.status == 400 and "CLIP_stop_at_last_layers 12" in answer.json()["error"]["message"], answer.body
    assert_documented(app.openapi(), "POST", "/sdapi/v1/options", answer)
    assert call(app, "GET", "/sdapi/v1/options").json()["CLIP_stop_at_last_layers"] == 1
    assert call(app, "POST", "/sdapi/v1/options", {"CLIP_stop_at_last_layers": 2}).status == 200
    assert call(app, "GET", "/sdapi/v1/options").json()["CLIP_stop_at_last_layers"] == 2
