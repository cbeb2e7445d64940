"""Anthropic-style list pages (`limit`, `after_id`, `before_id` → `data`, `has_more`, ids)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.api.errors import bad_request


def page(
    ids: list[str], limit: int, after_id: str | None, before_id: str | None, render: Callable[[str], Any]
) -> dict[str, Any]:
    """One page of `ids` (already in list order). The SDK pages on `has_more` and `last_id`,
    so both must be exact (reference §8.2)."""
    if not 1 <= limit <= 1000:
        raise bad_request("limit: must be between 1 and 1000")
    if after_id is not None:
        ids = ids[ids.index(after_id) + 1 :] if after_id in ids else []
    elif before_id is not None:
        ids = ids[: ids.index(before_id)][-limit:] if before_id in ids else []
    items = ids[:limit]
    return {
        "data": [render(i) for i in items],
        "has_more": len(ids) > len(items),
        "first_id": items[0] if items else None,
        "last_id": items[-1] if items else None,
    }
