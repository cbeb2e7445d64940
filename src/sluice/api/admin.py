"""The admin API (`/admin/*`): the fleet's state and its operations, behind its own key.

Only the `admin_key` setting opens it (`x-api-key: KEY` or `Authorization: Bearer KEY`, in that
precedence, compared in constant time: common/api_keys.py); tenant keys never do, and without an
admin key configured the routes do not exist (404), so a deployment that does not want them exposes nothing.

    GET  /admin/fleet                               the fleet: models, versions, rollouts, workers
    PUT  /admin/fleet/models/{model}/weights        {"weights": {"VERSION": W, ...}}
    POST /admin/fleet/models/{model}/rollout        {"to": "VERSION", ...[rollout] overrides}
    POST /admin/fleet/models/{model}/rollback
    POST /admin/fleet/reload                        reread the fleet file
    GET  /admin/fleet/adapters                      LoRA adapters: name, version, source, base, where resident
    POST /admin/fleet/adapters                      {"name": N, "path": P[, "base": "MODEL/VERSION"]}: load one
    DELETE /admin/fleet/adapters/{name}             unload a run-time adapter

HTTP only: parsing and the error shape. What each operation does is serving/fleet_admin.py.
Errors are Anthropic-shaped; an invalid reload or rollout plan adds `error.problems`, one line
per problem (the fleet file's `FILE:LINE: field: why`).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from sluice.api import openapi_doc as doc
from sluice.api.errors import STATUS_FOR_KIND, ApiError, bad_request
from sluice.api.json_body import json_object
from sluice.common.api_keys import KeyDigests, presented_key
from sluice.serving.adapter_admin import AdapterAdmin
from sluice.serving.fleet_admin import AdminError, FleetAdmin
from sluice.serving.runtime import ServingRuntime


class AdminGuard:
    def __init__(self, admin_key: str | None):
        self._key = KeyDigests([admin_key] if admin_key else [])

    @property
    def enabled(self) -> bool:
        return bool(self._key)

    def check(self, request: Request) -> None:
        if not self._key:
            raise ApiError(404, f"Not found: {request.method} {request.url.path}", type="not_found_error")
        if not self._key.matches(presented_key(request.headers) or _basic_password(request)):
            # Basic lets a browser ask for the key (the status page); the SDK-style headers work too
            raise ApiError(
                401,
                "the admin API needs the admin key",
                type="authentication_error",
                headers={"www-authenticate": 'Basic realm="sluice admin"'},
            )


def _basic_password(request: Request) -> str | None:
    """The password of `Authorization: Basic` (any user name): how a browser sends the admin key."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        _, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return password or None


def guard_for(rt: ServingRuntime) -> AdminGuard:
    return AdminGuard(rt.settings.admin_key.get_secret_value() if rt.settings.admin_key else None)


def _refused(request: Request, exc: AdminError) -> JSONResponse:
    err = ApiError(STATUS_FOR_KIND[exc.kind], exc.message)
    body = err.anthropic_body(getattr(request.state, "request_id", None))
    if exc.problems:
        body["error"]["problems"] = exc.problems
    return JSONResponse(body, status_code=err.status, headers=err.headers)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    return json_object(raw, "invalid JSON body") if raw.strip() else {}


def _doc(*errors: int) -> dict[str, Any]:
    """An admin route's OpenAPI entry: the lookup errors, and `errors` besides."""
    return doc.operation(doc.Family.ANTHROPIC, errors=(*doc.LOOKUP, *errors))


async def _answer(request: Request, op: Awaitable[Any]) -> Any:
    """The operation's reply, or its refusal in the API's error shape."""
    try:
        return await op
    except AdminError as exc:
        return _refused(request, exc)


def _weights(body: dict[str, Any]) -> dict[str, float]:
    weights = body.get("weights")
    if set(body) != {"weights"} or not isinstance(weights, dict):
        raise bad_request('the body must be {"weights": {"VERSION": WEIGHT, ...}}')
    if not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights.values()):
        raise bad_request("weights: every weight must be a number")
    return weights


def _rollout_target(body: dict[str, Any]) -> str:
    """The version to roll out to, taken out of `body` (the rest is the rollout's settings)."""
    to = body.pop("to", None)
    if not isinstance(to, str) or not to:
        raise bad_request('the body must be {"to": "VERSION", ...}: the version to roll out to')
    return to


def _adapter_to_load(body: dict[str, Any]) -> tuple[str, str, str | None]:
    name, path, base = body.get("name"), body.get("path"), body.get("base")
    if (
        set(body) - {"name", "path", "base"}
        or not isinstance(name, str)
        or not isinstance(path, str)
        or not name
        or not path
        or (base is not None and (not isinstance(base, str) or not base))
    ):
        raise bad_request('the body must be {"name": NAME, "path": PATH[, "base": "MODEL/VERSION"]}')
    return name, path, base


def _add_fleet_routes(router: APIRouter, admin: Callable[[Request], FleetAdmin]) -> None:
    """The fleet's status and its versions' traffic: weights, rollouts, rollback, reload."""

    @router.get("/admin/fleet", openapi_extra=_doc())
    async def fleet_status(request: Request) -> Any:
        return admin(request).status()

    @router.put("/admin/fleet/models/{model:path}/weights", openapi_extra=_doc(409))
    async def set_weights(model: str, request: Request) -> Any:
        ops = admin(request)
        return await _answer(request, ops.set_weights(model, _weights(await _body(request))))

    @router.post("/admin/fleet/models/{model:path}/rollout", openapi_extra=_doc(409))
    async def start_rollout(model: str, request: Request) -> Any:
        ops = admin(request)
        body = await _body(request)
        to = _rollout_target(body)
        return await _answer(request, ops.start_rollout(model, to, body))

    @router.post("/admin/fleet/models/{model:path}/rollback", openapi_extra=_doc(409))
    async def rollback(model: str, request: Request) -> Any:
        return await _answer(request, admin(request).rollback(model))

    @router.post("/admin/fleet/reload", openapi_extra=_doc(409))
    async def reload(request: Request) -> Any:
        return await _answer(request, admin(request).reload())


def _add_adapter_routes(router: APIRouter, adapters: Callable[[Request], AdapterAdmin]) -> None:
    """The LoRA adapters the fleet serves: list, load, unload."""

    @router.get("/admin/fleet/adapters", openapi_extra=_doc())
    async def list_adapters(request: Request) -> Any:
        return adapters(request).listing()

    @router.post("/admin/fleet/adapters", openapi_extra=_doc(409, 529))
    async def load_adapter(request: Request) -> Any:
        ops = adapters(request)
        return await _answer(request, ops.load(*_adapter_to_load(await _body(request))))

    @router.delete("/admin/fleet/adapters/{name:path}", openapi_extra=_doc(409))
    async def unload_adapter(name: str, request: Request) -> Any:
        return await _answer(request, adapters(request).unload(name))


def build_router(rt: ServingRuntime, guard: AdminGuard) -> APIRouter:
    router = APIRouter()

    def admin(request: Request) -> FleetAdmin:
        guard.check(request)
        return FleetAdmin(rt.require_fleet(), rt.settings.tiers)

    def adapters(request: Request) -> AdapterAdmin:
        guard.check(request)
        return AdapterAdmin(rt.require_fleet())

    _add_fleet_routes(router, admin)
    _add_adapter_routes(router, adapters)
    return router
