"""Recording streams into the replay log, background generation, and the resume endpoint.

- Every Messages stream is recorded (`record_stream`). A stream that ends because its client
  left (and did not opt in to background generation) gets a final `error` event in the log, so a
  client resuming it sees a proper end instead of waiting.
- `"background": true` (or the header `sluice-background: true`) detaches generation from the
  connection: the generation runs as a server task writing to the log, and the response (and any
  resume) follows the log. A disconnect then stops only that follower.
- `GET /v1/messages/{id}/stream` with `Last-Event-ID: <id>:<seq>` (or `?starting_after=<seq>`)
  replays what was missed, then follows live. Unknown, expired or another tenant's id → 404.
"""

from __future__ import annotations

from anyio import CancelScope

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from sse_starlette import ServerSentEvent

from sluice.api.anthropic.render import EventWriter
from sluice.api.auth import require_principal
from sluice.api.errors import ApiError, bad_request
from sluice.streaming.replay_log import ReplayEvent, ReplayGap, ReplayLog
from sluice.serving.runtime import ServingRuntime
from sluice.api.sse import event_stream_response

BACKGROUND_HEADER = "sluice-background"


async def record_stream(
    log: ReplayLog, msg_id: str, tenant: str, events: AsyncIterator[ServerSentEvent]
) -> AsyncIterator[ServerSentEvent]:
    await log.open(msg_id, tenant)
    last_seq, ended = 0, False
    try:
        async for sse in events:
            if sse.id:
                last_seq = int(str(sse.id).rsplit(":", 1)[1])
                await log.append(msg_id, ReplayEvent(last_seq, sse.event or "", str(sse.data)))
                ended = sse.event in ("message_stop", "error")
            yield sse
    finally:
        # Shielded: after a disconnect the response's cancel scope would cancel every await here
        # (anyio cancellation is level-triggered) and the log would never be finished.
        with CancelScope(shield=True):
            if not ended:
                data = json.dumps({"type": "error", "error": {"type": "api_error",
                                   "message": "the stream ended when its client disconnected (not a background request)"}})
                await log.append(msg_id, ReplayEvent(last_seq + 1, "error", data))
            await log.finish(msg_id)


def start_background(rt: ServingRuntime, recorded: AsyncIterator[ServerSentEvent]) -> None:
    async def drain() -> None:
        async for _ in recorded:
            pass

    task = asyncio.get_running_loop().create_task(drain())
    rt.background_tasks.add(task)  # a reference, or the task could be garbage-collected
    task.add_done_callback(rt.background_tasks.discard)


async def follow(rt: ServingRuntime, msg_id: str, after: int) -> AsyncIterator[ServerSentEvent]:
    w = EventWriter(msg_id)
    yield w.ping()
    try:
        async for ev in rt.replay.follow(msg_id, after):
            yield ServerSentEvent(data=ev.data, event=ev.name, id=f"{msg_id}:{ev.seq}")
    except ReplayGap as exc:
        yield ServerSentEvent(data=json.dumps({"type": "error", "error": {"type": "not_found_error", "message": str(exc)}}),
                              event="error")


def wants_background(request: Request, body_flag: bool) -> bool:
    return body_flag or request.headers.get(BACKGROUND_HEADER, "").lower() in ("1", "true", "yes")


def build_router(rt: ServingRuntime) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/messages/{message_id}/stream")
    async def resume(request: Request, message_id: str, starting_after: int | None = Query(None, ge=0)) -> Any:
        principal = await require_principal(request, rt.authenticator)
        owner = await rt.replay.owner(message_id)
        if owner is None or owner != principal.tenant:
            raise ApiError(404, f"no stream {message_id} to resume (unknown or expired)", type="not_found_error")
        after = starting_after
        if after is None:
            last = request.headers.get("last-event-id")
            if last:
                stream_id, _, seq = last.rpartition(":")
                if stream_id != message_id or not seq.isdigit():
                    raise bad_request(f"Last-Event-ID: expected '{message_id}:<seq>', got {last!r}")
                after = int(seq)
        return event_stream_response(rt, follow(rt, message_id, after or 0), EventWriter(message_id).ping)

    return router
