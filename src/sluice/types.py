"""The internal request/response types shared by every layer, defined once.

The API layer turns wire formats into a `GenerationRequest`; the engine answers with a stream of
`GenerationEvent`s. Nothing here depends on HTTP, asyncio or torch.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import time
from dataclasses import dataclass, field

from sluice.errors import InvalidRequestError

# what the worker protocol (worker/proto/engine.proto) can carry
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# the most alternatives a logprobs request may ask for per position (OpenAI's limit is 20)
MAX_LOGPROBS = 20
# Both wire formats restrict tool names to this; the grammar relies on it (a name needs no
# escaping inside the call's JSON string).
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class FinishReason(str, enum.Enum):
    """Why a generation ended. Values are ours; each API maps them onto its own vocabulary."""

    EOS = "eos"  # the model emitted an end-of-sequence token
    LENGTH = "length"  # max_tokens reached
    STOP_SEQUENCE = "stop_sequence"  # a stop string or stop token matched
    CONTEXT = "context"  # the context window is full
    ABORT = "abort"  # cancelled by the caller (disconnect, kill, shutdown)
    ERROR = "error"  # the engine failed this request


class GuidedKind(str, enum.Enum):
    """What a grammar-constrained reply must be (see `GuidedDecoding`)."""

    JSON_SCHEMA = "json_schema"  # one JSON value that validates against `schema`
    JSON_OBJECT = "json_object"  # any JSON object
    TOOL_CALLS = "tool_calls"  # text and/or tool calls spelled in `calls`' format


@dataclass(slots=True, frozen=True)
class ToolGrammar:
    """One callable tool as the grammar sees it: its name and its arguments' schema.

    `schema` is JSON text ("" = any JSON object). `strict`: a schema the decoder cannot enforce
    is an error; otherwise such a tool falls back to "any JSON object" (best effort, like a
    non-strict tool upstream).
    """

    name: str
    schema: str = ""
    strict: bool = False


@dataclass(slots=True, frozen=True)
class CallSyntax:
    """How one tool call is spelled in the model's output (set by the model family's tool format):
    `begin` + name + `middle` + arguments JSON + `end`, calls joined by `separator`. Free text
    never contains `trigger`; once the model writes it, the rest of the call is forced."""

    trigger: str
    begin: str
    middle: str
    end: str
    separator: str = "\n"


@dataclass(slots=True, frozen=True)
class GuidedDecoding:
    """A per-request grammar, wire-neutral: the engine compiles it into a token mask.

    JSON_SCHEMA: `schema` (JSON text; key order is generation order). TOOL_CALLS: `tools` in
    `calls`' spelling; `allow_text` lets free text come first or instead (tool_choice auto; the
    text is `schema`-shaped JSON when `schema` is set), `min_calls`/`max_calls` bound the number
    of calls (any / named tool: 1..; disable_parallel_tool_use: max 1; tool_choice none: max 0).
    Frozen and hashable: it is the key of the engine's compiled-grammar cache.
    """

    kind: GuidedKind
    schema: str = ""
    tools: tuple[ToolGrammar, ...] = ()
    calls: CallSyntax | None = None
    allow_text: bool = True
    min_calls: int = 0
    max_calls: int | None = None  # None: unbounded

    def validate(self) -> None:
        """The structural checks (no grammar library needed); the engine checks the schemas."""
        if not isinstance(self.kind, GuidedKind):
            raise InvalidRequestError(f"guided decoding: unknown kind {self.kind!r}")
        if self.kind is GuidedKind.JSON_SCHEMA and not self.schema:
            raise InvalidRequestError("guided decoding: a json_schema grammar needs a schema")
        if self.kind is not GuidedKind.TOOL_CALLS:
            return
        if self.calls is None or not self.calls.trigger or not self.calls.begin.startswith(self.calls.trigger):
            raise InvalidRequestError(
                "guided decoding: tool calls need a call syntax whose begin starts with its trigger"
            )
        high = self.min_calls if self.max_calls is None else self.max_calls
        if not 0 <= self.min_calls <= high <= INT32_MAX:  # int32 on the worker protocol
            raise InvalidRequestError(f"guided decoding: bad call bounds {self.min_calls}..{self.max_calls}")
        if self.max_calls != 0 and not self.tools:
            raise InvalidRequestError("guided decoding: tool calls are allowed but no tool is given")
        if not self.allow_text and self.min_calls < 1:
            raise InvalidRequestError("guided decoding: a reply with neither text nor a call is empty")
        names = [t.name for t in self.tools]
        bad = next((n for n in names if not TOOL_NAME.fullmatch(n)), None)
        if bad is not None:
            raise InvalidRequestError(f"tool name {bad!r} must match {TOOL_NAME.pattern}")
        if len(set(names)) != len(names):
            raise InvalidRequestError("tool names must be unique")


@dataclass(slots=True, frozen=True)
class Sampling:
    """How to pick tokens, as the client chose it: what a request carries from the API to
    planning. The budget and the grammar depend on the version that serves it (its context
    window, its tool format), so they join in SamplingParams when the request is planned.

    temperature 0 is greedy. top_k 0 and top_p 1.0 switch those filters off. A seed makes
    sampling reproducible: the random draw for output position i depends only on (seed, i),
    so a request gives the same tokens alone, in a batch, or after a preemption.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # generate max_tokens whatever EOS says (benchmarks; vLLM's extension)
    # Log-probabilities (computed only when asked): None = off; n = the chosen token's logprob
    # plus the n most likely alternatives (0..MAX_LOGPROBS). `logprobs` covers each output token,
    # `prompt_logprobs` each prompt token after the first (a request that asks for them is not
    # served from the prefix cache: every prompt position's logits must be computed).
    logprobs: int | None = None
    prompt_logprobs: int | None = None


