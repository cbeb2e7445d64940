"""GuidedDecoding → an llguidance grammar (its Lark dialect with inline `%json` schemas).

Shapes, for a tool format whose calls look like `<tool_call>\\n{"name": "N", "arguments": A}\\n</tool_call>`:

    tool_choice auto     start: TEXT | head rest (SEP call)*      text, or text then calls
    tool_choice any      start: call (SEP call)*                  at least one call, no text
    tool_choice none     start: TEXT                              text that never opens a call
    disable_parallel     the repetition becomes at most one call

TEXT is any text that does not contain the trigger (`<tool_call>`); `head` is lazy text that
ends at the first trigger. So the moment the model writes the trigger, free text is no longer
possible and the call is forced: the name is one of the tools, the arguments validate against
that tool's schema, the closing tag follows. Calls are joined by the format's separator.

JSON is generated compactly with `", "` and `": "` separators (json.dumps' defaults, the way
calls are rendered into prompts), with no free whitespace: a small model cannot wander off into
endless blank lines inside a value.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.types import GuidedDecoding

# llguidance JSON options: fixed, compact, no whitespace freedom (see the module docstring).
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
TEXT_SCHEMA = "\0text"  # key of the JSON reply's schema in tool_calls_grammar's `schemas`


def lit(text: str) -> str:
    """A Lark string literal (llguidance reads JSON string escapes)."""
    return json.dumps(text)


def inline_json(schema: dict[str, Any]) -> str:
    """`%json {...}` with our fixed generation options; a user's own "x-guidance" is replaced."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS})


def _repeat(item: str, low: int, high: int | None) -> str:
    """Lark for `item` repeated low..high times (high None: unbounded)."""
    if high == 0:
        return ""
    if high is None:
        return {0: f"{item}*", 1: f"{item}+"}.get(low, f"{item}{{{low},}}")
    if (low, high) == (0, 1):
        return f"{item}?"
    return f"{item}{{{low},{high}}}"


def tool_calls_grammar(spec: GuidedDecoding, schemas: dict[str, Any]) -> str:
    """The Lark grammar of a TOOL_CALLS spec; `schemas` maps tool name → arguments schema
    (and TEXT_SCHEMA → the JSON reply's schema when `spec.schema` is set)."""
    syntax = spec.calls
    assert syntax is not None  # GuidedDecoding.validate() checked it
    lines = ["%llguidance {}"]
    lines.append("TEXT: /(?s:.*)/ & ~/(?s:.*)" + _regex_escape(syntax.trigger) + "(?s:.*)/")
    if spec.max_calls == 0:
        lines.insert(1, "start: TEXT")
        return "\n".join(lines) + "\n"
    rest_prefix = syntax.begin[len(syntax.trigger) :]
    names = " | ".join(f"call_{i}" for i in range(len(spec.tools)))
    lines.append(f"rest: {names}")
    for i, tool in enumerate(spec.tools):
        lines.append(f"call_{i}: {lit(rest_prefix + tool.name + syntax.middle)} args_{i} {lit(syntax.end)}")
        lines.append(f"args_{i}: {inline_json(schemas[tool.name])}")
    lines.append(f"call: {lit(syntax.trigger)} rest")
    lines.append(f"SEP: {lit(syntax.separator)}")
    more_high = None if spec.max_calls is None else spec.max_calls - 1
    more = _repeat("(SEP call)", max(0, spec.min_calls - 1), more_high)
    alternatives = []
    if spec.allow_text:
        if spec.min_calls == 0:
            lines.append("text: " + (inline_json(schemas[TEXT_SCHEMA]) if spec.schema else "TEXT"))
            alternatives.append("text")
        if not spec.schema:
            # Free text, then the calls: `head` is lazy, so it ends at the first trigger.
            lines.append(f"head[lazy]: /(?s:.*)/ {lit(syntax.trigger)}")
            alternatives.append(f"head rest {more}".rstrip())
        else:
            alternatives.append(f"call {more}".rstrip())  # a JSON reply or calls, not both
    else:
        alternatives.append(f"call {more}".rstrip())
    lines.insert(1, "start: " + " | ".join(alternatives))
    return "\n".join(lines) + "\n"


def _regex_escape(text: str) -> str:
    """`text` as a literal inside a Lark /regex/ (Rust regex syntax; '/' closes the regex)."""
    out = []
    for ch in text:
        if ch in "\\.+*?()|[]{}^$#&-~/":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(ch)
    return "".join(out)
