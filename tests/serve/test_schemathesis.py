"""`sdaccel serve`'s OpenAPI schema against the server itself: schemathesis draws requests for every operation from
the schema (valid ones and invalid ones) and sends them to the app on a real Worker (the tiny synthetic SD1.5 on the
CPU, limits so tight that every accepted job is cheap). No answer may be a 5xx, each status must be one the schema
documents for the operation, with the documented media type, headers and body (the error body on every refusal).
Bounded and reproducible: schemathesis' deterministic coverage cases and at most 15 drawn examples per operation,
drawn deterministically (about 2 minutes on 2 busy cores)."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sdaccel.serve.app import create_app  # noqa: E402
from sdaccel.serve.schemas import Limits  # noqa: E402
from sdaccel.serve.worker import Worker  # noqa: E402

pytestmark = pytest.mark.slow

# Every job a drawn request can get accepted is at most 2 images of 64x64 (4 steps by default, 2 when asked).
LIMITS = Limits(max_body_bytes=64 * 2**10, max_n=2, max_steps=2, max_side=64, max_prompt_chars=64)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def api_schema():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's calls: over 10x faster on one thread when the cores are busy
    worker = Worker({"tiny": "synthetic:sd15-tiny"}, engine="eager", device="cpu", max_batch=2, batch_window_ms=0,
                    max_queue=8)
    worker.start()
    assert worker.wait_ready(300)
    # The ASGI transport keeps the app's lifespan running until the process exits: the worker is stopped here.
    app = create_app(worker, limits=LIMITS, request_timeout_s=60, stop_worker_on_shutdown=False)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    worker.stop(drain=False)
    torch.set_num_threads(threads)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_answer_is_documented_and_none_is_a_server_error(case):
    case.call_and_validate(checks=CHECKS)
