"""What one generation produces, as the pipeline hands it to a renderer.

A stream of `TextDelta`s ends with exactly one of `Finished`, `Refused` or `Failed`; a renderer
turns them into its wire format (JSON or SSE) and nothing else. Every outcome carries the usage
so far, so a renderer can report the prompt's usage at the first outcome (Anthropic's
`message_start`) and the final usage at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.serving.errors import ErrorKind
from sluice.types import FinishReason, Usage


@dataclass(slots=True)
class TextDelta:
    """Text safe to send (past the stream guard)."""

    text: str
    usage: Usage = field(default_factory=Usage)


@dataclass(slots=True)
class Finished:
    """A normal end: end of turn, max_tokens, a stop sequence, or the context window filled."""

    reason: FinishReason  # EOS | LENGTH | STOP_SEQUENCE | CONTEXT
    stop_sequence: str | None = None
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


Outcome = TextDelta | Finished | Refused | Failed
Final = Finished | Refused | Failed
