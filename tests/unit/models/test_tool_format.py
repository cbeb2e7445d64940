"""The tool prompt format and the streaming tool-call parser (no model needed)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import InvalidRequestError
from sluice.models.tools.format import HERMES, ToolFormat, format_for_family
from sluice.models.tools.parser import TextPiece, ToolArgsDelta, ToolCallEnd, ToolCallParser, ToolCallStart
from sluice.models.tools.render import render_turns
from sluice.tool_types import ChatTurn, Role, ToolCall, ToolResult, ToolSpec, new_tool_use_id

WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}, "Weather now")


def _parse(text: str, sizes: list[int]) -> list:
    parser = ToolCallParser(HERMES, new_id=iter(f"toolu_{i}" for i in range(100)).__next__)
    pieces, i, k = [], 0, 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        pieces += parser.feed(text[i : i + n])
        i, k = i + n, k + 1
    return pieces + parser.finish()


def _text(pieces: list) -> str:
    return "".join(p.text for p in pieces if isinstance(p, TextPiece))


def _args(pieces: list, index: int) -> str:
    return "".join(p.json for p in pieces if isinstance(p, ToolArgsDelta) and p.index == index)


# -- rendering -------------------------------------------------------------------------------
def test_tools_calls_and_results_are_rendered_into_plain_turns():
    call = ToolCall("toolu_1", "get_weather", {"city": "Oslo"})
    turns = [
        ChatTurn(Role.USER, ["Weather in Oslo?"]),
        ChatTurn(Role.ASSISTANT, ["Checking.", call]),
        ChatTurn(Role.USER, [ToolResult("toolu_1", "rain, 4 C"), "And tomorrow?"]),
    ]
    msgs = render_turns(turns, [WEATHER], HERMES, system="Be brief.")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith("Be brief.\n\n# Tools")
    assert (
        json.dumps(
            {
                "type": "function",
                "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER.input_schema},
            }
        )
        in msgs[0]["content"]
    )
    assert (
        msgs[2]["content"]
        == 'Checking.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    assert msgs[3]["content"] == "<tool_response>\nrain, 4 C\n</tool_response>\n\nAnd tomorrow?"


def test_error_results_are_marked_and_result_role_is_overridable():
    fmt = ToolFormat.from_dict({"result_role": "system", "error_prefix": "FAILED: "})
    turns = [
        ChatTurn(Role.ASSISTANT, [ToolCall("t1", "get_weather", {})]),
        ChatTurn(Role.USER, [ToolResult("t1", "timeout", True)]),
    ]
    msgs = render_turns(turns, [WEATHER], fmt)
    assert msgs[-1] == {"role": "system", "content": "<tool_response>\nFAILED: timeout\n</tool_response>"}


def test_a_result_without_its_call_is_refused():
    turns = [
        ChatTurn(Role.USER, ["hi"]),
        ChatTurn(Role.ASSISTANT, ["hello"]),
        ChatTurn(Role.USER, [ToolResult("toolu_x", "42")]),
    ]
    with pytest.raises(InvalidRequestError, match="toolu_x"):
        render_turns(turns, [WEATHER], HERMES)


def test_a_call_without_its_result_is_refused_unless_it_ends_the_conversation():
    call = ChatTurn(Role.ASSISTANT, [ToolCall("toolu_1", "get_weather", {})])
    render_turns([ChatTurn(Role.USER, ["hi"]), call], [WEATHER], HERMES)  # a prefill: fine
    with pytest.raises(InvalidRequestError, match="without tool_result"):
        render_turns([ChatTurn(Role.USER, ["hi"]), call, ChatTurn(Role.USER, ["well?"])], [WEATHER], HERMES)


def test_format_overrides_are_checked():
    with pytest.raises(ValueError, match="unknown tool format field"):
        ToolFormat.from_dict({"call_opener": "x"})
    with pytest.raises(ValueError, match="must start with the trigger"):
        ToolFormat.from_dict({"call_open": "<call>"})
    assert format_for_family("llama") is HERMES and format_for_family("unknown-arch") is HERMES


def test_tool_use_ids_have_anthropic_shape():
    ident = new_tool_use_id()
    assert ident.startswith("toolu_") and len(ident) == 30 and ident[6:].isalnum()


# -- parsing ---------------------------------------------------------------------------------
CALLS_TEXT = (
    "Let me check both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris {x}", "n": [1, {"a": "}"}]}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=8))
def test_pieces_are_the_same_however_the_text_is_split(sizes):
    pieces = _parse(CALLS_TEXT, sizes)
    assert _text(pieces) == "Let me check both."
    starts = [p for p in pieces if isinstance(p, ToolCallStart)]
    ends = [p for p in pieces if isinstance(p, ToolCallEnd)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_time")]
    assert ends[0].input == {"city": 'Pa"ris {x}', "n": [1, {"a": "}"}]} and ends[1].input == {}
    for end in ends:
        assert end.complete and _args(pieces, end.index) == end.arguments and json.loads(end.arguments) == end.input
    # every call's start comes before its argument deltas, which come before its end
    order = [(type(p).__name__, getattr(p, "index", None)) for p in pieces if not isinstance(p, TextPiece)]
    assert order.index(("ToolCallStart", 1)) > order.index(("ToolCallEnd", 0))


def test_plain_text_passes_through_with_a_possible_trigger_held_back():
    parser = ToolCallParser(HERMES)
    assert _text(parser.feed("Use <tool")) == "Use"
    assert _text(parser.feed("s> wisely ")) == " <tools> wisely"
    assert _text(parser.finish()) == ""


def test_a_call_cut_off_by_max_tokens_ends_incomplete():
    pieces = _parse('Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Os', [4])
    end = pieces[-1]
    assert isinstance(end, ToolCallEnd) and not end.complete and end.input == {}
    assert end.arguments == _args(pieces, 0) == '{"city": "Os'


def test_an_unreadable_call_body_is_dropped_and_other_orders_are_parsed_whole():
    pieces = _parse("<tool_call>not json</tool_call> after", [3])
    assert _text(pieces) == "after" and not [p for p in pieces if not isinstance(p, TextPiece)]
    pieces = _parse('<tool_call>\n{"arguments": {"a": 1}, "name": "x"}\n</tool_call>', [5])
    end = next(p for p in pieces if isinstance(p, ToolCallEnd))
    assert (end.name, end.input, _args(pieces, 0)) == ("x", {"a": 1}, end.arguments)


def _finish_cut(text: str, sizes: list[int], cut: bool) -> list:
    parser = ToolCallParser(HERMES, new_id=iter(f"toolu_{i}" for i in range(100)).__next__)
    pieces, i = [], 0
    for n in sizes * len(text):
        if i >= len(text):
            break
        pieces += parser.feed(text[i : i + n])
        i += n
    return pieces + parser.finish(cut=cut)


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'


@pytest.mark.parametrize("sizes", [[1], [3], [7], [1000]])
def test_call_markup_cut_by_max_tokens_never_comes_out_as_text(sizes):
    # issue 21: two calls, then the third cut inside its opening tag came out as text "<tool"
    for tail in ("<", "<tool", "<tool_call", "<tool_call>", "<tool_call>\n{", '<tool_call>\n{"name": "get_we'):
        pieces = _finish_cut("Checking. " + CALL + CALL + tail, sizes, cut=True)
        assert _text(pieces) == "Checking.", tail
        ends = [p for p in pieces if isinstance(p, ToolCallEnd)]
        assert [e.complete for e in ends] == [True, True], tail  # cut before its name: no call
    # cut after its name: the call ends incomplete (returned with input {}), no text
    pieces = _finish_cut(CALL + '<tool_call>\n{"name": "get_time", "arguments": {"tz', sizes, cut=True)
    assert _text(pieces) == "" and [(e.name, e.complete, e.input) for e in pieces if isinstance(e, ToolCallEnd)] == [
        ("get_weather", True, {"city": "Oslo"}),
        ("get_time", False, {}),
    ]
    # a closing tag cut short is layout, dropped
    assert _text(_finish_cut(CALL.strip()[:-3], sizes, cut=True)) == ""


def test_a_possible_trigger_start_is_text_only_when_the_model_ended_the_reply():
    assert _text(_finish_cut("x <", [1], cut=False)) == "x <"  # EOS: the model's own text
    assert _text(_finish_cut("x <", [1], cut=True)) == "x"
    assert _text(_finish_cut("x <tool_call>", [1], cut=False)) == "x"  # the full tag: a call, never text


def test_random_text_around_calls_keeps_its_content():
    rng = random.Random(3)
    words = ["alpha", "beta", "<tool", "x>", "{", "}", '"q"', "\n"]
    for _ in range(50):
        text = " ".join(rng.choice(words) for _ in range(12))
        got = _text(_parse(text, [rng.randint(1, 7)]))
        assert got == text.rstrip()  # trailing whitespace is layout (it may precede a call)


def test_part_by_part_rendering_gives_the_same_text():
    from sluice.models.tools.render import PART_JOIN, part_text, system_text

    call = ToolCall("toolu_1", "get_weather", {"city": "Oslo"})
    turns = [
        ChatTurn(Role.USER, ["Oslo?"]),
        ChatTurn(Role.ASSISTANT, ["Checking.", call]),
        ChatTurn(Role.USER, [ToolResult("toolu_1", "rain")]),
    ]
    whole = render_turns(turns, [WEATHER], HERMES, system="Be brief.")
    by_part = [{"role": "system", "content": system_text("Be brief.", [WEATHER], HERMES)}]
    by_part += [{"role": t.role.value, "content": PART_JOIN.join(part_text(p, HERMES) for p in t.parts)} for t in turns]
    assert whole == by_part
