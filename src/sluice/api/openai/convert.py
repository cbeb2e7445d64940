"""An OpenAI chat completions request → the serving pipeline's request."""

from __future__ import annotations

import json

from pydantic import ValidationError
from starlette.requests import Request

from sluice.api.anthropic.convert import describe_validation_error
from sluice.api.errors import bad_request
from sluice.api.headers import pinned_version, queue_timeout, wants_cache
from sluice.api.json_body import json_object
from sluice.api.openai.schema import ChatCompletionRequest
from sluice.gateway.principal import Principal
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.types import SamplingParams

_ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT,
          "tool": Role.USER}  # a tool result is the user's side of the exchange
# body fields that do not change the reply: left out of the coalescing key
_NOT_IN_KEY = {"stream", "stream_options", "user", "metadata", "store"}


def parse_body(raw: bytes, lenient: bool) -> ChatCompletionRequest:
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


def to_conversation(body: ChatCompletionRequest) -> Conversation:
    """One turn per message (OpenAI does not merge them); tool calls of an assistant message are
    rendered as JSON text after its content, so a text-only model still sees the exchange."""
    turns: list[Turn] = []
    for i, m in enumerate(body.messages):
        text = "\n\n".join(p.text for p in m.content) if isinstance(m.content, list) else (m.content or "")
        if m.tool_calls:
            text = (text + "\n" if text else "") + json.dumps(m.tool_calls)
        if not text and m.role != "assistant":
            raise bad_request(f"messages.{i}.content: must be a non-empty string or list of text parts",
                              param=f"messages.{i}.content")
        turns.append(Turn(_ROLES[m.role], [text]))
    return Conversation(turns)


def to_serving_request(body: ChatCompletionRequest, principal: Principal, request_id: str, request: Request) -> ServingRequest:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not s for s in stop):
        raise bad_request("stop: stop sequences must be non-empty strings", param="stop")
    return ServingRequest(
        request_id=request_id,
        route=Route.CHAT_COMPLETIONS,
        principal=principal,
        model=body.model,
        conversation=to_conversation(body),
        max_tokens=body.max_completion_tokens or body.max_tokens,  # None: the rest of the context window
        sampling=SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=body.top_k or 0,
            seed=body.seed,
            stop=tuple(stop),
        ),
        dedup_body=body.model_dump(exclude_none=True, exclude=_NOT_IN_KEY),
        queue_timeout_s=queue_timeout(request),
        use_cache=wants_cache(request),
        affinity_user=body.user,
        pin=pinned_version(request),
    )
