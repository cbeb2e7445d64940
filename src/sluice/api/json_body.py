"""A request body as a JSON object, or a 400 in the route's words."""

from __future__ import annotations

import json
from typing import Any

from sluice.api.errors import bad_request


def json_object(raw: bytes, parse_error: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"{parse_error}: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    return data
