"""Where shared state lives, and what its outage means: the vocabulary every `*_store` setting
and `on_store_error` use."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class StoreKind(str, enum.Enum):
    """Where shared state lives: in this process, or in Redis (shared by every replica)."""

    MEMORY = "memory"
    REDIS = "redis"


def by_store_kind(kind: StoreKind | str, what: str, memory: Callable[[], T], redis: Callable[[], T]) -> T:
    """The store a `*_store` setting names, built by the matching factory (each store module is
    imported by its factory, so a gateway without Redis never loads redis); an unknown kind
    fails naming `what` and the choices."""
    if kind in (StoreKind.MEMORY, StoreKind.MEMORY.value):
        return memory()
    if kind in (StoreKind.REDIS, StoreKind.REDIS.value):
        return redis()
    raise ValueError(f"unknown {what} {kind!r}: use 'memory' or 'redis'")


class StoreFailMode(str, enum.Enum):
    """What a store outage means for a request: admit it (`open`) or refuse it with 529 (`closed`)."""

    OPEN = "open"
    CLOSED = "closed"
