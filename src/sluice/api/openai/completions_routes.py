"""OpenAI legacy completions over HTTP (`POST /v1/completions`), streaming and not.

The same serving pipeline as chat (gateway, safety, limits, routing), one generation per
choice: prompts × n, started together (serving/choices.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import ServerSentEvent

from sluice.api import openapi_doc as doc
from sluice.api.auth import require_principal
from sluice.api.ids import new_id
from sluice.api.openai.completions import parse_body, to_serving_requests
from sluice.api.openai.completions_render import ChoiceView, render_chunks, render_completion
from sluice.api.sse import event_stream_response
from sluice.serving.admission import ClientGone
from sluice.serving.choices import start_all
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.runtime import ServingRuntime


def _ping() -> ServerSentEvent:
    return ServerSentEvent(comment="ping")


def build_router(rt: ServingRuntime, pipeline: ServingPipeline) -> APIRouter:
    router = APIRouter()
    lenient = not rt.settings.reject_unknown_fields

    @router.post(
        "/v1/completions",
        openapi_extra=doc.generation(doc.Family.OPENAI, "CompletionRequest", "TextCompletion", [*doc.SLUICE_HEADERS]),
    )
    async def completions(request: Request) -> Any:
        principal = await require_principal(request, rt.authenticator)
        body = parse_body(await request.body(), lenient)
        request_id = new_id("cmpl")
        prompted = to_serving_requests(body, principal, request_id, request)
        wait = rt.settings.stream_open_wait_s if body.stream else None
        try:
            gens = await start_all(pipeline, [p.request for p in prompted], wait, request.is_disconnected)
        except ClientGone:
            return Response(status_code=499)
        except ServingError as exc:
            if exc.kind is ErrorKind.NOT_FOUND and exc.code == "model_not_found":
                exc.message = f"The model `{body.model}` does not exist or you do not have access to it."
            raise
        views = [ChoiceView(g, p.index, body.echo) for g, p in zip(gens, prompted)]
        first = [i == 0 or p.prompt_index != prompted[i - 1].prompt_index for i, p in enumerate(prompted)]
        headers = gens[0].headers
        if not body.stream:
            try:
                collected = await asyncio.gather(*(g.collect() for g in gens))
            finally:
                for g in gens:
                    await g.close()
            return JSONResponse(
                render_completion(request_id, body.model, views, list(collected), first), headers=headers
            )

        async def close_all() -> None:
            for g in gens:
                await g.close()

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return event_stream_response(
            rt, render_chunks(request_id, body.model, views, first, include_usage), _ping, headers, close_all, request
        )

    return router
