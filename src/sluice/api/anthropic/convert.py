"""An Anthropic Messages request → the serving pipeline's request (and the wire checks on the way)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from sluice.api.anthropic.prompt import to_conversation
from sluice.api.anthropic.schema import MessagesRequest
from sluice.api.anthropic.tools import output_format, search_tool, tool_choice
from sluice.api.errors import bad_request
from sluice.api.headers import pinned_version, queue_timeout, wants_cache
from sluice.api.json_body import json_object
from sluice.config import Settings
from sluice.gateway.principal import Principal
from sluice.serving.output_budget import OutputBudget
from sluice.serving.request import Route, ServingRequest
from sluice.types import Sampling

VERSIONS = ("2023-06-01", "2026-10-21")
# body fields that do not change the reply: left out of the coalescing key
_NOT_IN_KEY = {"stream", "metadata", "background"}


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


def api_version(request: Request, settings: Settings) -> str:
    # a missing header takes the configured default; a header sent empty is a bad value, not a
    # missing one (the documented enum has no "")
    given = request.headers.get("anthropic-version")
    version = settings.default_anthropic_version if given is None else given
    if version is None:
        raise bad_request("anthropic-version: header is required")
    if version not in VERSIONS:
        raise bad_request(f"anthropic-version: {version!r} is not a supported version ({', '.join(VERSIONS)})")
    return version


def sampling_of(body: MessagesRequest, version: str, settings: Settings) -> Sampling:
    given = [f for f in ("temperature", "top_p", "top_k") if getattr(body, f) is not None]
    if given and version == "2026-10-21" and settings.strict_sampling_params:
        raise bad_request(f"{given[0]}: is not supported with anthropic-version 2026-10-21")
    if any(not s for s in body.stop_sequences or ()):
        raise bad_request("stop_sequences: each stop sequence must be a non-empty string")
    return Sampling(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_k=body.top_k or 0,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=tuple(body.stop_sequences or ()),
    )


def betas(request: Request | None) -> list[str]:
    """The `anthropic-beta` header's comma-joined names (advisory, except the ones we interpret)."""
    raw = request.headers.get("anthropic-beta", "") if request is not None else ""
    return [b.strip() for b in raw.split(",") if b.strip()]


def to_serving_request(
    body: MessagesRequest,
    principal: Principal,
    request_id: str,
    version: str,
    settings: Settings,
    request: Request | None = None,
    route: Route = Route.MESSAGES,
) -> ServingRequest:
    """`request`: the HTTP request, for the queue-timeout and cache headers (None for batch items)."""
    search = search_tool(body.tools)
    return ServingRequest(
        request_id=request_id,
        route=route,
        principal=principal,
        model=body.model,
        conversation=to_conversation(body),
        budget=OutputBudget(body.max_tokens),
        sampling=sampling_of(body, version, settings),
        # a reply that runs searches depends on the index's state: never shared nor cached
        dedup_body=None if search is not None else body.model_dump(exclude_none=True, exclude=_NOT_IN_KEY),
        queue_timeout_s=queue_timeout(request) if request is not None else None,
        use_cache=wants_cache(request) if request is not None else True,
        affinity_user=body.metadata.user_id if body.metadata is not None else None,
        pin=pinned_version(request) if request is not None else None,
        tool_choice=tool_choice(body.tool_choice),
        output_format=output_format(body, betas(request)),
        tool_id_prefix="toolu_",
        search_tool=search,
    )
