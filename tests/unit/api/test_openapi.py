"""The OpenAPI document says what the routes do, and the defects the fuzz test found stay fixed."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from jsonschema import Draft202012Validator

from sluice.api.anthropic.batch_schema import BatchCreate
from sluice.api.anthropic.schema import MessagesRequest
from sluice.api.openai.completions_schema import CompletionRequest
from sluice.api.openai.schema import ChatCompletionRequest
from sluice.api.openai.tokenize_schema import DetokenizeRequest, TokenizeRequest
from tests.fuzz_app import MODEL, scripted_app, unready_app

BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def get(app, *paths: str) -> list[httpx.Response]:
    async def run():
        async with client(app) as c:
            return [await c.get(p) for p in paths]

    return asyncio.run(run())


@pytest.fixture(scope="module")
def doc() -> dict:
    return get(unready_app()[0], "/openapi.json")[0].json()


def test_served_by_default_and_off_with_the_setting():
    spec, docs, redoc = get(unready_app()[0], "/openapi.json", "/docs", "/redoc")
    assert spec.status_code == docs.status_code == redoc.status_code == 200 and spec.json()["openapi"].startswith("3.1")
    off = get(unready_app(openapi=False)[0], "/openapi.json", "/docs", "/redoc")
    assert [r.status_code for r in off] == [404] * 3 and off[0].json()["type"] == "error"


def test_every_route_is_documented_with_its_body_and_error_shape(doc):
    documented = {f"{m.upper()} {p}" for p, ops in doc["paths"].items() for m in ops}
    assert documented == {
        "GET /health",
        "GET /ready",
        "GET /metrics",
        "POST /v1/messages",
        "POST /v1/messages/count_tokens",
        "GET /v1/models",
        "GET /v1/models/{model_id}",
        "GET /v1/messages/{message_id}/stream",
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "POST /tokenize",
        "POST /detokenize",
        "POST /v1/messages/batches",
        "GET /v1/messages/batches",
        "GET /v1/messages/batches/{batch_id}",
        "POST /v1/messages/batches/{batch_id}/cancel",
        "DELETE /v1/messages/batches/{batch_id}",
        "GET /v1/messages/batches/{batch_id}/results",
        "GET /admin/fleet",
        "PUT /admin/fleet/models/{model}/weights",
        "POST /admin/fleet/models/{model}/rollout",
        "POST /admin/fleet/models/{model}/rollback",
        "POST /admin/fleet/reload",
        "GET /admin/fleet/adapters",
        "POST /admin/fleet/adapters",
        "DELETE /admin/fleet/adapters/{name}",
        "POST /v1/load_lora_adapter",
        "POST /v1/unload_lora_adapter",
    }
    bodies = {
        "/v1/messages": "MessagesRequest",
        "/v1/messages/count_tokens": "CountTokensRequest",
        "/v1/messages/batches": "BatchCreate",
        "/v1/chat/completions": "ChatCompletionRequest",
        "/v1/completions": "CompletionRequest",
        "/tokenize": "TokenizeRequest",
        "/detokenize": "DetokenizeRequest",
    }
    for path, model in bodies.items():
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + model)
    for path, ops in doc["paths"].items():
        family = (
            "OpenAIError"
            if path.startswith(
                (
                    "/v1/chat/",
                    "/v1/completions",
                    "/tokenize",
                    "/detokenize",
                    "/v1/load_lora_adapter",
                    "/v1/unload_lora_adapter",
                )
            )
            else "AnthropicError"
        )
        for op in ops.values():
            assert "422" not in op["responses"] or path in ("/v1/messages", "/v1/chat/completions", "/v1/completions")
            for status, response in op["responses"].items():
                if int(status) >= 400 and path != "/ready":
                    assert response["content"]["application/json"]["schema"]["$ref"].endswith("/" + family)
    assert "text/event-stream" in doc["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]
    assert "HTTPValidationError" not in json.dumps(doc)


def test_body_schemas_are_the_validating_models(doc):
    schemas = doc["components"]["schemas"]
    for model in (
        MessagesRequest,
        ChatCompletionRequest,
        BatchCreate,
        CompletionRequest,
        TokenizeRequest,
        DetokenizeRequest,
    ):
        assert set(schemas[model.__name__]["properties"]) == set(model.model_fields)
        assert schemas[model.__name__]["additionalProperties"] is False  # unknown fields are a 400
    assert schemas["MessagesRequest"]["properties"]["max_tokens"] == {
        "maximum": 2**31 - 1,
        "minimum": 0,
        "title": "Max Tokens",
        "type": "integer",
    }
    assert schemas["BatchItem"]["properties"]["params"]["$ref"].endswith("/BatchRequestParams")
    lenient = get(unready_app(reject_unknown_fields=False)[0], "/openapi.json")[0].json()["components"]["schemas"]
    assert lenient["MessagesRequest"]["additionalProperties"] is True


def test_every_schema_is_valid_json_schema_with_no_pydantic_only_keywords(doc):
    """Found by the fuzz test: a range on an optional integer was written as `ge` / `le`, which
    JSON Schema ignores, so the document allowed what the server refused."""
    text = json.dumps(doc["components"]["schemas"])
    for keyword in ("ge", "le", "gt", "lt"):
        assert f'"{keyword}":' not in text
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


def test_an_integral_number_is_an_integer(tiny_llama_dir):
    """Found by the fuzz test: JSON Schema calls 8.0 an integer, the strict models refused it."""

    async def run():
        app, _, _ = await scripted_app(tiny_llama_dir)
        async with client(app) as c:
            assert (await c.post("/v1/messages", json={**BODY, "max_tokens": 8.0})).status_code == 200
            chat = {**BODY, "max_tokens": 8.0, "seed": 3.0}
            assert (await c.post("/v1/chat/completions", json=chat)).status_code == 200
            for bad in (8.5, "8", True):
                assert (await c.post("/v1/messages", json={**BODY, "max_tokens": bad})).status_code == 400

    asyncio.run(run())


def test_a_batch_item_that_breaks_a_messages_rule_is_refused_at_create(tiny_llama_dir):
    """Found by the fuzz test: an item with an empty text block was accepted, to fail later."""

    async def run():
        app, _, _ = await scripted_app(tiny_llama_dir)
        item = {**BODY, "system": [{"type": "text", "text": ""}]}
        batch = {"requests": [{"custom_id": "a", "params": BODY}, {"custom_id": "b", "params": item}]}
        async with client(app) as c:
            return await c.post("/v1/messages/batches", json=batch)

    r = asyncio.run(run())
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("requests.1.params.system.0")
