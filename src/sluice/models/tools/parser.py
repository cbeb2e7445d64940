"""Generated text deltas → typed pieces: text, tool-call start, argument JSON deltas, call end.

Both wire formats render from these pieces: Anthropic `content_block_start` (tool_use) /
`input_json_delta` / `content_block_stop`, OpenAI `delta.tool_calls` with index, id, name and
argument fragments. The argument deltas of a call concatenate to exactly `ToolCallEnd.arguments`
(the JSON text the model wrote), and `ToolCallEnd.input` is that text parsed.

The parser reads the family's spelling (`ToolFormat`): text until the trigger; then the header
`{"name": "N", "arguments": ` (whitespace-tolerant); then the arguments object, streamed while a
small scanner tracks strings and nesting to find where it ends; then the closing tag. Text is
held back only while it could still be the start of a trigger, and whitespace right before a
call or after the last one is dropped (it belongs to the call layout, not to a text block).
Without a grammar (or with a model that strays) a body the header pattern does not match is
buffered to the closing tag and parsed whole.

Call markup never comes out as text (issue 21): once the trigger is written, what follows is a
call. A body that is not a call, or a call cut before its name was read, is dropped (there is no
call to return and its markup is not text); a call cut after its name ends incomplete
(`ToolCallEnd.complete` False). At the end of a reply that was cut (max_tokens, a stop sequence,
the context window: `finish(cut=True)`) a held-back possible start of the trigger ("<tool") is
dropped too: it is the opening of a call that did not fit. After a natural end (EOS) it is text
the model ended with ("x <").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.models.tools.format import ToolFormat
from sluice.tool_types import ToolCall, new_tool_use_id


@dataclass(slots=True)
class TextPiece:
    text: str


@dataclass(slots=True)
class ToolCallStart:
    index: int  # 0, 1, … among this reply's calls
    id: str
    name: str


@dataclass(slots=True)
class ToolArgsDelta:
    index: int
    json: str


@dataclass(slots=True)
class ToolCallEnd:
    index: int
    id: str
    name: str
    input: dict[str, Any]
    arguments: str  # the JSON text; the call's ToolArgsDelta pieces concatenate to it
    complete: bool = True  # False: the reply ended inside the call (max_tokens, a stop)


Piece = TextPiece | ToolCallStart | ToolArgsDelta | ToolCallEnd


class _Args:
    """Finds the end of one JSON object in a stream: nesting depth outside strings."""

    __slots__ = ("depth", "in_string", "escape", "done")

    def __init__(self) -> None:
        self.depth, self.in_string, self.escape, self.done = 0, False, False, False

    def scan(self, text: str) -> int:
        """How many characters of `text` belong to the object (all of them if it continues)."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


@dataclass(slots=True)
class _Call:
    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    args: _Args | None = None  # set once the header is read
    ended: bool = False  # ToolCallEnd emitted; the closing tag may still be arriving


