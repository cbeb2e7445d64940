"""What one generation produces, as the pipeline hands it to a renderer.

A stream of `TextDelta`s (and, when the request offers tools, tool-call pieces: `ToolCallStarted`,
`ToolInputDelta`…, `ToolCallDone` per call; with the search server tool, its calls are marked
`server` and each is followed by a `ServerToolResult`) ends with exactly one of `Finished`,
`Refused` or `Failed`; a renderer
turns them into its wire format (JSON or SSE) and nothing else. Every outcome carries the usage
so far, so a renderer can report the prompt's usage at the first outcome (Anthropic's
`message_start`) and the final usage at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.models.tools.parser import ToolArgsDelta, ToolCallEnd, ToolCallStart
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.search_tool.search_error import SearchToolError
from sluice.tool_types import SearchResult
from sluice.types import FinishReason, TokenLogprob, Usage


@dataclass(slots=True)
class TextDelta:
    """Text safe to send (past the stream guard)."""

    text: str
    usage: Usage = field(default_factory=Usage)
    # when the request asked for logprobs: those of the tokens this text completes (a token is
    # reported once its text is released), and the prompt's with the first outcome
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass(slots=True)
class Finished:
    """A normal end: end of turn, max_tokens, a stop sequence, or the context window filled."""

    reason: FinishReason  # EOS | LENGTH | STOP_SEQUENCE | CONTEXT
    stop_sequence: str | None = None
    usage: Usage = field(default_factory=Usage)
    tool_calls: int = 0  # complete client tool calls in the reply (EOS with calls: the "tool_use" stop)
    server_tool_uses: int = 0  # searches the search server tool ran (those the service answered)
    # the search tool's rounds ran out with the model still searching (Anthropic `pause_turn`:
    # the client sends the reply back to continue)
    paused: bool = False
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the rest, as on TextDelta
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def called_tools(self) -> bool:
        """The turn ended because the model called tools (Anthropic `tool_use`, OpenAI `tool_calls`)."""
        return self.tool_calls > 0 and self.reason is FinishReason.EOS


# The tool-call pieces are the parser's (models/tools/parser.py), each with the usage so far.
@dataclass(slots=True)
class ToolCallStarted(ToolCallStart):
    """A tool call begins: the `index`-th call of the reply (0, 1, …), its id and tool name."""

    usage: Usage = field(default_factory=Usage)
    server: bool = False  # a call of the search server tool (the gateway runs it)


@dataclass(slots=True)
class ToolInputDelta(ToolArgsDelta):
    """A piece of a call's input JSON; a call's pieces concatenate to `ToolCallDone.arguments`."""

    usage: Usage = field(default_factory=Usage)


@dataclass(slots=True)
class ToolCallDone(ToolCallEnd):
    """A call's input is complete (`complete` False: the reply was cut inside it, `input` {})."""

    usage: Usage = field(default_factory=Usage)
    server: bool = False  # a call of the search server tool (a ServerToolResult follows)


@dataclass(slots=True)
class ServerToolResult:
    """What a search server tool call found: its hits in rank order, or why there are none."""

    tool_use_id: str
    results: list[SearchResult] = field(default_factory=list)
    error: SearchToolError | None = None
    usage: Usage = field(default_factory=Usage)


@dataclass(slots=True)
class Refused:
    """A safety layer stopped the reply (Anthropic's refusal stop, OpenAI's content_filter)."""

    layer: str
    category: str
    explanation: str
    usage: Usage = field(default_factory=Usage)


@dataclass(slots=True)
class Failed:
    """The generation could not complete after it started (engine gone or failed, timeout,
    drain); the kind is wire-neutral, api/errors.py maps it."""

    kind: ErrorKind
    message: str
    usage: Usage = field(default_factory=Usage)
    retry_after_s: float | None = None  # when the caller may try again (a refusal's)

    def as_error(self) -> ServingError:
        """The refusal this failure is when no response has started yet (a real HTTP status)."""
        return ServingError(
            self.kind, self.message, retry_after_s=self.retry_after_s if self.retry_after_s is not None else 1.0
        )


ToolPiece = ToolCallStarted | ToolInputDelta | ToolCallDone | ServerToolResult
Outcome = TextDelta | ToolPiece | Finished | Refused | Failed
Final = Finished | Refused | Failed
