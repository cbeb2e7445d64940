"""A schema-driven fuzz test: schemathesis reads /openapi.json and sends valid and invalid
requests to every operation of the real ASGI app (every route, the gateway, safety, the replay
log), backed by a scripted engine, so it needs no model and runs in the normal suite.

Asserted for every response: no 5xx, the status and content type are ones the document
declares, JSON bodies match the declared schemas, data the document calls invalid is refused,
and every error body has the API's error shape for its route family (Anthropic's
`{"type": "error", "error": {...}}` or OpenAI's `{"error": {...}}`).

Bounded here (`SLUICE_FUZZ_EXAMPLES`, default 12 per operation, derandomized so a failure
reproduces); `make fuzz` runs a longer, randomized pass.
"""

from __future__ import annotations

import os
import zlib

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from sluice.api.errors import is_openai_path
from sluice.api.openapi_models import AnthropicError, OpenAIError
from sluice.types import INT32_MAX
from tests.fake_engine import Script
from tests.fuzz_app import MODEL, ReadyOnFirstRequest, unready_app

EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "12"))
RANDOM = os.environ.get("SLUICE_FUZZ_RANDOM") == "1"  # make fuzz: a new seed each run


# The document needs no engine, so the schema is read at collection (one test per operation);
# the engine is scripted in by the fixture below. Safety on: the input rules and the stream
# guard see the fuzzed text.
APP, RUNTIME = unready_app(safety=True)
SERVED = ReadyOnFirstRequest(APP, RUNTIME)
schema = schemathesis.openapi.from_dict(
    APP.openapi(),
    config=schemathesis.Config.from_dict(
        {
            # extra parameters are not "invalid": HTTP servers take headers they do not know
            "generation": {"mode": "all", "max-examples": EXAMPLES, "allow-extra-parameters": False},
            "phases": {"examples": {"enabled": False}, "stateful": {"enabled": False}},
            "max-stream-events": 64,
        }
    ),
)
schema.app = SERVED


@pytest.fixture(scope="module", autouse=True)
def engine(tiny_llama_dir):
    SERVED.ready = {"tiny_dir": tiny_llama_dir, "script": Script(texts=["Hi", " there"]), "max_model_len": 1 << 16}


def _header(response, name: str) -> str:
    values = response.headers.get(name) or [""]  # schemathesis keeps every value of a header
    return values[0]


def error_shape(ctx, response, case) -> None:
    """Every 4xx/5xx body is the error shape of its route family (/ready's 503 is a readiness
    report, declared as such)."""
    if response.status_code < 400 or (case.operation.path == "/ready" and "status" in response.text):
        return None
    body = response.json()
    if is_openai_path(case.operation.path):
        OpenAIError.model_validate(body)
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    else:
        AnthropicError.model_validate(body)
        assert body["type"] == "error" and body["request_id"] == _header(response, "request-id"), body
    assert _header(response, "content-type").startswith("application/json")
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


def aim(case) -> None:
    """Point the generated requests at what exists, so most reach the engine instead of stopping
    at "no such model": a string `model` becomes the served one (a mistyped `model`, a negative
    case, stays as it is), `max_tokens` fits the context, and half the model and message ids
    name real ones. A rewrite never turns an invalid value valid: the case stays what it was generated as."""
    body = case.body
    nullable = None if case.operation.path == "/v1/chat/completions" else ""  # OpenAI content may be null
    if isinstance(body, dict):
        for params in [body] + [r.get("params") for r in body.get("requests") or () if isinstance(r, dict)]:
            if isinstance(params, dict):
                if isinstance(params.get("model"), str):
                    params["model"] = MODEL
                if type(params.get("max_tokens")) is int and 0 < params["max_tokens"] <= INT32_MAX:
                    params["max_tokens"] = params["max_tokens"] % 64 + 1
                for message in params.get("messages") or ():  # content the routes would call empty
                    if isinstance(message, dict) and "content" in message and message["content"] in ("", nullable):
                        message["content"] = "hello"
    path = case.path_parameters or {}
    if "model_id" in path and zlib.crc32(repr(path).encode()) % 2:
        path["model_id"] = MODEL


@schema.parametrize()
@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None, suppress_health_check=list(HealthCheck)
)
def test_every_operation_no_5xx_and_error_shapes(case):
    aim(case)
    # a generous bound, not a speed check: on a loaded machine one call may take well over
    # schemathesis' default 10 s read timeout (a timeout here fails the case, as a 5xx would)
    case.call_and_validate(checks=CHECKS, timeout=120)