class ToolCallParser:
    """One reply's parser: `feed` each text delta, then `finish`; `calls` collects the calls."""

    def __init__(self, fmt: ToolFormat, new_id: Callable[[], str] = new_tool_use_id):
        self.fmt = fmt
        self.new_id = new_id
        self.calls: list[ToolCall] = []
        self._buf = ""  # text not yet turned into pieces
        self._call: _Call | None = None  # the call being read
        self._after_call = False  # whitespace here is layout, not text
        rest = re.escape(fmt.call_open[len(fmt.trigger) :].strip())
        self._header = re.compile(
            r"\s*"
            + rest
            + r"\s*\{\s*"
            + re.escape(json.dumps(fmt.name_key))
            + r'\s*:\s*"([^"\\]*)"\s*,\s*'
            + re.escape(json.dumps(fmt.arguments_key))
            + r"\s*:\s*(?=\{)"
        )

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def finish(self, cut: bool = False) -> list[Piece]:
        """The reply ended: release held-back text, close a call that was cut off. `cut`: the
        reply was cut short (not the model's own end), so a held-back start of the trigger was
        the start of a call, not text."""
        out: list[Piece] = []
        call, self._call = self._call, None
        if call is None:
            text = self._buf
            if cut:
                text = text[: len(text) - self._trigger_prefix(text)]
            self._emit_text(text, out, final=True)
        elif call.args is not None and not call.ended:
            out.append(self._end(call, complete=False))
        # else: the trigger, then no readable header (cut before the name, or not a call), or
        # a finished call's closing tag still arriving: markup, dropped
        self._buf = ""
        return out

    def _trigger_prefix(self, text: str) -> int:
        """The length of the longest end of `text` that could start the trigger (0: none)."""
        trigger = self.fmt.trigger
        return next((k for k in range(min(len(trigger) - 1, len(text)), 0, -1) if trigger.startswith(text[-k:])), 0)

    # -- the state machine: each call consumes what it can; True = call again ---------------
    def _step(self, out: list[Piece]) -> bool:
        call = self._call
        if call is None:
            return self._text(out)
        if call.args is None:
            return self._read_header(call, out)
        if not call.ended:
            return self._read_args(call, out)
        return self._read_close()

    def _emit_text(self, text: str, out: list[Piece], final: bool) -> None:
        """Emit `text` as a text piece; `final`: nothing of this text run follows (drop its
        trailing whitespace). Leading whitespace right after a call is dropped."""
        if self._after_call:
            text = text.lstrip()
        if final:
            text = text.rstrip()
        if text:
            out.append(TextPiece(text))
            self._after_call = False

    def _text(self, out: list[Piece]) -> bool:
        trigger = self.fmt.trigger
        at = self._buf.find(trigger)
        if at >= 0:
            self._emit_text(self._buf[:at], out, final=True)
            self._buf = self._buf[at + len(trigger) :]
            self._call = _Call(index=len(self.calls))
            return True
        # hold back a possible start of the trigger, and the whitespace before it (it is
        # dropped if a call follows)
        buf = self._buf
        cut = len(buf) - self._trigger_prefix(buf)
        while cut > 0 and buf[cut - 1].isspace():
            cut -= 1
        if self._after_call and not buf[:cut].strip():
            return False  # only layout so far
        self._emit_text(buf[:cut], out, final=False)
        self._buf = buf[cut:]
        return False

    def _read_header(self, call: _Call, out: list[Piece]) -> bool:
        m = self._header.match(self._buf)
        if m is None:
            close = self._buf.find(self.fmt.call_close.strip())
            if close < 0:
                return False  # wait for more text (or finish())
            body, self._buf = self._buf[:close], self._buf[close + len(self.fmt.call_close.strip()) :]
            self._whole(call, body, out)
            return True
        self._buf = self._buf[m.end() :]
        call.id, call.name, call.args = self.new_id(), m.group(1), _Args()
        out.append(ToolCallStart(call.index, call.id, call.name))
        return True

    def _read_args(self, call: _Call, out: list[Piece]) -> bool:
        assert call.args is not None
        n = call.args.scan(self._buf)
        piece, self._buf = self._buf[:n], self._buf[n:]
        if piece:
            call.arguments += piece
            out.append(ToolArgsDelta(call.index, piece))
        if call.args.done:
            out.append(self._end(call, complete=True))
            call.ended = True
            return True
        return False

    def _read_close(self) -> bool:
        """Swallow the layout after the arguments: the header's `}` and the closing tag."""
        done, end = _match_loose(self._buf, "}" + self.fmt.call_close)
        if not done and end == len(self._buf):
            return False  # the tag is still arriving
        self._buf = self._buf[end:]  # as much of the layout as matched (all of it, normally)
        self._call, self._after_call = None, True  # (not our layout: what follows is text)
        return True

    def _whole(self, call: _Call, body: str, out: list[Piece]) -> None:
        """A body the header pattern missed: parse it whole, or drop it (not a call: there is
        nothing to return, and call markup is never text)."""
        try:
            obj = json.loads(body.strip().removeprefix(self.fmt.call_open[len(self.fmt.trigger) :].strip()))
            name, args = obj[self.fmt.name_key], obj.get(self.fmt.arguments_key, {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise TypeError
        except (ValueError, TypeError, KeyError):
            self._call, self._after_call = None, True
            return
        call.id, call.name, call.arguments = self.new_id(), name, json.dumps(args, ensure_ascii=False)
        out.append(ToolCallStart(call.index, call.id, call.name))
        out.append(ToolArgsDelta(call.index, call.arguments))
        out.append(self._end(call, complete=True))
        self._call, self._after_call = None, True

    def _end(self, call: _Call, complete: bool) -> ToolCallEnd:
        parsed: Any = {}
        if complete:
            try:
                parsed = json.loads(call.arguments)
            except ValueError:
                complete = False
        if not isinstance(parsed, dict):
            parsed, complete = {}, False
        self.calls.append(ToolCall(call.id, call.name, parsed))
        return ToolCallEnd(call.index, call.id, call.name, parsed, call.arguments, complete)


def _match_loose(text: str, target: str) -> tuple[bool, int]:
    """Match `target` at the start of `text`, ignoring whitespace in both: (matched in full,
    characters of `text` consumed). Partial: consumed == len(text) and not matched."""
    i = 0
    for ch in target:
        if ch.isspace():
            continue
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return False, len(text)
        if text[i] != ch:
            return False, i
        i += 1
    return True, i