@dataclass(slots=True, frozen=True)
class SamplingParams(Sampling):
    """How to pick tokens and when to stop: the client's Sampling with the budget and the
    grammar the planned version gives it (`SamplingParams.of`), as the engine runs it."""

    max_tokens: int = 256  # the engine-level default; served requests get theirs from planning
    stop_token_ids: tuple[int, ...] = ()
    guided: GuidedDecoding | None = None  # grammar-constrained decoding (JSON, tool calls)

    @classmethod
    def of(cls, choice: Sampling, *, max_tokens: int, guided: GuidedDecoding | None = None) -> SamplingParams:
        """The client's choices with the budget and grammar planning resolved for a version."""
        chosen = {f.name: getattr(choice, f.name) for f in dataclasses.fields(Sampling)}
        return cls(**chosen, max_tokens=max_tokens, guided=guided)

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad field. Also bounds every value to what
        the worker protocol carries (int32 counts, an int64 seed), so a request that passes here
        can always be sent to a worker: the API calls this before a stream opens."""
        if not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens <= INT32_MAX:
            raise InvalidRequestError(f"max_tokens must be an integer in [1, {INT32_MAX}], got {self.max_tokens!r}")
        if not 0 <= self.top_k <= INT32_MAX:
            raise InvalidRequestError(f"top_k must be in [0, {INT32_MAX}], got {self.top_k!r}")
        if self.seed is not None and not INT64_MIN <= self.seed <= INT64_MAX:
            raise InvalidRequestError(f"seed must be a 64-bit signed integer, got {self.seed!r}")
        if any(not 0 <= t <= INT32_MAX for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be token ids")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop sequences must be non-empty strings")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not (isinstance(n, int) and 0 <= n <= MAX_LOGPROBS):
                raise InvalidRequestError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {n!r}")
        if self.guided is not None:
            self.guided.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(slots=True, frozen=True)
class AdapterRef:
    """The LoRA adapter a request runs with: `name` (what the fleet registered it as; a
    worker's resident adapters are keyed by name and source) and `source`, where a worker loads
    it from (a local folder or s3://bucket/prefix: a PEFT adapter folder). Every request
    carries both, so any worker of the base model can serve it, loading or reloading it on
    demand (docs/LORA.md)."""

    name: str
    source: str


def token_cost(prompt_tokens: int, max_tokens: int) -> int:
    """The tokens a request can occupy, prompt + max_tokens: the one estimate the quota
    reservation, the admission queue, the worker's load accounting and the engine's context
    bound count it at."""
    return prompt_tokens + max_tokens


@dataclass(slots=True)
class GenerationRequest:
    """One request as every layer below the API sees it: token ids in, events out.

    `priority`: lower values are served first (0 is the most urgent band); ties go to the
    earlier `arrival_time`. `tenant` namespaces the prefix cache so that one tenant can never
    hit (and so probe) another tenant's cached blocks.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0
    tenant: str = ""
    arrival_time: float = field(default_factory=time.monotonic)
    # A generation continued from another worker (mid-stream failover): these output tokens were
    # already generated there, and the first `resumed_text_chars` characters of their text were
    # delivered. The engine recomputes them as context and goes on exactly where that worker
    # stopped: output positions (hence seeded sampling), max_tokens and stop sequences continue.
    resumed_output_ids: list[int] = field(default_factory=list)
    resumed_text_chars: int = 0
    adapter: AdapterRef | None = None  # a LoRA adapter on the base model; None: the base alone

    @property
    def token_cost(self) -> int:
        """This request's `token_cost`."""
        return token_cost(len(self.prompt_token_ids), self.sampling.max_tokens)


@dataclass(slots=True)
class Usage:
    """Token accounting for one request. prompt_tokens = cached_tokens + computed prompt tokens."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """One position's log-probability: of `token_id` under the model's distribution (the exact
    log-softmax of its logits, before temperature, top-k/p or grammar masks), and the `top` most
    likely (token id, logprob) pairs there, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class GenerationEvent:
    """A piece of one request's output: new text and token ids since the previous event.

    The last event of a request has `finished=True` and a `finish_reason`. Text never holds
    half a UTF-8 character nor any part of a matched stop sequence.
    """

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    queue_time_s: float | None = None  # on the first token's event: seconds queued in the engine
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token_ids entry, when asked
    # on the first token's event, when asked: one per prompt token (the first is None: nothing
    # precedes it)
    prompt_logprobs: list[TokenLogprob | None] | None = None
