"""OpenAI chat completions over HTTP (`/v1/chat/completions`), streaming and not.

Parse and check the wire format, hand the request to the serving pipeline (the same path as
Anthropic Messages), render what it produces in OpenAI's shapes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import ServerSentEvent

from sluice.api.auth import require_principal
from sluice.api.ids import new_id
from sluice.api.openai.convert import parse_body, to_serving_request
from sluice.api.openai.render import render_chunks, render_completion
from sluice.api.sse import event_stream_response
from sluice.serving.admission import ClientGone
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.runtime import ServingRuntime


def _ping() -> ServerSentEvent:
    return ServerSentEvent(comment="ping")  # keep-alive as an SSE comment: OpenAI clients skip it


def build_router(rt: ServingRuntime, pipeline: ServingPipeline) -> APIRouter:
    router = APIRouter()
    lenient = not rt.settings.reject_unknown_fields

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        principal = await require_principal(request, rt.authenticator)
        body = parse_body(await request.body(), lenient)
        sreq = to_serving_request(body, principal, new_id("chatcmpl"), request)
        wait = rt.settings.stream_open_wait_s if body.stream else None
        try:
            gen = await pipeline.start(sreq, wait, request.is_disconnected)
        except ClientGone:
            return Response(status_code=499)
        except ServingError as exc:
            if exc.kind is ErrorKind.NOT_FOUND and exc.code == "model_not_found":  # OpenAI's own words
                exc.message = f"The model `{body.model}` does not exist or you do not have access to it."
            raise
        if not body.stream:
            return JSONResponse(render_completion(gen, await gen.collect()), headers=gen.headers)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return event_stream_response(rt, render_chunks(gen, include_usage), _ping, gen.headers, gen.close, request)

    return router
