"""The JSON the search service takes (search/strict_json.py): what `json` accepts but the write
and query paths cannot carry is refused at the edge with a message, never let through to fail
later (a 500 after part of a batch was written: issue 40)."""

from __future__ import annotations

import json

import pytest

from sluice.search import strict_json
from sluice.search.strict_json import JsonError, loads


@pytest.mark.parametrize(
    "text,says",
    [
        ('{"a": NaN}', "NaN"),
        ('{"a": Infinity}', "Infinity"),
        ('{"a": -Infinity}', "Infinity"),
        ('{"a": 1e999}', "out of range"),
        ('{"a": ' + "1" * 5000 + "}", "more than 100 characters"),
        ('{"a": "\\ud800"}', "surrogate"),
        ('{"\\udfff": 1}', "surrogate"),
        ('["x", ["\\ud83d"]]', "surrogate"),
        ("[" * 10_000 + "]" * 10_000, "nested deeper"),
        ('{"a": ' + "[" * 40 + "]" * 40 + "}", "nested deeper"),
        ("{not json", "not JSON"),
    ],
)
def test_what_json_accepts_and_the_path_cannot_is_refused(text, says):
    with pytest.raises(JsonError) as exc:
        loads(text.encode())
    assert says in str(exc.value)


def test_invalid_utf8_is_refused_with_its_offset():
    with pytest.raises(JsonError, match="not UTF-8 \\(byte 11\\)"):
        loads(b'{"query": "\xff\xfe"}')


def test_ordinary_json_and_surrogate_pairs_pass():
    text = '{"id": 1, "t": "caf\\u00e9 \\ud83d\\ude00", "n": 1.5e10, "deep": ' + "[" * 30 + "]" * 30 + "}"
    assert loads(text.encode()) == json.loads(text)
    assert loads(text.encode())["t"].encode()  # encodable: a pair is one character
    assert loads(b'{"a": "\\\\ud800"}') == {"a": "\\ud800"}  # an escaped backslash, not an escape
    assert loads(b"[" * strict_json.MAX_DEPTH + b"]" * strict_json.MAX_DEPTH) is not None
    with pytest.raises(JsonError):
        loads(b"[" * (strict_json.MAX_DEPTH + 1) + b"]" * (strict_json.MAX_DEPTH + 1))
