"""The OpenAPI document (`/openapi.json`, `/docs`, `/redoc`): the wire as the routes really take it.

The generation routes read their raw bodies on purpose (our own error messages, the hostile-JSON
guard), so FastAPI cannot infer their bodies. Each route names its body, its replies and its
error family with `operation(...)` (passed as `openapi_extra`), and `document()` places the JSON
schemas of the pydantic wire models — the very models that validate the requests — under
`components/schemas`, with the reply models of api/openapi_models.py. Nothing here changes how a
request is validated: the document only describes it.

Corrections to what FastAPI generates on its own: its 422 `HTTPValidationError` replies are
dropped (our validation errors are 400s in the route's own error shape), optional query
parameters are plain types (a query string has no null), and the security schemes say which
header carries the key (optional in open mode, as the server is then).
"""

from __future__ import annotations

import copy
import enum
from typing import Any

from fastapi import FastAPI, Query
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from sluice.api.anthropic.batch_schema import BatchCreate
from sluice.api.anthropic.convert import VERSIONS
from sluice.api.anthropic.schema import CountTokensRequest, MessagesRequest
from sluice.api.headers import BACKGROUND_HEADER, CACHE_HEADER, IDEMPOTENCY_HEADER, QUEUE_TIMEOUT_HEADER
from sluice.api.openai.completions_schema import CompletionRequest
from sluice.api.openai.schema import ChatCompletionRequest
from sluice.api.openai.tokenize_schema import DetokenizeRequest, TokenizeRequest
from sluice.api.openapi_models import RESPONSE_MODELS
from sluice.config import Settings

REF = "#/components/schemas/{model}"
# rules the routes check in their own words (api/anthropic/prompt.py, batches.py), stated for schema readers
RULES = (
    ("MessagesRequest", "messages", "minItems", 1),  # "messages: at least one message is required"
    ("CountTokensRequest", "messages", "minItems", 1),
    ("TextBlock", "text", "minLength", 1),  # "text content blocks must be non-empty"
    ("BatchItem", "custom_id", "pattern", "^[A-Za-z0-9_-]{1,64}$"),  # api/anthropic/batches.py CUSTOM_ID
)
LENIENT_MODELS = (
    "MessagesRequest",
    "CountTokensRequest",
    "ChatCompletionRequest",
    "CompletionRequest",
)  # reject_unknown_fields = false


class Family(str, enum.Enum):
    """Which error shape a route answers with (api/errors.py: `is_openai_path`)."""

    ANTHROPIC = "AnthropicError"
    OPENAI = "OpenAIError"


_WHY = {
    400: "invalid request (bad JSON, a wrong or unknown field, a value out of range)",
    401: "missing or invalid API key",
    403: "blocked by a safety policy",
    404: "unknown model, stream, batch or route",
    408: "the request's headers or body did not arrive in time",
    409: "a request with this Idempotency-Key is still in progress",
    413: "the body is over `max_body_bytes`",
    422: "this Idempotency-Key was used with a different request body",
    429: "a rate limit of this key (with `retry-after`)",
    431: "the request headers are over `max_header_bytes`",
    500: "a fault on the server's side (the details are in its log)",
    503: "too many connections are still sending their requests",
    504: "the request took longer than `request_timeout_s`",
    529: "overloaded: the queue is full, no engine can serve, or the server is draining (with `retry-after`)",
}
# what any route can answer: the read guard and body limits run before routing, auth on every /v1 route
COMMON = (400, 401, 408, 413, 431, 500, 503)
GENERATION = (*COMMON, 403, 404, 409, 422, 429, 504, 529)
LOOKUP = (*COMMON, 404)
ENGINE = (*LOOKUP, 529)  # needs the model (count_tokens, batch create)


def header(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema, "description": description}


ANTHROPIC_VERSION = header(
    "anthropic-version",
    {"type": "string", "enum": list(VERSIONS)},
    "the API version; a missing header means `default_anthropic_version`",
)
IDEMPOTENCY_KEY = header(
    IDEMPOTENCY_HEADER,
    {"type": "string", "minLength": 1, "maxLength": 257},
    "a retry with the same key and body within `idempotency_ttl_s` gets the first attempt's response "
    "(a stream: attaches to it) and is not generated or charged again (docs/API.md)",
)
SLUICE_HEADERS = [
    header(
        QUEUE_TIMEOUT_HEADER, {"type": "number", "exclusiveMinimum": 0}, "seconds this request may wait for admission"
    ),
    header(CACHE_HEADER, {"type": "string"}, "`bypass`: skip the response cache"),
]
BACKGROUND = header(BACKGROUND_HEADER, {"type": "string"}, "`true`: keep generating after a disconnect (resume)")
LAST_EVENT_ID = header("Last-Event-ID", {"type": "string"}, "`<message id>:<seq>`: resume after that event")


