"""The search router's OpenAPI document, fuzzed as the serving API's is
(tests/unit/api/test_openapi_fuzz.py): schemathesis sends valid and invalid requests to every
operation of a real `sluice search serve` (one local shard), plus the malformed bodies `json`
accepts and the rest of a path cannot carry.

Asserted for every response: no 5xx, the status and content type are ones the document
declares, JSON bodies match the declared schemas, data the document calls invalid is refused,
and every error body is the API's one shape `{"error": {"type", "message"}}` (/ready's 503 is
a readiness report, declared as such).

Bounded as the serving fuzz test is (`SLUICE_FUZZ_EXAMPLES`, default 12 per operation,
derandomized so a failure reproduces; `SLUICE_FUZZ_RANDOM=1` for a new seed each run).
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, reject, settings

from sluice.search.errors import SearchErrorKind
from sluice.search.router.config import parse_config
from sluice.search.router.http.app import create_router_app
from sluice.search.router.runtime import RouterRuntime
from tests.system.search.cluster import start_router

EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "12"))
RANDOM = os.environ.get("SLUICE_FUZZ_RANDOM") == "1"
CONFIG = '[[shards]]\nname = "only"\n'
KINDS = {k.value for k in SearchErrorKind}

# the document needs no shard: read at collection from the same code the router serves
_cfg = parse_config(CONFIG)
schema = schemathesis.openapi.from_dict(
    create_router_app(RouterRuntime(_cfg, [["http://127.0.0.1:9"]])).openapi(),
    config=schemathesis.Config.from_dict(
        {
            "generation": {"mode": "all", "max-examples": EXAMPLES, "allow-extra-parameters": False},
            "phases": {"examples": {"enabled": False}, "stateful": {"enabled": False}},
        }
    ),
)


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value) -> bytes:
    """The bulk body is text, sent as is."""
    return value.encode()


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    r = start_router(tmp_path_factory.mktemp("fuzz"), CONFIG)
    try:
        yield r
    finally:
        r.stop()


def error_shape(ctx, response, case) -> None:
    if response.status_code < 400 or (case.operation.path == "/ready" and "status" in response.text):
        return None
    if case.operation.path == "/v1/search/documents" and response.status_code == 503:
        return None  # a write answer naming the shards not written (declared with BulkResponse)
    body = response.json()
    assert set(body) == {"error"} and body["error"]["type"] in KINDS and isinstance(body["error"]["message"], str), body
    assert response.headers.get("content-type", [""])[0].startswith("application/json")
    return None


CHECKS = [
    *(
        getattr(schemathesis.checks, name)
        for name in (
            "not_a_server_error",
            "status_code_conformance",
            "content_type_conformance",
            "response_schema_conformance",
            "negative_data_rejection",
        )
    ),
    error_shape,
]


@schema.parametrize()
@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None, suppress_health_check=list(HealthCheck)
)
def test_every_operation_no_5xx_and_error_shapes(case, router):
    if case.operation.path == "/v1/search/documents" and not isinstance(case.body, str):
        reject()  # a "wrong type" for NDJSON text has no form on the wire: not a request
    # a generous bound, not a speed check (a timeout fails the case, as a 5xx would)
    case.call_and_validate(base_url=router.url, checks=CHECKS, timeout=120)
