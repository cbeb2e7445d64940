"""OpenAI chat completions over HTTP (`/v1/chat/completions`), streaming and not.

Parse and check the wire format, hand the request to the serving pipeline (the same path as
Anthropic Messages), render what it produces in OpenAI's shapes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sse_starlette import ServerSentEvent

from sluice.api import idempotent
from sluice.api import openapi_doc as doc
from sluice.api.auth import require_principal
from sluice.api.ids import new_id
from sluice.api.openai.convert import parse_body, to_serving_request
from sluice.api.openai.render import (
    chunk_events,
    chunk_frames,
    cut_chunk,
    ended_well,
    followed,
    render_chunks,
    render_completion,
)
from sluice.api.sse import event_stream_response
from sluice.serving.admission import ClientGone
from sluice.serving.choices import per_choice, start_all
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.idempotency.retries import Action
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.runtime import ServingRuntime
from sluice.streaming.recorder import Recording


def _ping() -> ServerSentEvent:
    return ServerSentEvent(comment="ping")  # keep-alive as an SSE comment: OpenAI clients skip it


def build_router(rt: ServingRuntime, pipeline: ServingPipeline) -> APIRouter:
    router = APIRouter()
    lenient = not rt.settings.reject_unknown_fields

    @router.post(
        "/v1/chat/completions",
        openapi_extra=doc.generation(
            doc.Family.OPENAI, "ChatCompletionRequest", "ChatCompletion", [doc.IDEMPOTENCY_KEY, *doc.SLUICE_HEADERS]
        ),
    )
    async def chat_completions(request: Request) -> Any:
        principal = await require_principal(request, rt.authenticator)
        body = parse_body(await request.body(), lenient)
        sreq = to_serving_request(body, principal, new_id("chatcmpl"), request)
        attempt = await idempotent.begin(request, rt, principal, sreq, body, body.stream)
        if attempt.action is not Action.RUN:  # a retry: the first attempt's response (a stream from its start)
            return idempotent.replayed(
                rt, attempt, chunk_frames, _ping, lambda sid, after: followed(rt.replay.follow(sid, after))
            )
        wait = rt.settings.stream_open_wait_s if body.stream else None
        async with attempt.settles():  # a key whose attempt did not complete is released
            try:  # n choices: started together, so they share the prompt's KV blocks
                gens = await start_all(pipeline, per_choice(sreq, body.n), wait, request.is_disconnected)
            except ClientGone:
                return Response(status_code=499)
            except ServingError as exc:
                if exc.kind is ErrorKind.NOT_FOUND and exc.code == "model_not_found":  # OpenAI's own words
                    exc.message = f"The model `{body.model}` does not exist or you do not have access to it."
                raise
            gen, reply_id = gens[0], sreq.request_id

            async def close_all() -> None:
                for g in gens:
                    await g.close()

            if not body.stream:
                try:
                    collected = list(await asyncio.gather(*(g.collect() for g in gens)))
                finally:
                    await close_all()
                response, kept = idempotent.reply(render_completion(reply_id, gens, collected), gen.headers)
                await attempt.complete(kept)
                return response
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            if not attempt.keyed:
                return event_stream_response(
                    rt, render_chunks(reply_id, gens, include_usage), _ping, gen.headers, close_all, request
                )
            # keyed: recorded and detached, so a retry replays it from the start and follows it live
            events = chunk_events(render_chunks(reply_id, gens, include_usage))
            recording = await Recording.open(rt.replay, reply_id, principal.tenant, events, cut_chunk)
            attempt.detach(recording, rt.keep, lambda: gen.headers, ended_well)
        return event_stream_response(rt, chunk_frames(followed(rt.replay.follow(reply_id, 0))), _ping, gen.headers)

    return router
