"""Which replica of a shard gets the next request: power of two choices on cost.

Two available replicas are drawn at random and the cheaper (EWMA latency × (in-flight + 1))
wins: nearly as good as asking all of them for their load, with no herd on one "best" replica
when many requests start at once. Replicas marked down by a recent failed request are skipped
until their down time passes; if every replica is down that way, the least recently failed is
tried anyway (one failed request does not give a shard up). A replica the health poll found not
answering (`reachable` false: stalled, or gone) is never asked until a poll finds it again: a
shard with no other replica then fails at once as unavailable, instead of spending the query's
deadline on a replica that is known not to answer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from sluice.search.router.cluster.replica_state import ReplicaState


def pick_replica(
    replicas: Sequence[ReplicaState], exclude: set[str], rng: random.Random, now: float | None = None
) -> ReplicaState | None:
    now = time.monotonic() if now is None else now
    candidates = [r for r in replicas if r.url not in exclude and r.serving and r.reachable and r.available(now)]
    if not candidates:
        rest = [r for r in replicas if r.url not in exclude and r.serving and r.reachable]
        return min(rest, key=lambda r: r.down_until) if rest else None
    if len(candidates) == 1:
        return candidates[0]
    a, b = rng.sample(candidates, 2)
    return a if a.cost() <= b.cost() else b
