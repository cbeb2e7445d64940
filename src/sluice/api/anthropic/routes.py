"""Anthropic Messages: /v1/messages, /v1/messages/count_tokens, /v1/models (reference §2–§8)."""

from __future__ import annotations

from anyio import CancelScope

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent

from sluice.api.anthropic.render import STOP_REASONS, EventWriter, UsagePlan, message_object
from sluice.api.anthropic.schema import CountTokensRequest, MessagesRequest
from sluice.api.auth import Principal, require_principal
from sluice.api.errors import ApiError, bad_request
from sluice.serving.admission import ClientGone, open_session, until_admitted
from sluice.serving.generation import check_fits, checked
from sluice.api.ids import new_id
from sluice.api.json_body import json_object
from sluice.api.pagination import page
from sluice.api.anthropic.prompt import build_prompt, safety_texts
from sluice.serving.safety_check import Guard, check_request_safety
from sluice.serving.guarded_stream import stop_details
from sluice.api.anthropic.resume import follow, record_stream, start_background, wants_background
from sluice.serving.runtime import ServingRuntime
from sluice.api.sse import event_stream_response, run_with_deadline
from sluice.gateway.gateway import Session
from sluice.gateway.rate_limit_headers import rate_limit_headers
from sluice.types import FinishReason, GenerationRequest, SamplingParams, Usage

VERSIONS = ("2023-06-01", "2026-10-21")
ROUTE = "/v1/messages"


def parse_body(raw: bytes, model: type[BaseModel], lenient: bool) -> Any:
    """JSON → pydantic model, with Anthropic-style `<json.path>: <message>` errors."""
    data = json_object(raw, "There was an error parsing the body of your request")
    if lenient:
        data = {k: v for k, v in data.items() if k in model.model_fields}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise bad_request(describe_validation_error(exc)) from None


def describe_validation_error(exc: ValidationError) -> str:
    """The most specific error as `<json.path>: <message>`, without pydantic's union labels."""
    err = max(exc.errors(), key=lambda e: len(e["loc"]))
    path: list[str] = []
    drop_tag = False
    for part in err["loc"]:
        if isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "dict", "list")):
            drop_tag = drop_tag or "tagged-union" in part  # a union branch label, not a field
            continue
        if drop_tag and isinstance(part, str) and path and path[-1].isdigit():
            drop_tag = False  # the discriminator tag that follows the list index
            continue
        path.append(str(part))
    return f"{'.'.join(path) or 'body'}: {err['msg']}"


def _version(request: Request, rt: ServingRuntime) -> str:
    version = request.headers.get("anthropic-version") or rt.settings.default_anthropic_version
    if version is None:
        raise bad_request("anthropic-version: header is required")
    if version not in VERSIONS:
        raise bad_request(f"anthropic-version: {version!r} is not a supported version ({', '.join(VERSIONS)})")
    return version


def _sampling(body: MessagesRequest, version: str, rt: ServingRuntime) -> SamplingParams:
    given = [f for f in ("temperature", "top_p", "top_k") if getattr(body, f) is not None]
    if given and version == "2026-10-21" and rt.settings.strict_sampling_params:
        raise bad_request(f"{given[0]}: is not supported with anthropic-version 2026-10-21")
    if any(not s for s in body.stop_sequences or ()):
        raise bad_request("stop_sequences: each stop sequence must be a non-empty string")
    return checked(SamplingParams(
        max_tokens=max(1, body.max_tokens),
        temperature=1.0 if body.temperature is None else body.temperature,
        top_k=body.top_k or 0,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=tuple(body.stop_sequences or ()),
    ))


def _model_info(rt: ServingRuntime, model_id: str) -> dict[str, Any]:
    created = datetime.fromtimestamp(rt.created_at, timezone.utc).isoformat().replace("+00:00", "Z")
    info = rt.info
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": created,
        "max_input_tokens": info.max_model_len - 1 if info else None,
        "max_tokens": info.max_model_len - 1 if info else None,
    }


