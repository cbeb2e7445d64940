"""Who is calling: the API key from either header style, checked in constant time.

Both `x-api-key: K` (anthropic SDK 0.x/1.x, curl docs) and `Authorization: Bearer K` (SDK 2.x,
OpenAI clients) are accepted (reference §0.1, §10.12). This module only extracts the presented
key and asks an `Authenticator`; the gateway's key store is another Authenticator.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Protocol

from starlette.requests import Request

from sluice.api.errors import ApiError


@dataclass(slots=True, frozen=True)
class Principal:
    """An authenticated caller: what the layers below need to know about it."""

    tenant: str = "default"
    tier: str = "standard"
    key_id: str = ""
    priority: int = 1  # scheduling band: lower is served first
    extra: dict = field(default_factory=dict)


class Authenticator(Protocol):
    async def authenticate(self, presented_key: str | None) -> Principal | None:
        """The caller's principal, or None when the key is missing, unknown or revoked."""
        ...


class OpenAccess:
    """No key configured: everyone is the default tenant (the server binds 127.0.0.1 only)."""

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        return Principal()


class SingleKey:
    """One key for local use. Only its SHA-256 is kept; comparison is constant time."""

    def __init__(self, key: str):
        self._digest = hashlib.sha256(key.encode()).digest()

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        if presented_key is None:
            return None
        presented = hashlib.sha256(presented_key.encode()).digest()
        return Principal() if hmac.compare_digest(presented, self._digest) else None


def presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key.strip()
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


async def require_principal(request: Request, authenticator: Authenticator) -> Principal:
    key = presented_key(request)
    principal = await authenticator.authenticate(key)
    if principal is None:
        message = "x-api-key header is required" if key is None else "invalid x-api-key"
        raise ApiError(401, message)
    return principal
