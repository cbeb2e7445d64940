"""The API key a request presents, and its check: one parser and one comparison for every
surface that takes a key (serving's API and admin API, the search router).

Two headers carry a key: `x-api-key: K` (Anthropic's wire contract, the anthropic SDK 0.x/1.x
and its curl docs) and `Authorization: Bearer K` (the anthropic SDK 2.x, OpenAI's clients).
Both are accepted. When a request carries both, `x-api-key` wins: it names an API key and
nothing else, while `Authorization` is a general header that other parties also fill (a proxy
or an auth gateway in front adding its own bearer token, a browser's Basic credentials), and an
anthropic SDK given both `api_key` and `auth_token` sends the key as `x-api-key`. A blank value
counts as absent, and an `Authorization` of another scheme (Basic, …) carries no API key.

Keys are compared as SHA-256 digests in constant time (`hmac.compare_digest`): equal-length
inputs whatever the key, so neither the content nor the length of a configured key leaks
through timing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

API_KEY_HEADER = "x-api-key"


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key in `headers` (a case-insensitive mapping such as starlette's, with lower-case
    names): `x-api-key` first, else `Authorization: Bearer`; None when neither carries one."""
    key = headers.get(API_KEY_HEADER, "").strip()
    if key:
        return key
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyDigests:
    """A set of configured keys, kept as digests; `matches` compares a presented key with each
    in constant time (all of them, so which one matched does not show either)."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(key_digest(k) for k in keys)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def matches(self, presented: str | None) -> bool:
        if presented is None:
            return False
        digest = key_digest(presented)
        found = False
        for d in self._digests:
            found |= hmac.compare_digest(digest, d)
        return found