async def prepare_message(
    rt: ServingRuntime, principal: Principal, body: MessagesRequest, version: str
) -> tuple[GenerationRequest, UsagePlan]:
    """Everything that can reject a Messages request before it is queued (400 / 404 / 529)."""
    _, tokenizer, info = rt.require_ready()
    rt.check_model(body.model)
    if body.max_tokens > info.max_model_len - 1:  # the prompt takes at least one token
        raise bad_request(
            f"max_tokens: {body.max_tokens} > {info.max_model_len - 1}, which is the maximum allowed "
            f"number of output tokens for {body.model}"
        )
    sampling = _sampling(body, version, rt)
    prompt = await asyncio.to_thread(build_prompt, body, tokenizer)
    check_fits(len(prompt.token_ids), info.max_model_len)
    gen = GenerationRequest(
        request_id=new_id("msg"),
        prompt_token_ids=prompt.token_ids,
        sampling=sampling,
        priority=principal.priority,
        tenant=principal.tenant,
    )
    return gen, UsagePlan(prompt.cache_breakpoint, rt.block_size, prefill_only=body.max_tokens == 0)


def build_router(rt: ServingRuntime) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages")
    async def create_message(request: Request) -> Any:
        principal = await require_principal(request, rt.authenticator)
        version = _version(request, rt)
        body = parse_body(await request.body(), MessagesRequest, not rt.settings.reject_unknown_fields)
        gen, plan = await prepare_message(rt, principal, body, version)
        msg_id = gen.request_id
        request_id = request.state.request_id
        key_body = body.model_dump(exclude_none=True, exclude={"stream", "metadata", "background"})
        guard = check_request_safety(rt, principal, safety_texts(body), msg_id)  # L1: 400/403 before the 200
        opening = asyncio.ensure_future(open_session(rt, request, principal, gen, body.model, ROUTE, key_body))
        # Refusals known at once (rate limits, a full queue) are real 429 / 529 statuses. A stream
        # still queued after `stream_open_wait_s` is opened while it waits, so pings flow (a
        # deadline passed later is then an in-stream overloaded_error).
        wait = rt.settings.stream_open_wait_s if body.stream else None
        try:
            admitted = await until_admitted(request, opening, wait)
        except ClientGone:
            return Response(status_code=499)
        session = opening.result() if admitted else None  # raises the ApiError of a refusal
        headers = rate_limit_headers(session.decision) if session is not None else {}
        if body.stream:
            stream = _stream(rt, opening, gen, body.model, plan, request_id, guard)
            events = record_stream(rt.replay, msg_id, principal.tenant, stream)
            if wants_background(request, body.background):  # generation outlives this connection
                start_background(rt, events)
                return event_stream_response(rt, follow(rt, msg_id, 0), EventWriter(msg_id).ping, headers)
            return event_stream_response(
                rt, events, EventWriter(msg_id).ping, headers, lambda: close_opening(opening), request
            )
        assert session is not None
        try:
            return JSONResponse(await collect_message(rt, session, gen, body.model, plan, guard), headers=headers)
        finally:
            await session.close()

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        await require_principal(request, rt.authenticator)
        _version(request, rt)
        body = parse_body(await request.body(), CountTokensRequest, not rt.settings.reject_unknown_fields)
        _, tokenizer, _ = rt.require_ready()
        rt.check_model(body.model)
        prompt = await asyncio.to_thread(build_prompt, body, tokenizer)
        return {"input_tokens": len(prompt.token_ids)}

    @router.get("/v1/models")
    async def list_models(
        request: Request, limit: int = 20, after_id: str | None = None, before_id: str | None = None
    ) -> Any:
        await require_principal(request, rt.authenticator)
        return page(list(rt.model_ids), limit, after_id, before_id, lambda m: _model_info(rt, m))

    @router.get("/v1/models/{model_id:path}")
    async def get_model(request: Request, model_id: str) -> Any:
        await require_principal(request, rt.authenticator)
        rt.check_model(model_id)
        return _model_info(rt, model_id)

    return router


