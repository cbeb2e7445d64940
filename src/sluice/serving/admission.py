"""The API's entry to the gateway: open a session or answer 429 / 529 before any stream."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from sluice.api.errors import ApiError, overloaded
from sluice.serving.generation import generate
from sluice.serving.runtime import ServingRuntime
from sluice.gateway.admission import Overloaded
from sluice.gateway.coalescer import coalesce_key
from sluice.gateway.gateway import RateLimited, Session
from sluice.gateway.principal import Principal
from sluice.gateway.rate_limit_headers import rate_limit_headers
from sluice.types import GenerationRequest

QUEUE_TIMEOUT_HEADER = "sluice-queue-timeout"  # seconds a request may wait for admission
CACHE_HEADER = "sluice-cache"  # "bypass": skip the response cache


def _deadline(request: Request) -> float | None:
    raw = request.headers.get(QUEUE_TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, f"{QUEUE_TIMEOUT_HEADER}: must be a number of seconds") from None
    if value <= 0:
        raise ApiError(400, f"{QUEUE_TIMEOUT_HEADER}: must be positive")
    return value


class ClientGone(Exception):
    """The client disconnected while its request waited for admission."""


async def until_admitted(request: Request, opening: "asyncio.Future[Session]", timeout: float | None = None) -> bool:
    """Wait for `opening` (a gateway admission), at most `timeout` seconds; True once it is done.

    A client that disconnects while it waits leaves the admission queue at once: the waiter is
    cancelled (Starlette does not cancel a handler whose client left before the response)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while not opening.done():
        step = _POLL_S if deadline is None else min(_POLL_S, max(0.0, deadline - loop.time()))
        await asyncio.wait({opening}, timeout=step)
        if opening.done():
            break
        if await request.is_disconnected():
            opening.cancel()
            raise ClientGone()
        if deadline is not None and loop.time() >= deadline:
            return False
    return True


_POLL_S = 0.25


async def open_session(
    rt: ServingRuntime,
    request: Request,
    principal: Principal,
    gen: GenerationRequest,
    model: str,
    route: str,
    key_body: dict[str, Any] | None,
    band: int | None = None,
) -> Session:
    gw = rt.gateway
    assert gw is not None
    key = None
    if key_body is not None and rt.settings.enable_coalescing:
        key = coalesce_key(principal.tenant, model, key_body, rt.settings.coalesce_across_tenants)
    use_cache = request.headers.get(CACHE_HEADER, "").lower() != "bypass"
    try:
        session = await gw.open(
            principal,
            len(gen.prompt_token_ids),
            gen.sampling.max_tokens,
            lambda: generate(rt, gen, route),
            key=key,
            use_cache=use_cache,
            deadline_s=_deadline(request),
            band=band,
        )
    except RateLimited as exc:
        d = exc.decision
        if d.reason == "store_unavailable":
            raise ApiError(529, "rate limiting is unavailable; try again shortly", headers=rate_limit_headers(d)) from None
        what = {"requests": "requests", "input_tokens": "input tokens", "output_tokens": "output tokens",
                "concurrency": "concurrent requests"}.get(d.reason, d.reason)
        raise ApiError(429, f"rate limit exceeded: {what} per minute for this key" if d.reason != "concurrency"
                       else "rate limit exceeded: too many concurrent requests for this key", headers=rate_limit_headers(d)) from None
    except Overloaded as exc:
        raise overloaded(f"Overloaded: {exc.reason}", exc.retry_after_s) from None
    rt.metrics.gateway_requests.labels(session.kind).inc()
    if session.kind == "engine":
        rt.metrics.gateway_queue_time.observe(session.queue_time_s)
    return session
