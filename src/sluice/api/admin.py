"""The admin API (`/admin/*`): the fleet's state and its operations, behind its own key.

Only the `admin_key` setting opens it (`Authorization: Bearer KEY` or `x-api-key: KEY`, compared
in constant time); tenant keys never do, and without an admin key configured the routes do not
exist (404), so a deployment that does not want them exposes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from fastapi import APIRouter, Request

from sluice.api import openapi_doc as doc
from sluice.api.auth import presented_key
from sluice.api.errors import ApiError
from sluice.serving.runtime import ServingRuntime


class AdminGuard:
    def __init__(self, admin_key: str | None):
        self._digest = hashlib.sha256(admin_key.encode()).digest() if admin_key else None

    @property
    def enabled(self) -> bool:
        return self._digest is not None

    def check(self, request: Request) -> None:
        if self._digest is None:
            raise ApiError(404, f"Not found: {request.method} {request.url.path}", type="not_found_error")
        key = presented_key(request) or _basic_password(request)
        if key is None or not hmac.compare_digest(hashlib.sha256(key.encode()).digest(), self._digest):
            # Basic lets a browser ask for the key (the status page); the SDK-style headers work too
            raise ApiError(401, "the admin API needs the admin key", type="authentication_error",
                           headers={"www-authenticate": 'Basic realm="sluice admin"'})


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


def build_router(rt: ServingRuntime, guard: AdminGuard) -> APIRouter:
    router = APIRouter()

    @router.get("/admin/fleet", openapi_extra=doc.operation(doc.Family.ANTHROPIC, errors=doc.LOOKUP))
    async def fleet_status(request: Request) -> Any:
        guard.check(request)
        return rt.require_fleet().status()

    return router
