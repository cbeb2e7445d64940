"""JSON the search service accepts: what Python's `json` reads, less what the rest of the path
cannot carry.

`json.loads` accepts text that later steps fail on, far from where it came in: `NaN`,
`Infinity` and `1e999` (a float overflowing to inf) cannot be written back as JSON (the router's
request to a shard refuses them); an integer of more than 4,300 digits raises a bare ValueError;
a lone UTF-16 surrogate escape (`"\\ud800"`) decodes to a `str` that cannot be encoded as UTF-8
(Xapian, the write log and every answer encode); and a deeply nested value overflows the
decoder's recursion (RecursionError) or a later encoder's. Each is refused here, at the edge,
as a `JsonError` naming what is wrong — one bulk line, or one request body — so nothing half
written and nothing a 500.

Cheap when the text is ordinary: the surrogate and depth walks run only when the raw text has
a `\\ud` escape or more brackets than the depth bound.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32  # objects and arrays inside each other, the outermost included
MAX_NUMBER_CHARS = 100  # a number's literal; far past any int64 or double's digits


class JsonError(ValueError):
    """Text that is not JSON the search service takes; the message says why (user-safe)."""


def _number(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise JsonError(f"a number of more than {MAX_NUMBER_CHARS} characters")
    return text


def _int(text: str) -> int:
    return int(_number(text))


def _float(text: str) -> float:
    value = float(_number(text))
    if not math.isfinite(value):
        raise JsonError(f"the number {text[:40]} is out of range")
    return value


def _constant(name: str) -> float:
    raise JsonError(f"{name} is not JSON (numbers must be finite)")


def _has_lone_surrogate(s: str) -> bool:
    try:
        s.encode()
    except UnicodeEncodeError:
        return True
    return False


def _walk(value: Any, max_depth: int, surrogates: bool) -> None:
    """Refuse nesting deeper than max_depth and (when `surrogates`) lone surrogates in any
    string, keys included; iterative, so no recursion limit is involved."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            if depth > max_depth:
                raise JsonError(f"nested deeper than {max_depth} levels")
            for k, x in v.items():
                if surrogates and _has_lone_surrogate(k):
                    raise JsonError("a lone UTF-16 surrogate escape in a key (not valid Unicode text)")
                stack.append((x, depth + 1))
        elif isinstance(v, list):
            if depth > max_depth:
                raise JsonError(f"nested deeper than {max_depth} levels")
            stack.extend((x, depth + 1) for x in v)
        elif surrogates and isinstance(v, str) and _has_lone_surrogate(v):
            raise JsonError("a lone UTF-16 surrogate escape in a string (not valid Unicode text)")


# one decoder for every call: json.loads with hooks builds a new one each time (~3 µs of the
# router's and the shards' CPU per request, on the query path)
_DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """Decode `raw` (UTF-8 bytes, or text) or raise JsonError."""
    if isinstance(raw, (bytes, bytearray)):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonError(f"not UTF-8 (byte {exc.start})") from None
    else:
        if _has_lone_surrogate(raw):
            raise JsonError("a lone UTF-16 surrogate (not valid Unicode text)")
        text = raw
    try:
        value = _DECODER.decode(text)
    except JsonError:
        raise
    except RecursionError:
        raise JsonError(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # json.JSONDecodeError and the decoder's own refusals
        raise JsonError(f"not JSON: {getattr(exc, 'msg', str(exc))}") from None
    surrogates = "\\ud" in text or "\\uD" in text
    if surrogates or text.count("[") + text.count("{") > max_depth:
        _walk(value, max_depth, surrogates)
    return value
