"""An OpenAI legacy completions request → the serving pipeline's requests (one per prompt × n).

The prompt is used as given: text is tokenized with no chat template, token ids go to the
engine as they are. `echo` with `logprobs` asks the engine for the prompt's logprobs too, which
is how evaluation harnesses score a continuation (`max_tokens: 0`, or 1 and ignore the output):
such a choice computes its whole prompt (no prefix-cache hit) so every position is scored.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from starlette.requests import Request

from sluice.api.anthropic.convert import describe_validation_error
from sluice.api.errors import bad_request
from sluice.api.headers import pinned_version, queue_timeout, wants_cache
from sluice.api.json_body import json_object
from sluice.api.openai.completions_schema import MAX_CHOICES, CompletionRequest
from sluice.api.openai.sampling import sampling_of
from sluice.gateway.principal import Principal
from sluice.serving.choices import per_choice
from sluice.serving.output_budget import OutputBudget
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest

_NOT_IN_KEY = {"stream", "stream_options", "user"}


@dataclass(slots=True)
class Prompted:
    """One choice's request and where it sits in the reply."""

    request: ServingRequest
    prompt_index: int  # which prompt of the request
    index: int  # the choice's index in the reply (prompt_index × n + j)


def parse_body(raw: bytes, lenient: bool) -> CompletionRequest:
    data = json_object(raw, "We could not parse the JSON body of your request")
    unknown = [k for k in data if k not in CompletionRequest.model_fields]
    if unknown and not lenient:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    try:
        return CompletionRequest.model_validate({k: v for k, v in data.items() if k not in unknown})
    except ValidationError as exc:
        message = describe_validation_error(exc)
        raise bad_request(message, param=message.split(":", 1)[0]) from None


def prompts(body: CompletionRequest) -> list[str | list[int]]:
    p = body.prompt
    if isinstance(p, str):
        return [p]
    if not p:
        raise bad_request("prompt: must not be an empty list", param="prompt")
    if all(isinstance(x, int) for x in p):
        return [list(p)]  # type: ignore[arg-type]
    return list(p)  # type: ignore[arg-type]


def to_serving_requests(
    body: CompletionRequest, principal: Principal, request_id: str, request: Request
) -> list[Prompted]:
    if body.suffix is not None:
        raise bad_request("suffix: insertion is not supported (suffix must be null)", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request("best_of: only best_of equal to n is supported (choices are not ranked)", param="best_of")
    raw = prompts(body)
    if len(raw) * body.n > MAX_CHOICES:
        raise bad_request(f"prompt: {len(raw)} prompts × n {body.n} is more than {MAX_CHOICES} choices", param="prompt")
    sampling = sampling_of(body, logprobs=body.logprobs, prompt_logprobs=body.logprobs if body.echo else None)
    dedup = body.model_dump(exclude_none=True, exclude=_NOT_IN_KEY | {"prompt"})
    out: list[Prompted] = []
    for i, prompt in enumerate(raw):
        text = prompt if isinstance(prompt, str) else ""
        base = ServingRequest(
            request_id=request_id if len(raw) == 1 else f"{request_id}-p{i}",
            route=Route.COMPLETIONS,
            principal=principal,
            model=body.model,
            conversation=Conversation([Turn(Role.USER, [text])]),  # what the input safety rules read
            budget=OutputBudget(body.max_tokens),
            sampling=sampling,
            dedup_body={**dedup, "prompt": prompt},
            queue_timeout_s=queue_timeout(request),
            use_cache=wants_cache(request),
            affinity_user=body.user,
            pin=pinned_version(request),
            raw_prompt=prompt,
        )
        for j, choice in enumerate(per_choice(base, body.n)):
            out.append(Prompted(choice, i, i * body.n + j))
    return out
