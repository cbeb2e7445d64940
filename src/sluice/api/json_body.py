"""A request body as a JSON object, or a 400 in the route's words.

Hostile bodies are refused here, before any model or tokenizer sees them:
- nesting deeper than MAX_DEPTH (a body of 10,000 `[` makes `json.loads` — and every recursive
  consumer after it — raise RecursionError);
- lone UTF-16 surrogates (`"\\ud800"`): valid JSON escapes, but not Unicode text; the tokenizer
  cannot encode them. Only bodies whose raw bytes contain such an escape are walked for them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sluice.api.errors import bad_request

MAX_DEPTH = 128  # far deeper than any real request (tool schemas included) nests
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def json_object(raw: bytes, parse_error: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"{parse_error}: {exc}") from None
    except RecursionError:
        raise bad_request(f"{parse_error}: JSON nested more than {MAX_DEPTH} levels deep") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    _check(data, check_text=_SURROGATE_ESCAPE.search(raw) is not None)
    return data


def _check(data: Any, check_text: bool) -> None:
    """Depth and (when asked) text validity, iteratively: a recursive walk is what we guard against."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise bad_request(f"{_where(path[:8])}…: JSON nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            for k, v in node.items():
                if check_text:
                    _text(k, path)
                stack.append((v, (*path, k)))
        elif isinstance(node, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(node))
        elif check_text and isinstance(node, str):
            _text(node, path)


def _text(s: str, path: tuple[str | int, ...]) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(
            f"{_where(path)}: contains a lone UTF-16 surrogate, which is not valid Unicode text"
        ) from None


def _where(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path) or "body"
