"""vLLM's runtime LoRA endpoints, behind the admin key (docs/LORA.md):

    POST /v1/load_lora_adapter    {"lora_name": NAME, "lora_path": PATH[, "base_model_name": BASE]}
    POST /v1/unload_lora_adapter  {"lora_name": NAME}

A loaded adapter is served at once as model NAME on the OpenAI and Anthropic APIs and listed by
/v1/models with its base as `parent`. PATH is a PEFT adapter folder on the workers' host or
s3://bucket/prefix; `base_model_name` (sluice's addition) picks the base when the fleet has
several. Errors are OpenAI-shaped: a damaged adapter 400 naming what is wrong, a taken name 409,
an unknown adapter 404 not_found_error, no worker of the base ready 529. Without an admin key
configured the routes do not exist (404), as the admin API.

HTTP only: the operations are serving/adapter_admin.py's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from sluice.api import openapi_doc as doc
from sluice.api.admin import AdminGuard
from sluice.api.errors import STATUS_FOR_KIND, ApiError, bad_request
from sluice.api.json_body import json_object
from sluice.serving.adapter_admin import AdapterAdmin
from sluice.serving.fleet_admin import AdminError
from sluice.serving.runtime import ServingRuntime

_LOAD = {"lora_name", "lora_path", "base_model_name", "load_inplace"}
_UNLOAD = {"lora_name", "lora_int_id"}


def _fields(raw: bytes, allowed: set[str], required: tuple[str, ...]) -> dict[str, Any]:
    body = json_object(raw, "We could not parse the JSON body of your request")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    for name in required:
        if not isinstance(body.get(name), str) or not body[name]:
            raise bad_request(f"{name}: a non-empty string is required", param=name)
    base = body.get("base_model_name")
    if base is not None and (not isinstance(base, str) or not base):
        raise bad_request("base_model_name: a non-empty string when given", param="base_model_name")
    return body


def _refused(exc: AdminError) -> ApiError:
    return ApiError(STATUS_FOR_KIND[exc.kind], exc.message, param="lora_name")


def build_router(rt: ServingRuntime, guard: AdminGuard) -> APIRouter:
    router = APIRouter()

    def admin(request: Request) -> AdapterAdmin:
        guard.check(request)
        return AdapterAdmin(rt.require_fleet())

    @router.post(
        "/v1/load_lora_adapter", openapi_extra=doc.operation(doc.Family.OPENAI, errors=(*doc.LOOKUP, 409, 529))
    )
    async def load_lora_adapter(request: Request) -> Any:
        ops = admin(request)
        body = _fields(await request.body(), _LOAD, ("lora_name", "lora_path"))
        if body.get("load_inplace"):
            raise bad_request(
                "load_inplace: an adapter is replaced by unloading it and loading it again", param="load_inplace"
            )
        try:
            return await ops.load(body["lora_name"], body["lora_path"], body.get("base_model_name"))
        except AdminError as exc:
            raise _refused(exc) from None

    @router.post("/v1/unload_lora_adapter", openapi_extra=doc.operation(doc.Family.OPENAI, errors=(*doc.LOOKUP, 409)))
    async def unload_lora_adapter(request: Request) -> Any:
        ops = admin(request)
        body = _fields(await request.body(), _UNLOAD, ("lora_name",))
        try:
            return await ops.unload(body["lora_name"])
        except AdminError as exc:
            raise _refused(exc) from None

    return router
