"""An OpenAI chat completions request → the serving pipeline's request."""

from __future__ import annotations

from pydantic import ValidationError
from starlette.requests import Request

from sluice.api.anthropic.convert import describe_validation_error
from sluice.api.errors import bad_request
from sluice.api.headers import pinned_version, queue_timeout, wants_cache
from sluice.api.json_body import json_object
from sluice.api.openai.sampling import sampling_of
from sluice.api.openai.schema import ChatCompletionRequest
from sluice.api.openai.tools import assistant_calls, response_format, tool_choice, tool_specs
from sluice.errors import InvalidRequestError
from sluice.gateway.principal import Principal
from sluice.serving.output_budget import OutputBudget
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.tool_types import Part, ToolResult

_ROLES = {
    "system": Role.SYSTEM,
    "developer": Role.SYSTEM,
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
    "tool": Role.USER,
}  # a tool result is the user's side of the exchange
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
    """One turn per message (OpenAI does not merge them), except that a run of `tool` messages
    is one turn of tool results (the answers to one assistant turn's calls); an assistant
    message's tool calls follow its text as calls."""
    turns: list[Turn] = []
    for i, m in enumerate(body.messages):
        text = "\n\n".join(p.text for p in m.content) if isinstance(m.content, list) else (m.content or "")
        if m.role == "tool":
            if not m.tool_call_id:
                raise bad_request(
                    f"messages.{i}.tool_call_id: required for a tool message", param=f"messages.{i}.tool_call_id"
                )
            result = ToolResult(m.tool_call_id, text)
            if i and body.messages[i - 1].role == "tool":
                turns[-1].parts.append(result)
                turns[-1].marked.append(False)
            else:
                turns.append(Turn(_ROLES[m.role], [result]))
            continue
        parts: list[Part] = [text] if text else []
        if m.tool_calls:
            parts += assistant_calls(m.tool_calls, f"messages.{i}.tool_calls")
        if not parts and m.role != "assistant":
            raise bad_request(
                f"messages.{i}.content: must be a non-empty string or list of text parts", param=f"messages.{i}.content"
            )
        turns.append(Turn(_ROLES[m.role], parts or [""]))
    conv = Conversation(turns, tools=tool_specs(body.tools))
    try:
        conv.check_tool_pairs()
    except InvalidRequestError as exc:
        raise bad_request(str(exc), param="messages") from None
    return conv


def to_serving_request(
    body: ChatCompletionRequest, principal: Principal, request_id: str, request: Request
) -> ServingRequest:
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs: logprobs must be set to true when top_logprobs is used", param="top_logprobs")
    return ServingRequest(
        request_id=request_id,
        route=Route.CHAT_COMPLETIONS,
        principal=principal,
        model=body.model,
        conversation=to_conversation(body),
        budget=OutputBudget(body.max_completion_tokens or body.max_tokens),  # None: the rest of the context window
        sampling=sampling_of(body, logprobs=(body.top_logprobs or 0) if body.logprobs else None),
        dedup_body=body.model_dump(exclude_none=True, exclude=_NOT_IN_KEY),
        queue_timeout_s=queue_timeout(request),
        use_cache=wants_cache(request),
        affinity_user=body.user,
        pin=pinned_version(request),
        tool_choice=tool_choice(body.tool_choice, body.parallel_tool_calls),
        output_format=response_format(body.response_format),
        tool_id_prefix="call_",
    )