def limit() -> Any:
    """The `limit` query parameter of list pages; its range is checked by api/pagination.py (a 400
    in our words), so the bounds are only stated here."""
    return Query(20, json_schema_extra={"minimum": 1, "maximum": 1000})


def operation(
    family: Family,
    *,
    body: str | None = None,
    ok: str | None = None,
    stream: bool = False,
    media: str | None = None,
    errors: tuple[int, ...] = COMMON,
    params: list[dict[str, Any]] | None = None,
    public: bool = False,
) -> dict[str, Any]:
    """One route's `openapi_extra`: its body (a component name), its 200 reply (a JSON component,
    and/or SSE with `stream`, or another `media` type), its error statuses in `family`'s shape."""
    content: dict[str, Any] = {}
    if ok is not None:
        content["application/json"] = {"schema": {"$ref": REF.format(model=ok)}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string", "description": "server-sent events"}}
    if media is not None:
        content[media] = {"schema": {"type": "string"}}
    error = {"application/json": {"schema": {"$ref": REF.format(model=family.value)}}}
    if public:  # no key is asked for
        errors = tuple(s for s in errors if s != 401)
    out: dict[str, Any] = {
        "responses": {
            "200": {"description": "OK", "content": content},
            **{str(s): {"description": _WHY[s], "content": error} for s in errors},
        },
    }
    if body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=body)}}},
        }
    if params:
        out["parameters"] = params
    if public:
        out["security"] = []
    return out


def generation(family: Family, body: str, ok: str, params: list[dict[str, Any]]) -> dict[str, Any]:
    """A generation route's `openapi_extra`: a JSON reply or, asked for, a stream, and the
    generation's error statuses."""
    return operation(family, body=body, ok=ok, stream=True, errors=GENERATION, params=params)


# probes and metrics: no key, no request body
HEALTH = operation(Family.ANTHROPIC, ok="Health", public=True)
READY = operation(Family.ANTHROPIC, ok="Readiness", public=True)
READY["responses"]["503"] = {  # not ready (a Readiness body), or the read guard's 503 (an error body)
    "description": "not ready (loading, failed: <why>, draining, unavailable: <why>), or " + _WHY[503],
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [{"$ref": REF.format(model="Readiness")}, {"$ref": REF.format(model=Family.ANTHROPIC.value)}]
            }
        }
    },
}
METRICS = operation(Family.ANTHROPIC, media="text/plain", public=True)


def document(app: FastAPI, settings: Settings, open_access: bool) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = doc.setdefault("components", {})
    schemas: dict[str, Any] = components.setdefault("schemas", {})

    requests: tuple[type[BaseModel], ...] = (
        MessagesRequest,
        CountTokensRequest,
        BatchCreate,
        ChatCompletionRequest,
        CompletionRequest,
        TokenizeRequest,
        DetokenizeRequest,
    )
    _, defs = models_json_schema(
        [(m, "validation") for m in requests] + [(m, "serialization") for m in RESPONSE_MODELS], ref_template=REF
    )
    schemas.update(defs["$defs"])
    for component, prop, keyword, value in RULES:
        schemas[component]["properties"][prop][keyword] = value
    # a batch item's params are a Messages body (always strict, never a stream), checked after the
    # envelope: the envelope model types them as a plain object
    params = copy.deepcopy(schemas["MessagesRequest"])
    params["title"] = "BatchRequestParams"
    params["properties"]["stream"] = {"const": False, "default": False}
    schemas["BatchRequestParams"] = params
    schemas["BatchItem"]["properties"]["params"] = {"$ref": REF.format(model="BatchRequestParams")}
    if not settings.reject_unknown_fields:  # unknown top-level fields are dropped, not refused
        for name in LENIENT_MODELS:
            schemas[name]["additionalProperties"] = True
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path in doc.get("paths", {}).values():
        for op in path.values():
            _tidy(op)
    components["securitySchemes"] = {
        "ApiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        "Bearer": {"type": "http", "scheme": "bearer"},
    }
    doc["security"] = [{"ApiKey": []}, {"Bearer": []}] + ([{}] if open_access else [])
    return doc


def _tidy(op: dict[str, Any]) -> None:
    responses = op.get("responses", {})
    if "HTTPValidationError" in str(responses.get("422", "")):
        del responses["422"]
    for param in op.get("parameters", []):
        schema = param.get("schema", {})
        options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
        if param.get("in") == "query" and len(options) == 1:  # a query string cannot say null
            param["schema"] = {**{k: v for k, v in schema.items() if k != "anyOf"}, **options[0]}


def install(app: FastAPI, settings: Settings, open_access: bool) -> None:
    """Serve `document()` (built once, on first request) as the app's OpenAPI document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app, settings, open_access)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
