"""One request as the serving pipeline takes it: validated by its wire format, not yet tokenized.

A wire format (api/anthropic, api/openai) or the batch runner fills this in; the pipeline does
the rest the same way for all of them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sluice.gateway.principal import Principal
from sluice.serving.guided import OutputFormat
from sluice.serving.output_budget import OutputBudget
from sluice.serving.prompt import Conversation
from sluice.tool_types import SearchToolUse, ToolChoice
from sluice.types import Sampling

# response headers (docs/FLEET.md); VERSION_HEADER is also the request header that pins a version
VERSION_HEADER = "sluice-model-version"
FALLBACK_HEADER = "sluice-fallback-from"  # the requested model, when a fallback model served
QUOTA_WARNING_HEADER = "sluice-quota-exceeded"  # models whose soft token quota this request was over


class Route(str, enum.Enum):
    """Where a request came from: the label of its latency metrics."""

    MESSAGES = "/v1/messages"
    CHAT_COMPLETIONS = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    BATCH = "/v1/messages/batches"


@dataclass(slots=True)
class ServingRequest:
    request_id: str  # the id the client sees (msg_…, chatcmpl_…)
    route: Route
    principal: Principal
    model: str  # the id the client asked for
    conversation: Conversation
    # the client's max_tokens, and what is left of it: one object however many generations
    # the reply takes (the search tool's rounds share it)
    budget: OutputBudget
    sampling: Sampling = field(default_factory=Sampling)  # budget and grammar join at planning (SamplingParams.of)
    # the canonical body for coalescing identical requests (None: never coalesce); fields that
    # do not change the reply are already left out by the wire format
    dedup_body: dict[str, Any] | None = None
    queue_timeout_s: float | None = None  # a shorter admission deadline than the tier's
    use_cache: bool = True  # False: skip the response cache
    band: int | None = None  # admission band override (batch work)
    # the end user behind the call (Anthropic metadata.user_id, OpenAI user): keeps them on one
    # model version (sticky A/B); without it the API key decides
    affinity_user: str | None = None
    pin: str | None = None  # the `sluice-model-version` request header: this version or an error
    # tool use and structured outputs (the tools themselves are in the conversation: they are
    # part of the prompt); serving/guided.py turns them into the reply's grammar
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    output_format: OutputFormat | None = None
    tool_id_prefix: str = "toolu_"  # the wire format's call id shape (OpenAI: "call_")
    # the search server tool, when the request declares it (its tool spec is in the
    # conversation's tools; the gateway runs its calls: serving/search_tool/)
    search_tool: SearchToolUse | None = None
    # a raw prompt (OpenAI's legacy completions): text tokenized as is, or token ids used as
    # they are, with no chat template; `conversation` then only holds its text for the safety rules
    raw_prompt: str | list[int] | None = None

    @property
    def prefill_only(self) -> bool:
        return self.budget.limit == 0

    @property
    def server_tool_names(self) -> frozenset[str]:
        """The tools whose calls the gateway runs (not returned to the client to run)."""
        return frozenset() if self.search_tool is None else frozenset({self.search_tool.name})
