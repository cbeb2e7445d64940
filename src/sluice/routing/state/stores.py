"""The live routing-state store the `limits_store` setting names: memory, or Redis shared by
every gateway (weights and rollouts set on one are followed by all)."""

from __future__ import annotations

from sluice.config import StoreKind, by_store_kind
from sluice.routing.state.routing_state import MemoryRoutingStateStore, RoutingStateStore


def make_routing_state_store(store: StoreKind | str, redis_url: str = "redis://127.0.0.1:6379/0") -> RoutingStateStore:
    def redis() -> RoutingStateStore:
        from sluice.routing.state.redis_store import RedisRoutingStateStore

        return RedisRoutingStateStore(redis_url)

    return by_store_kind(store, "routing state store", MemoryRoutingStateStore, redis)
