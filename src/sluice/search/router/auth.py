"""Keys for the search API: searches need an API key, writes an ingest key, when configured.

Open when none is configured (the embedded default, like `sluice serve`). A key is sent as
`x-api-key: <key>` or `Authorization: Bearer <key>`, `x-api-key` first when both are, and kept
and compared as a digest in constant time: the parser and check serving's API uses
(common/api_keys.py). When API keys are configured, an ingest key may also search.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request

from sluice.common.api_keys import KeyDigests, presented_key


class SearchAuth:
    def __init__(self, api_keys: list[str], ingest_keys: list[str]):
        self.api_keys, self.ingest_keys = KeyDigests(api_keys), KeyDigests(ingest_keys)

    def may_search(self, headers: Mapping[str, str]) -> bool:
        """`headers`: a case-insensitive mapping with lower-case names (starlette's Headers)."""
        if not self.api_keys:
            return True
        key = presented_key(headers)
        return self.api_keys.matches(key) or self.ingest_keys.matches(key)

    def may_write(self, request: Request) -> bool:
        return not self.ingest_keys or self.ingest_keys.matches(presented_key(request.headers))

    @property
    def mode(self) -> str:
        return "keys" if (self.api_keys or self.ingest_keys) else "open"
