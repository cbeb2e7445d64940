"""The pipeline's entry to the gateway: open a session, or refuse with 429 / 529 in words.

Everything that can refuse a request here happens before a response starts: rate limits
(RATE_LIMITED, with the rate-limit headers), a full queue or a deadline that passes while the
caller still waits for the response to open (OVERLOADED with retry-after). A caller that goes
away while queued leaves the queue at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from sluice.gateway.admission import Overloaded
from sluice.gateway.coalescer import coalesce_key
from sluice.gateway.gateway import RateLimited, Session, SessionKind
from sluice.gateway.limits import LimitReason
from sluice.gateway.rate_limit_headers import rate_limit_headers
from sluice.serving.errors import ErrorKind, ServingError, overloaded
from sluice.serving.request import ServingRequest
from sluice.serving.runtime import ServingRuntime
from sluice.trace_context import tracer
from sluice.types import GenerationEvent, GenerationRequest

Disconnected = Callable[[], Awaitable[bool]]  # True once the caller has gone away
_POLL_S = 0.25  # how often a waiting caller is checked for a disconnect

_WHAT = {
    LimitReason.REQUESTS: "rate limit exceeded: requests per minute for this key",
    LimitReason.INPUT_TOKENS: "rate limit exceeded: input tokens per minute for this key",
    LimitReason.OUTPUT_TOKENS: "rate limit exceeded: output tokens per minute for this key",
    LimitReason.CONCURRENCY: "rate limit exceeded: too many concurrent requests for this key",
}


class ClientGone(Exception):
    """The caller disconnected while its request waited for admission."""


async def open_session(
    rt: ServingRuntime,
    req: ServingRequest,
    version: str,
    gen: GenerationRequest,
    produce: Callable[[], AsyncGenerator[GenerationEvent, None]],
    limited: asyncio.Event | None = None,
) -> Session:
    """`version`: the model version planned for the request; identical requests coalesce only
    on the same version (a follower must get what its `sluice-model-version` header says).
    `limited`: set once the rate limits have decided (only the queue is left to wait for)."""
    gw = rt.gateway
    assert gw is not None, "the runtime is ready"
    key = None
    if req.dedup_body is not None and rt.settings.enable_coalescing:
        key = coalesce_key(req.principal.tenant, version, req.dedup_body, rt.settings.coalesce_across_tenants)
    try:
        with tracer().start_as_current_span("gateway.admission") as span:
            session = await gw.open(
                req.principal,
                gen,
                produce,
                key=key,
                use_cache=req.use_cache,
                deadline_s=req.queue_timeout_s,
                band=req.band,
                limited=limited,
            )
            span.set_attribute("sluice.session", session.kind.value)
            span.set_attribute("sluice.queue_time_s", session.queue_time_s)
    except RateLimited as exc:
        d = exc.decision
        headers = rate_limit_headers(d)
        if d.reason is LimitReason.STORE_UNAVAILABLE:
            raise ServingError(
                ErrorKind.OVERLOADED,
                "rate limiting is unavailable; try again shortly",
                retry_after_s=1.0,
                headers=headers,
            ) from None
        raise ServingError(
            ErrorKind.RATE_LIMITED, _WHAT.get(d.reason, "rate limit exceeded"), headers=headers
        ) from None
    except Overloaded as exc:
        raise overloaded(f"Overloaded: {exc.reason}", exc.retry_after_s) from None
    rt.metrics.gateway_requests.labels(session.kind.value).inc()
    if session.kind is SessionKind.ENGINE:
        rt.metrics.gateway_queue_time.observe(session.queue_time_s)
    return session


async def until_admitted(
    opening: asyncio.Future[Any],
    disconnected: Disconnected | None,
    wait_s: float | None,
    decided: asyncio.Event | None = None,
) -> bool:
    """Wait for `opening` at most `wait_s` seconds (None: until done); True once it is done,
    False when the wait ran out (the caller opens its stream early: not an asyncio timeout, which
    would cancel). `decided`: the wait counts only once it is set — a refusal that may still come from
    the rate limits (a store that hangs until its own timeout) is waited for, so it is a real
    status, never an in-stream error; only the queue's wait may open a stream early.

    A caller that disconnects meanwhile leaves the admission queue at once: the opening is
    cancelled and ClientGone raised (an HTTP server does not cancel a handler whose client left
    before its response started)."""
    loop = asyncio.get_running_loop()
    deadline = None if wait_s is None else loop.time() + wait_s

    def step() -> float:
        if deadline is None or (decided is not None and not decided.is_set() and loop.time() >= deadline):
            return _POLL_S
        return min(_POLL_S, max(0.0, deadline - loop.time()))

    while not opening.done():
        await asyncio.wait({opening}, timeout=step())
        if opening.done():
            break
        if disconnected is not None and await disconnected():
            opening.cancel()
            raise ClientGone()
        if deadline is not None and loop.time() >= deadline and (decided is None or decided.is_set()):
            return False
    return True
