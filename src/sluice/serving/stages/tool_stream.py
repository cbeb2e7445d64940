"""Guarded text → text and tool-call outcomes, for a reply that may call tools.

It sits after the safety guard (serving/stages/guarded_stream.py), so the stream guard, the
classifier windows and the post-check read the raw reply, tool calls and their inputs
included, exactly as the model wrote it; only what they let through is parsed here into
`ToolCallStarted` / `ToolInputDelta` / `ToolCallDone` (models/tools/parser.py). Call markup is
never passed on as text: held-back text (a possible start of the call tag) is released at the
end only when the model ended the reply itself; a reply cut short (max_tokens, a stop sequence,
the context window) drops it with any call cut before its name. `Finished.tool_calls` counts
the complete calls, which is what makes the stop a tool-use stop.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Collection
from contextlib import aclosing

from sluice.models.tools.format import ToolFormat
from sluice.models.tools.parser import Piece, TextPiece, ToolArgsDelta, ToolCallEnd, ToolCallParser, ToolCallStart
from sluice.serving.outcomes import Finished, Outcome, TextDelta, ToolCallDone, ToolCallStarted, ToolInputDelta
from sluice.tool_types import new_tool_use_id
from sluice.types import FinishReason, Usage

SERVER_TOOL_ID_PREFIX = "srvtoolu_"


class _Outcomes:
    """Parser pieces → outcomes; a server tool's call gets its own id (the parser names a call
    only after its id is drawn)."""

    def __init__(self, server_names: Collection[str]):
        self.server_names = server_names
        self.server_ids: dict[int, str] = {}  # call index -> its srvtoolu_ id

    def __call__(self, piece: Piece, usage: Usage) -> Outcome:
        if isinstance(piece, TextPiece):
            return TextDelta(piece.text, usage)
        if isinstance(piece, ToolCallStart):
            if piece.name in self.server_names:
                self.server_ids[piece.index] = new_tool_use_id(SERVER_TOOL_ID_PREFIX)
            call_id = self.server_ids.get(piece.index, piece.id)
            return ToolCallStarted(piece.index, call_id, piece.name, usage, piece.index in self.server_ids)
        if isinstance(piece, ToolArgsDelta):
            return ToolInputDelta(piece.index, piece.json, usage)
        assert isinstance(piece, ToolCallEnd)
        call_id = self.server_ids.get(piece.index, piece.id)
        return ToolCallDone(
            piece.index,
            call_id,
            piece.name,
            piece.input,
            piece.arguments,
            piece.complete,
            usage,
            piece.index in self.server_ids,
        )


async def with_tool_calls(
    outcomes: AsyncIterator[Outcome], fmt: ToolFormat, id_prefix: str, server_names: Collection[str] = ()
) -> AsyncGenerator[Outcome, None]:
    parser = ToolCallParser(fmt, lambda: new_tool_use_id(id_prefix))
    _outcome = _Outcomes(server_names)
    complete = 0
    async with aclosing(outcomes):  # type: ignore[type-var]
        async for outcome in outcomes:
            if isinstance(outcome, TextDelta):
                for piece in parser.feed(outcome.text):
                    complete += isinstance(piece, ToolCallEnd) and piece.complete
                    yield _outcome(piece, outcome.usage)
                continue
            if isinstance(outcome, Finished):
                for piece in parser.finish(cut=outcome.reason is not FinishReason.EOS):
                    complete += isinstance(piece, ToolCallEnd) and piece.complete
                    yield _outcome(piece, outcome.usage)
                outcome.tool_calls = complete
            yield outcome  # a refusal or a failure ends the reply where it is
            return
