"""The quota store the `limits_store` setting names: memory (one gateway) or Redis (shared)."""

from __future__ import annotations

from sluice.config import StoreKind
from sluice.routing.quota.semantics import QuotaStore


def make_quota_store(store: StoreKind | str, redis_url: str = "redis://127.0.0.1:6379/0") -> QuotaStore:
    """Both stores implement semantics.py's rules; Redis shares the counters between gateways."""
    kind = StoreKind(store) if store in {k.value for k in StoreKind} else None
    if kind is StoreKind.MEMORY:
        from sluice.routing.quota.memory_store import MemoryQuotaStore

        return MemoryQuotaStore()
    if kind is StoreKind.REDIS:
        from sluice.routing.quota.redis_store import RedisQuotaStore

        return RedisQuotaStore(redis_url)
    raise ValueError(f"unknown quota store {store!r}: use 'memory' or 'redis'")
