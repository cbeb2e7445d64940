"""The quota store the `limits_store` setting names: memory (one gateway) or Redis (shared)."""

from __future__ import annotations

from sluice.config import StoreKind, by_store_kind
from sluice.routing.quota.semantics import QuotaStore


def make_quota_store(store: StoreKind | str, redis_url: str = "redis://127.0.0.1:6379/0") -> QuotaStore:
    """Both stores implement semantics.py's rules; Redis shares the counters between gateways."""

    def memory() -> QuotaStore:
        from sluice.routing.quota.memory_store import MemoryQuotaStore

        return MemoryQuotaStore()

    def redis() -> QuotaStore:
        from sluice.routing.quota.redis_store import RedisQuotaStore

        return RedisQuotaStore(redis_url)

    return by_store_kind(store, "quota store", memory, redis)
