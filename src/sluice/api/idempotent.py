"""`Idempotency-Key` on the generation routes: read the header, ask serving/idempotency/retries.py what
this attempt does, render what a retry gets — the kept reply, or the first attempt's stream
(kept events, or followed live through the replay log). Both wire formats use it.

A retry's response is the first attempt's, byte for byte (a stream: the same events and ids),
marked `Idempotent-Replayed: true`; only `request-id` is its own.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sse_starlette import ServerSentEvent
from starlette.requests import Request

from sluice.api.anthropic.render import PING
from sluice.api.headers import idempotency_key
from sluice.api.sse import event_stream_response
from sluice.gateway.principal import Principal
from sluice.serving.idempotency.retries import Action, Attempt, fingerprint
from sluice.serving.idempotency.store import StoredReply
from sluice.serving.request import ServingRequest
from sluice.serving.runtime import ServingRuntime
from sluice.streaming.replay_log import ReplayEvent

REPLAYED_HEADER = "Idempotent-Replayed"
Frames = Callable[[AsyncIterator[ReplayEvent]], AsyncIterator[ServerSentEvent]]
Follow = Callable[[str, int], AsyncIterator[ReplayEvent]]  # a stream's replay log, live, after a seq


async def begin(
    request: Request, rt: ServingRuntime, principal: Principal, sreq: ServingRequest, body: BaseModel, stream: bool
) -> Attempt:
    """This request's attempt: RUN (with a claim when it carries a key), REPLAY or FOLLOW."""
    key = idempotency_key(request)
    if key is None:
        return Attempt(Action.RUN)
    fp = fingerprint(sreq.route.value, body.model_dump(mode="json"))
    return await rt.idempotency.begin(
        principal.tenant, key, fp, sreq.request_id if stream else None, rt.settings.request_timeout_s
    )


def reply(payload: dict, headers: dict[str, str]) -> tuple[JSONResponse, StoredReply]:
    """The JSON response, and the same bytes to keep for a retry."""
    response = JSONResponse(payload, headers=headers)
    return response, StoredReply(response.status_code, dict(headers), bytes(response.body).decode())


def replayed(
    rt: ServingRuntime,
    attempt: Attempt,
    frames: Frames,
    ping: Callable[[], ServerSentEvent],
    follow: Follow,
    after: int = 0,
) -> Response:
    """What a retry gets: the kept JSON reply, or the stream from after event `after` (kept
    events, or `follow(stream_id, after)` while the first attempt still runs)."""
    kept = attempt.reply
    headers = {**(kept.headers if kept is not None else {}), REPLAYED_HEADER: "true"}
    if kept is not None and kept.events is None:
        return Response(kept.body, status_code=kept.status, headers=headers, media_type="application/json")
    events: AsyncIterator[ReplayEvent]
    if kept is not None and kept.events is not None:
        events = _replay(kept.events, after)
    else:
        assert attempt.action is Action.FOLLOW and attempt.stream_id is not None
        events = follow(attempt.stream_id, after)
    return event_stream_response(rt, frames(events), ping, headers)


async def _replay(events: list[ReplayEvent], after: int) -> AsyncGenerator[ReplayEvent, None]:
    yield PING  # as a live stream starts (a wire without named pings renders it as a comment)
    for event in events:
        if event.seq > after:
            yield event
