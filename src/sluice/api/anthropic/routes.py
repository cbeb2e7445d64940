"""Anthropic Messages over HTTP: /v1/messages, /v1/messages/count_tokens, /v1/models (reference §2–§8).

Parse and check the wire format, hand the request to the serving pipeline, render what it
produces. A request's whole path — admission, safety, the engine, deadlines — is the pipeline's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sluice.api import idempotent
from sluice.api import openapi_doc as doc
from sluice.api.anthropic import resume
from sluice.api.anthropic.convert import api_version, parse_body, to_serving_request
from sluice.api.anthropic.prompt import to_conversation
from sluice.api.anthropic.render import plan_for, render_message, render_stream
from sluice.api.anthropic.schema import CountTokensRequest, MessagesRequest
from sluice.api.auth import require_principal
from sluice.api.headers import wants_background
from sluice.api.ids import new_id
from sluice.api.pagination import page
from sluice.api.sse import event_stream_response, numbered
from sluice.serving.admission import ClientGone
from sluice.serving.idempotency.retries import Action, Attempt
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.request import ServingRequest
from sluice.serving.runtime import ServingRuntime
from sluice.streaming.recorder import detach


def _model_info(rt: ServingRuntime, model_id: str) -> dict[str, Any]:
    """Anthropic's model object with OpenAI's fields beside it (one /v1/models for both SDKs).
    A LoRA adapter names its base model as `parent`, as vLLM does; `root` is the id itself (no
    server path is shown to clients)."""
    created = datetime.fromtimestamp(rt.created_at, UTC).isoformat().replace("+00:00", "Z")
    fleet = rt.require_fleet()
    canonical = rt.check_model(model_id)
    window = fleet.model_window(canonical)
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": created,
        "max_input_tokens": window - 1 if window else None,
        "max_tokens": window - 1 if window else None,
        "object": "model",
        "created": int(rt.created_at),
        "owned_by": "sluice",
        "root": model_id,
        "parent": fleet.parent_of(canonical),
    }


def _replayed(rt: ServingRuntime, request: Request, attempt: Attempt, stream: bool) -> Response:
    """A retry of a keyed request: the first attempt's response, not generated again."""
    stream_id = attempt.stream_id or ""
    return idempotent.replayed(
        rt,
        attempt,
        lambda events: numbered(events, stream_id),
        resume.ping,
        lambda sid, after: resume.follow(rt, sid, after),
        resume.resume_point(request, stream_id) if stream else 0,
    )


async def _generate(
    rt: ServingRuntime,
    pipeline: ServingPipeline,
    request: Request,
    tenant: str,
    sreq: ServingRequest,
    body: MessagesRequest,
    attempt: Attempt,
) -> Response:
    """Run a message: its JSON reply, or its stream (recorded, so that it can be resumed; a
    keyed or background one detached, so that it outlives this connection)."""
    # Refusals known before the stream opens (rate limits, a full queue, no engine to take
    # it) are real 429 / 529 statuses. A stream with no output after `stream_open_wait_s` is
    # opened while it waits, so pings flow (a deadline passed later is then an in-stream
    # overloaded_error).
    wait = rt.settings.stream_open_wait_s if body.stream else None
    async with attempt.settles():  # a key whose attempt did not complete is released
        try:
            gen = await pipeline.start(sreq, wait, request.is_disconnected)
        except ClientGone:
            return Response(status_code=499)
        plan = plan_for(gen)
        if not body.stream:
            response, kept = idempotent.reply(render_message(gen, await gen.collect(), plan), gen.headers)
            await attempt.complete(kept)
            return response
        recording = await resume.recorded(
            rt, gen.request_id, tenant, render_stream(gen, plan, request.state.request_id)
        )
        detached = attempt.keyed or wants_background(request, body.background)  # outlives this connection
        if attempt.keyed:  # a retry attaches to it through the replay log
            attempt.detach(recording, rt.keep, lambda: gen.headers, lambda last: last.name == "message_stop")
        elif detached:
            detach(recording, rt.keep)
    if detached:
        return event_stream_response(
            rt, numbered(resume.follow(rt, gen.request_id, 0), gen.request_id), resume.ping, gen.headers
        )

    async def closed() -> None:  # however the response ended, even before its stream started
        await recording.close()
        await gen.close()

    return event_stream_response(
        rt, numbered(recording.events(), gen.request_id), resume.ping, gen.headers, closed, request
    )


def _add_model_routes(router: APIRouter, rt: ServingRuntime, pipeline: ServingPipeline, lenient: bool) -> None:
    """What a client asks about the models: a prompt's token count, the model list, one model."""

    @router.post(
        "/v1/messages/count_tokens",
        openapi_extra=doc.operation(
            doc.Family.ANTHROPIC,
            body="CountTokensRequest",
            ok="TokenCount",
            errors=doc.ENGINE,
            params=[doc.ANTHROPIC_VERSION],
        ),
    )
    async def count_tokens(request: Request) -> Any:
        await require_principal(request, rt.authenticator)
        api_version(request, rt.settings)
        body: CountTokensRequest = parse_body(await request.body(), CountTokensRequest, lenient)
        return {"input_tokens": await pipeline.count_tokens(body.model, to_conversation(body))}

    @router.get("/v1/models", openapi_extra=doc.operation(doc.Family.ANTHROPIC, ok="ModelList"))
    async def list_models(
        request: Request, limit: int = doc.limit(), after_id: str | None = None, before_id: str | None = None
    ) -> Any:
        await require_principal(request, rt.authenticator)
        return page(list(rt.model_ids), limit, after_id, before_id, lambda m: _model_info(rt, m))

    @router.get(
        "/v1/models/{model_id:path}",
        openapi_extra=doc.operation(doc.Family.ANTHROPIC, ok="ModelInfo", errors=doc.LOOKUP),
    )
    async def get_model(request: Request, model_id: str) -> Any:
        await require_principal(request, rt.authenticator)
        rt.check_model(model_id)
        return _model_info(rt, model_id)


def build_router(rt: ServingRuntime, pipeline: ServingPipeline) -> APIRouter:
    router = APIRouter()
    lenient = not rt.settings.reject_unknown_fields
    params = [doc.ANTHROPIC_VERSION, doc.IDEMPOTENCY_KEY, *doc.SLUICE_HEADERS, doc.BACKGROUND]

    @router.post(
        "/v1/messages", openapi_extra=doc.generation(doc.Family.ANTHROPIC, "MessagesRequest", "MessageObject", params)
    )
    async def create_message(request: Request) -> Any:
        principal = await require_principal(request, rt.authenticator)
        version = api_version(request, rt.settings)
        body: MessagesRequest = parse_body(await request.body(), MessagesRequest, lenient)
        sreq = to_serving_request(body, principal, new_id("msg"), version, rt.settings, request)
        attempt = await idempotent.begin(request, rt, principal, sreq, body, body.stream)
        if attempt.action is not Action.RUN:
            return _replayed(rt, request, attempt, body.stream)
        return await _generate(rt, pipeline, request, principal.tenant, sreq, body, attempt)

    _add_model_routes(router, rt, pipeline, lenient)
    return router
