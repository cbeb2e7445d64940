"""SSE plumbing shared by both wire formats (reference safety_sse.md part B).

`event_stream_response`: sse-starlette with keep-alive pings every `ping_interval_s` (an
Anthropic `ping` event, or an SSE comment for OpenAI; the stream's renderer also sends one at
once), a per-send timeout (a backstop: stalled readers are cut earlier by the connection watch,
connection_watch.py), `X-Accel-Buffering: no`, no compression, and a shutdown grace longer than
ours so our own drain can end streams properly.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.requests import Request

from sluice.api.connection_watch import connection_of
from sluice.serving.runtime import ServingRuntime
from sluice.streaming.replay_log import ReplayEvent


async def numbered(events: AsyncIterator[ReplayEvent], stream_id: str) -> AsyncGenerator[ServerSentEvent, None]:
    """Rendered events as SSE frames: `event:` + one line of JSON `data`, and `id: <stream>:<seq>`
    on every numbered (replayable) event."""
    async for e in events:
        yield ServerSentEvent(data=e.data, event=e.name, id=f"{stream_id}:{e.seq}" if e.seq else None)


def event_stream_response(
    rt: ServingRuntime,
    events: AsyncIterator[ServerSentEvent],
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
