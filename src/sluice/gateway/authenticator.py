"""Authenticators: presented API key → Principal (tenant, tier band, limits).

Three modes behind one Protocol: open access, a single key, the key store. The key store's
lookup is SQLite — blocking I/O — so it runs off the event loop, and verified keys are cached
for `cache_ttl_s`: a revoked key stops working within that bound (a few seconds by default), and
the hot path of an active key costs one dict lookup.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from sluice.common.api_keys import KeyDigests
from sluice.gateway.key_store import KeyStore
from sluice.gateway.limits import Limits
from sluice.gateway.principal import Principal
from sluice.gateway.tiers import DEFAULT_TIERS, Tier


class Authenticator(Protocol):
    """Who is calling. The API layer extracts the presented key from the request's headers and
    asks; the answer decides tenant, tier, limits and priority for everything after."""

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        """The caller's principal, or None when the key is missing, unknown or revoked."""
        ...


def _principal(tenant: str, tier: Tier, key_id: str, overrides: Limits | None = None) -> Principal:
    limits = tier.limits
    if overrides is not None:  # a key's own limits win over its tier's
        set_fields = {k: getattr(overrides, k) for k in ("rpm", "itpm", "otpm", "max_concurrent")}
        limits = replace(limits, **{k: v for k, v in set_fields.items() if v is not None})
    return Principal(
        tenant=tenant,
        tier=tier.name,
        key_id=key_id,
        priority=tier.priority,
        limits=limits,
        queue_deadline_s=tier.queue_deadline_s,
    )


class OpenAccess:
    """No keys configured: everyone is the default tenant, unlimited (the server binds 127.0.0.1)."""

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        return Principal()


class SingleKey:
    """One key for local use. Only its SHA-256 is kept; comparison is constant time (common/api_keys.py)."""

    def __init__(self, key: str, principal: Principal | None = None):
        self._key = KeyDigests([key])
        self._principal = principal or Principal()

    def matches(self, presented_key: str) -> bool:
        return self._key.matches(presented_key)

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        if presented_key is None:
            return None
        return self._principal if self.matches(presented_key) else None


class KeyStoreAuthenticator:
    """Keys from a KeyStore; the single `--api-key`, if set, still works (default tenant).

    Lookups run in a thread (SQLite is blocking I/O). A verified key's principal is cached for
    `cache_ttl_s` (never past a scheduled revocation), keyed by the key's SHA-256 — the key
    itself is not kept. Unknown keys are not cached: a key created a moment ago works at once.
    """

    def __init__(
        self,
        store: KeyStore,
        tiers: dict[str, Tier] | None = None,
        single: SingleKey | None = None,
        fallback_tier: str = "standard",
        cache_ttl_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self.tiers = tiers or DEFAULT_TIERS
        self.single = single
        # a key whose tier is not defined (created with --allow-custom-tier, or its tier was
        # removed from the settings) is served in this tier; start-up warns about such keys
        self.fallback_tier = self.tiers[fallback_tier]
        self.cache_ttl_s = cache_ttl_s
        self._clock = clock
        self._cache: dict[bytes, tuple[float, Principal]] = {}  # sha256(key) -> (expires, principal)

    def keys_with_unknown_tiers(self) -> list[tuple[str, str]]:
        """(key_id, tier) of active keys whose tier is not defined."""
        return [(r.key_id, r.tier) for r in self.store.list() if r.active(time.time()) and r.tier not in self.tiers]

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        if presented_key is None:
            return None
        if self.single is not None and self.single.matches(presented_key):
            return self.single._principal
        digest = hashlib.sha256(presented_key.encode()).digest()
        now = self._clock()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        rec = await asyncio.to_thread(self.store.lookup, presented_key)
        if rec is None:
            self._cache.pop(digest, None)
            return None
        tier = self.tiers.get(rec.tier) or self.fallback_tier
        principal = _principal(rec.tenant, tier, rec.key_id, rec.overrides)
        if self.cache_ttl_s > 0:
            expires = now + self.cache_ttl_s
            if rec.revoked_at is not None:
                expires = min(expires, rec.revoked_at)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()  # bounded; a full sweep is rare and cheap to refill
            self._cache[digest] = (expires, principal)
        return principal


_CACHE_MAX = 10_000
