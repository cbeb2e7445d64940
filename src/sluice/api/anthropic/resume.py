"""Resumable Messages streams: each stream is recorded in the replay log as it is sent;
`GET /v1/messages/{id}/stream` replays what a client missed and follows live.

- A stream that ends because its client left (and did not opt in to background generation)
  gets a final `error` event in the log, so a client resuming it sees a proper end.
- `"background": true` (or `sluice-background: true`) detaches generation from the connection:
  it runs as a server task writing to the log, and the response (and any resume) follows the log.
- `Last-Event-ID: <id>:<seq>` or `?starting_after=<seq>` says where to resume. Unknown, expired
  or another tenant's id → 404.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Query, Request
from sse_starlette import ServerSentEvent

from sluice.api import openapi_doc as doc
from sluice.api.anthropic.render import PING
from sluice.api.auth import require_principal
from sluice.api.errors import ApiError, bad_request
from sluice.api.sse import event_stream_response, numbered
from sluice.serving.runtime import ServingRuntime
from sluice.streaming.event_log import LogGap
from sluice.streaming.recorder import Recording
from sluice.streaming.replay_log import ReplayEvent


def ping() -> ServerSentEvent:
    # pings carry no id: they are not part of the replayable content of the stream
    return ServerSentEvent(data=PING.data, event=PING.name)


def _cut(seq: int) -> ReplayEvent:
    data = json.dumps(
        {
            "type": "error",
            "error": {
                "type": "api_error",
                "message": "the stream ended when its client disconnected (not a background request)",
            },
        }
    )
    return ReplayEvent(seq, "error", data)


async def recorded(
    rt: ServingRuntime, msg_id: str, tenant: str, events: AsyncGenerator[ReplayEvent, None]
) -> Recording:
    """`events`, recorded as they are sent; the log is open (followable) when this returns."""
    return await Recording.open(rt.replay, msg_id, tenant, events, _cut)


async def follow(rt: ServingRuntime, msg_id: str, after: int) -> AsyncGenerator[ReplayEvent, None]:
    yield PING
    try:
        async for ev in rt.replay.follow(msg_id, after):
            yield ev
    except LogGap as exc:
        yield ReplayEvent(
            0, "error", json.dumps({"type": "error", "error": {"type": "not_found_error", "message": str(exc)}})
        )


def resume_point(request: Request, message_id: str, starting_after: int | None = None) -> int:
    """Where a client resumes `message_id`: `?starting_after=N`, else `Last-Event-ID: <id>:<N>`, else 0."""
    if starting_after is not None:
        return starting_after
    last = request.headers.get("last-event-id")
    if not last:
        return 0
    stream_id, _, seq = last.rpartition(":")
    if stream_id != message_id or not seq.isdigit():
        raise bad_request(f"Last-Event-ID: expected '{message_id}:<seq>', got {last!r}")
    return int(seq)


def build_router(rt: ServingRuntime) -> APIRouter:
    router = APIRouter()

    @router.get(
        "/v1/messages/{message_id}/stream",
        openapi_extra=doc.operation(doc.Family.ANTHROPIC, stream=True, errors=doc.LOOKUP, params=[doc.LAST_EVENT_ID]),
    )
    async def resume(request: Request, message_id: str, starting_after: int | None = Query(None, ge=0)) -> Any:
        principal = await require_principal(request, rt.authenticator)
        owner = await rt.replay.owner(message_id)
        if owner is None or owner != principal.tenant:
            raise ApiError(404, f"no stream {message_id} to resume (unknown or expired)", type="not_found_error")
        after = resume_point(request, message_id, starting_after)
        return event_stream_response(rt, numbered(follow(rt, message_id, after), message_id), ping)

    return router
