"""OpenAI chat completions (`/v1/chat/completions`), streaming and not, in OpenAI's shapes."""

from __future__ import annotations

from anyio import CancelScope

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette import ServerSentEvent

from sluice.api.anthropic.routes import describe_validation_error
from sluice.api.auth import require_principal
from sluice.api.errors import ApiError, bad_request
from sluice.serving.admission import ClientGone, open_session, until_admitted
from sluice.serving.generation import check_fits, checked
from sluice.api.ids import new_id
from sluice.api.json_body import json_object
from sluice.serving.runtime import ServingRuntime
from sluice.serving.safety_check import Guard, check_request_safety
from sluice.api.sse import event_stream_response, run_with_deadline
from sluice.gateway.gateway import Session
from sluice.gateway.rate_limit_headers import rate_limit_headers
from sluice.types import INT32_MAX, INT64_MAX, INT64_MIN, FinishReason, GenerationRequest, SamplingParams, Usage

ROUTE = "/v1/chat/completions"
FINISH = {
    FinishReason.EOS: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CONTEXT: "length",
}


class _Strict(BaseModel):
    # strict: JSON booleans and integers only ("stream": "yes" is a 400)
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class ChatCompletionRequest(_Strict):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)  # not OpenAI's; vLLM-compatible extension
    n: int = Field(1, ge=1, le=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    # accepted for compatibility; not applied by this engine (documented in docs/API.md)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    user: str | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


def _parse(raw: bytes, lenient: bool) -> ChatCompletionRequest:
    data = json_object(raw, "We could not parse the JSON body of your request")
    unknown = [k for k in data if k not in ChatCompletionRequest.model_fields]
    if unknown and not lenient:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    data = {k: v for k, v in data.items() if k not in unknown}
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        message = describe_validation_error(exc)
        raise bad_request(message, param=message.split(":", 1)[0]) from None


def _messages(body: ChatCompletionRequest) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for i, m in enumerate(body.messages):
        if isinstance(m.content, list):
            text = "\n\n".join(p.text for p in m.content)
        else:
            text = m.content or ""
        if m.tool_calls:
            text = (text + "\n" if text else "") + json.dumps(m.tool_calls)
        if not text and m.role != "assistant":
            raise bad_request(f"messages.{i}.content: must be a non-empty string or list of text parts", param=f"messages.{i}.content")
        role = {"developer": "system", "tool": "user"}.get(m.role, m.role)
        out.append({"role": role, "content": text})
    return out


def build_router(rt: ServingRuntime) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        principal = await require_principal(request, rt.authenticator)
        body = _parse(await request.body(), not rt.settings.reject_unknown_fields)
        _, tokenizer, info = rt.require_ready()
        if body.model not in rt.model_ids:
            raise ApiError(404, f"The model `{body.model}` does not exist or you do not have access to it.", code="model_not_found")
        messages = _messages(body)
        ids = await asyncio.to_thread(tokenizer.encode_chat, messages)
        check_fits(len(ids), info.max_model_len)
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if any(not s for s in stop):
            raise bad_request("stop: stop sequences must be non-empty strings", param="stop")
        sampling = checked(SamplingParams(
            max_tokens=body.max_completion_tokens or body.max_tokens or (info.max_model_len - len(ids)),
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k or 0,
            seed=body.seed,
            stop=tuple(stop),
        ))
        gen = GenerationRequest(new_id("chatcmpl"), ids, sampling, priority=principal.priority, tenant=principal.tenant)
        key_body = body.model_dump(exclude_none=True, exclude={"stream", "stream_options", "user", "metadata", "store"})
        texts = [m["content"] for m, raw in zip(messages, body.messages) if raw.role != "assistant" and m["content"]]
        guard = check_request_safety(rt, principal, texts, gen.request_id)  # L1 before the 200
        opening = asyncio.ensure_future(open_session(rt, request, principal, gen, body.model, ROUTE, key_body))
        try:
            await until_admitted(request, opening)  # a client that leaves while queued leaves the queue
        except ClientGone:
            return Response(status_code=499)
        session = opening.result()
        headers = rate_limit_headers(session.decision)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = _stream(rt, session, gen, body.model, include_usage, guard)
            return event_stream_response(rt, events, None, headers, session.close, request)
        try:
            return await _complete(rt, session, gen, body.model, headers, guard)
        finally:
            await session.close()

    return router


def _usage(u: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.prompt_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


async def _complete(
    rt: ServingRuntime, session: Session, gen: GenerationRequest, model: str, headers: dict[str, str], guard: Guard
) -> JSONResponse:
    text, last = await guard.collect(session.events())
    if last is None or (last.refusal is None and (last.final is None or last.final.finish_reason not in FINISH)):
        raise ApiError(500, "the engine failed while generating this request")
    finish = "content_filter" if last.refusal is not None else FINISH[last.final.finish_reason]  # type: ignore[union-attr]
    usage = last.usage or Usage()
    return JSONResponse(
        {
            "id": gen.request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "finish_reason": finish,
                    "logprobs": None,
                }
            ],
            "usage": _usage(usage),
        },
        headers=headers,
    )


async def _stream(
    rt: ServingRuntime, session: Session, gen: GenerationRequest, model: str, include_usage: bool, guard: Guard
) -> AsyncIterator[Any]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None, usage: dict[str, Any] | None = None, choices: bool = True) -> ServerSentEvent:
        body: dict[str, Any] = {"id": gen.request_id, "object": "chat.completion.chunk", "created": created, "model": model}
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}] if choices else []
        if include_usage:
            body["usage"] = usage
        return ServerSentEvent(data=json.dumps(body, separators=(",", ":"), ensure_ascii=False))

    yield ServerSentEvent(comment="ping")
    first = True
    try:
        async for piece in run_with_deadline(rt, guard.pieces(session.events())):
            if first:
                first = False
                yield chunk({"role": "assistant", "content": ""}, None)
            if piece.text:
                yield chunk({"content": piece.text}, None)
            event = piece.final
            if piece.refusal is None and event is not None and event.finish_reason not in FINISH:
                yield _error_event("the engine failed while generating", "server_error")
                return
            if piece.refusal is not None or event is not None:
                yield chunk({}, "content_filter" if piece.refusal is not None else FINISH[event.finish_reason])  # type: ignore[union-attr]
                if include_usage:
                    yield chunk({}, None, _usage(piece.usage or Usage()), choices=False)
                yield ServerSentEvent(data="[DONE]")
                return
    except ApiError as exc:
        yield _error_event(exc.message, "server_error" if exc.status >= 500 else "invalid_request_error")
    except TimeoutError:
        yield _error_event("the stream exceeded its maximum duration or the server is shutting down", "server_error")
    finally:
        with CancelScope(shield=True):  # settle limits and leases even when the client is gone
            await session.close()


def _error_event(message: str, kind: str) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}))
