"""Keys for the search API: searches need an API key, writes an ingest key, when configured.

Open when none is configured (the embedded default, like `sluice serve`). A key is sent as
`Authorization: Bearer <key>` or `x-api-key: <key>`; compared in constant time. When API keys are
configured, an ingest key may also search.
"""

from __future__ import annotations

import hmac

from fastapi import Request


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _any_match(key: str | None, keys: list[str]) -> bool:
    if key is None:
        return False
    return any(hmac.compare_digest(key.encode(), k.encode()) for k in keys)


class SearchAuth:
    def __init__(self, api_keys: list[str], ingest_keys: list[str]):
        self.api_keys, self.ingest_keys = list(api_keys), list(ingest_keys)

    def may_search(self, request: Request) -> bool:
        if not self.api_keys:
            return True
        key = presented_key(request)
        return _any_match(key, self.api_keys) or _any_match(key, self.ingest_keys)

    def may_write(self, request: Request) -> bool:
        return not self.ingest_keys or _any_match(presented_key(request), self.ingest_keys)

    @property
    def mode(self) -> str:
        return "keys" if (self.api_keys or self.ingest_keys) else "open"
