"""Which replica of a shard gets the next request: power of two choices on cost.

Two available replicas are drawn at random and the cheaper (EWMA latency × (in-flight + 1))
wins: nearly as good as asking all of them for their load, with no herd on one "best" replica
when many requests start at once. Replicas marked down (a recent failure) are skipped until
their down time passes; if every replica is down, the least recently failed is tried anyway
(a shard is never given up on without asking).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from sluice.search.router.replica_state import ReplicaState


def pick_replica(replicas: Sequence[ReplicaState], exclude: set[str], rng: random.Random,
                 now: float | None = None) -> ReplicaState | None:
    now = time.monotonic() if now is None else now
    candidates = [r for r in replicas if r.url not in exclude and r.serving and r.available(now)]
    if not candidates:
        rest = [r for r in replicas if r.url not in exclude and r.serving]
        return min(rest, key=lambda r: r.down_until) if rest else None
    if len(candidates) == 1:
        return candidates[0]
    a, b = rng.sample(candidates, 2)
    return a if a.cost() <= b.cost() else b
