"""SSE plumbing shared by both wire formats (reference safety_sse.md part B).

- `event_stream_response`: sse-starlette with Anthropic-style `ping` events every
  `ping_interval_s` (the stream generator also sends one at once), a per-send timeout (a
  backstop: stalled readers are cut earlier by the connection watch, connection_watch.py), `X-Accel-Buffering: no`, no compression,
  and a shutdown grace longer than ours so our own drain can end streams properly.
- `run_with_deadline`: ends a stream with TimeoutError at the maximum stream duration or, once
  the server drains for shutdown, at the drain deadline — whichever is first — even when the
  engine is silent (queued, long prefill), without ever blocking the event loop.
"""

from __future__ import annotations


import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.requests import Request

from sluice.api.connection_watch import connection_of

from sluice.serving.runtime import ServingRuntime

T = TypeVar("T")
_POLL_S = 0.5  # how often a silent stream re-checks its deadline (drain may move it)


def event_stream_response(
    rt: ServingRuntime,
    events: AsyncIterator[ServerSentEvent | dict],
    ping: Callable[[], ServerSentEvent] | None,
    headers: dict[str, str] | None = None,
    on_close: Callable[[], Awaitable[None]] | None = None,
    request: Request | None = None,
) -> EventSourceResponse:
    """`on_close` runs after the response ends however it ends — also when the client left
    before the stream generator ever started (its own `finally` would then never run).

    A stream that aborts its generation when the client leaves passes `on_close` and `request`:
    the time from the connection closing to that abort (the stream's generators have been
    closed by then) is recorded in `sluice_disconnect_abort_seconds`."""
    s = rt.settings
    conn = connection_of(request.scope) if request is not None else None

    async def closed() -> None:
        if conn is not None and conn.lost_at is not None:
            rt.metrics.disconnect_abort.observe(time.monotonic() - conn.lost_at)
        if on_close is not None:
            await on_close()

    return EventSourceResponse(
        events,
        ping=s.ping_interval_s,
        ping_message_factory=ping,
        sep="\n",
        send_timeout=s.send_timeout_s,
        headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache", **(headers or {})},
        shutdown_grace_period=s.shutdown_grace_s + 2.0,
        background=BackgroundTask(closed) if on_close is not None or conn is not None else None,
    )


async def run_with_deadline(rt: ServingRuntime, source: AsyncIterator[T]) -> AsyncIterator[T]:
    loop = asyncio.get_running_loop()
    limit = loop.time() + rt.settings.max_stream_duration_s
    it = aiter(source)
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(it))
            deadline = limit
            if rt.draining:
                deadline = min(deadline, loop.time() + (rt.drain_deadline - time.monotonic()))
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError
            done, _ = await asyncio.wait({pending}, timeout=min(remaining, _POLL_S))
            if not done:
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                pending = None
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            try:
                await pending
            except (asyncio.CancelledError, StopAsyncIteration, Exception):
                pass
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