async def collect_message(
    rt: ServingRuntime, session: Session, gen: GenerationRequest, model: str, plan: UsagePlan, guard: Guard
) -> dict[str, Any]:
    """Run a session to the end and build the Message object (raises ApiError on failure)."""
    text, last = await guard.collect(session.events())
    if last is not None and last.refusal is not None:
        body = message_object(gen.request_id, model, text, "refusal", None, plan.usage(last.usage or Usage()))
        body["stop_details"] = stop_details(last.refusal)
        return body
    final = last.final if last is not None else None
    if final is None or final.finish_reason in (FinishReason.ERROR, FinishReason.ABORT, None):
        if final is not None and final.finish_reason is FinishReason.ABORT:
            raise ApiError(529, "the request was aborted by the server (overloaded or shutting down)")
        raise ApiError(500, "the engine failed while generating this request")
    return message_object(
        gen.request_id,
        model,
        None if plan.prefill_only else text,
        STOP_REASONS[final.finish_reason],
        final.stop_sequence,
        plan.usage(final.usage),
    )


async def close_opening(opening: "asyncio.Future[Session]") -> None:
    """Release whatever admission produced, or stop waiting for it."""
    if not opening.done():
        opening.cancel()
    elif not opening.cancelled() and opening.exception() is None:
        await opening.result().close()


async def _stream(
    rt: ServingRuntime, opening: "asyncio.Future[Session]", gen: GenerationRequest, model: str, plan: UsagePlan,
    request_id: str, guard: Guard,
) -> AsyncIterator[ServerSentEvent]:
    """The event sequence of reference §4.3; failures after the 200 become an `error` event;
    a safety stop is Anthropic's refusal: block stop, `stop_reason: "refusal"`, message stop."""
    w = EventWriter(gen.request_id)
    yield w.ping()  # bytes on the wire at once, before queueing and prefill
    started = False
    try:
        session = await opening  # admitted already, or still queued (pings flow meanwhile)
        async for piece in run_with_deadline(rt, guard.pieces(session.events())):
            if not started:
                started = True
                start = message_object(gen.request_id, model, None, None, None, plan.usage(piece.usage or Usage()))
                yield w.event("message_start", {"message": start})
                if not plan.prefill_only:
                    yield w.event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            if piece.text and not plan.prefill_only:
                yield w.event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece.text}})
            if piece.refusal is not None:
                if not plan.prefill_only:
                    yield w.event("content_block_stop", {"index": 0})
                delta = {"stop_reason": "refusal", "stop_sequence": None, "stop_details": stop_details(piece.refusal)}
                yield w.event("message_delta", {"delta": delta, "usage": plan.usage(piece.usage or Usage())})
                yield w.event("message_stop", {})
                return
            event = piece.final
            if event is not None:
                if event.finish_reason not in STOP_REASONS:
                    kind = "overloaded_error" if event.finish_reason is FinishReason.ABORT else "api_error"
                    message = "the request was aborted by the server" if kind == "overloaded_error" else "the engine failed while generating"
                    yield w.error(kind, message, request_id)
                    return
                if not plan.prefill_only:
                    yield w.event("content_block_stop", {"index": 0})
                delta = {"stop_reason": STOP_REASONS[event.finish_reason], "stop_sequence": event.stop_sequence}
                yield w.event("message_delta", {"delta": delta, "usage": plan.usage(event.usage)})
                yield w.event("message_stop", {})
                return
    except ApiError as exc:
        yield w.error(exc.type or ("overloaded_error" if exc.status in (503, 529) else "api_error"), exc.message, request_id)
    except TimeoutError:
        reason = "the server is shutting down" if rt.draining else "the stream exceeded the maximum stream duration"
        yield w.error("overloaded_error" if rt.draining else "timeout_error", reason, request_id)
    finally:
        with CancelScope(shield=True):  # settle limits and leases even when the client is gone
            await close_opening(opening)
