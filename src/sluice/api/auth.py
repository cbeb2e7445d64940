"""Who is calling: the API key from either header style, checked by the gateway's Authenticator.

Both `x-api-key: K` (anthropic SDK 0.x/1.x, curl docs) and `Authorization: Bearer K` (SDK 2.x,
OpenAI clients) are accepted, `x-api-key` first when both are sent: the one parser every surface
uses (common/api_keys.py says why). This module asks an `Authenticator` (gateway/authenticator.py:
open, single key, key store) about the presented key.
"""

from __future__ import annotations

from starlette.requests import Request

from sluice.api.errors import ApiError
from sluice.common.api_keys import presented_key
from sluice.gateway.authenticator import Authenticator
from sluice.gateway.principal import Principal
from sluice.trace_context import tracer

TIER_STATE = "tier"  # request.state key: the caller's tier, for the request metrics' `tier` label


async def require_principal(request: Request, authenticator: Authenticator) -> Principal:
    key = presented_key(request.headers)
    with tracer().start_as_current_span("auth") as span:
        principal = await authenticator.authenticate(key)
        span.set_attribute("sluice.authenticated", principal is not None)
        if principal is not None:
            span.set_attribute("sluice.tier", principal.tier)
    if principal is None:
        message = "x-api-key header is required" if key is None else "invalid x-api-key"
        raise ApiError(401, message)
    setattr(request.state, TIER_STATE, principal.tier)
    return principal
