"""Authenticators: presented API key → Principal (tenant, tier band, limits)."""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import replace

from sluice.gateway.key_store import KeyStore
from sluice.gateway.limits import Limits
from sluice.gateway.principal import Principal
from sluice.gateway.tiers import DEFAULT_TIERS, Tier


def _principal(tenant: str, tier: Tier, key_id: str, overrides: Limits | None = None) -> Principal:
    limits = tier.limits
    if overrides is not None:  # a key's own limits win over its tier's
        set_fields = {k: getattr(overrides, k) for k in ("rpm", "itpm", "otpm", "max_concurrent")}
        limits = replace(limits, **{k: v for k, v in set_fields.items() if v is not None})
    return Principal(tenant=tenant, tier=tier.name, key_id=key_id, priority=tier.priority, limits=limits,
                     queue_deadline_s=tier.queue_deadline_s)


class OpenAccess:
    """No keys configured: everyone is the default tenant, unlimited (the server binds 127.0.0.1)."""

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        return Principal()


class SingleKey:
    """One key for local use. Only its SHA-256 is kept; comparison is constant time."""

    def __init__(self, key: str, principal: Principal | None = None):
        self._digest = hashlib.sha256(key.encode()).digest()
        self._principal = principal or Principal()

    def matches(self, presented_key: str) -> bool:
        return hmac.compare_digest(hashlib.sha256(presented_key.encode()).digest(), self._digest)

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        if presented_key is None:
            return None
        return self._principal if self.matches(presented_key) else None


class KeyStoreAuthenticator:
    """Keys from a KeyStore; the single `--api-key`, if set, still works (default tenant)."""

    def __init__(
        self, store: KeyStore, tiers: dict[str, Tier] | None = None, single: SingleKey | None = None,
        fallback_tier: str = "standard",
    ):
        self.store = store
        self.tiers = tiers or DEFAULT_TIERS
        self.single = single
        # a key whose tier is not defined (created with --allow-custom-tier, or its tier was
        # removed from the settings) is served in this tier; start-up warns about such keys
        self.fallback_tier = self.tiers[fallback_tier]

    def keys_with_unknown_tiers(self) -> list[tuple[str, str]]:
        """(key_id, tier) of active keys whose tier is not defined."""
        return [(r.key_id, r.tier) for r in self.store.list() if r.active(time.time()) and r.tier not in self.tiers]

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        if presented_key is None:
            return None
        if self.single is not None and self.single.matches(presented_key):
            return self.single._principal
        rec = self.store.lookup(presented_key)
        if rec is None:
            return None
        tier = self.tiers.get(rec.tier) or self.fallback_tier
        return _principal(rec.tenant, tier, rec.key_id, rec.overrides)
