"""One call to one shard: a replica chosen by load, failover to another on error, a hedged
second request after the shard's p95, all inside the shard's deadline.

- Failover: a replica that refuses the connection, errs (5xx) or times out is marked down for a
  moment and the request goes to another replica at once — a kill -9 costs the query nothing
  but the retry's time.
- Hedging: if the first replica has not answered after max(p95 of the shard's recent
  latencies, hedge_min), a second replica is asked too; the first answer wins and the other
  request is cancelled. Only with ≥ 2 replicas and ≥ 20 samples.
- A 4xx is the request's fault, returned as is (never retried elsewhere).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any

from sluice.search.errors import ShardCallError, ShardFailure
from sluice.search.router.cluster.replica_state import ReplicaState
from sluice.search.router.cluster.shard_query_client import ShardQueryClient, ShardQueryError, ShardQueryTimeout
from sluice.search.router.cluster.topology import ShardRuntime
from sluice.search.router.query.replica_picker import pick_replica
from sluice.search.router.search_metrics import SearchMetrics


def _usable(prefer: ReplicaState | None) -> bool:
    """The replica a previous round of the query chose, if it may still be asked."""
    return prefer is not None and prefer.reachable and prefer.available(time.monotonic())


@dataclasses.dataclass(frozen=True, slots=True)
class _Call:
    """One shard call's fixed parts, shared by its attempts."""

    shard: ShardRuntime
    path: str
    payload: dict[str, Any]
    deadline: float  # a time.perf_counter() value
    phase: str
    prefer: ReplicaState | None


class ShardCaller:
    def __init__(
        self,
        http: ShardQueryClient,
        metrics: SearchMetrics,
        hedge: bool,
        hedge_min_s: float,
        rng: random.Random | None = None,
    ):
        self.http = http
        self.metrics = metrics
        self.hedge = hedge
        self.hedge_min_s = hedge_min_s
        self.rng = rng or random.Random()

    def _next_replica(self, c: _Call, tried: set[str]) -> ReplicaState | None:
        """The preferred replica first (if still usable), then one picked by load among the untried."""
        return c.prefer if (not tried and _usable(c.prefer)) else pick_replica(c.shard.replicas, tried, self.rng)

    async def _attempt(self, c: _Call, r: ReplicaState) -> tuple[ReplicaState, dict[str, Any]]:
        shard = c.shard
        r.in_flight += 1
        t0 = time.perf_counter()
        ok = False
        try:
            status, data = await self.http.post_json(r.url + c.path, c.payload, c.deadline - t0)
            if 400 <= status < 500:
                ok = True  # the replica is fine; the request is not
                msg = str(data.get("error", {}).get("message", f"replica answered {status}"))[:300]
                raise ShardCallError(shard.name, ShardFailure.BAD_QUERY, msg, status)
            if status >= 500:
                raise ShardCallError(shard.name, ShardFailure.UNAVAILABLE, f"replica {r.name} answered {status}")
            ok = True
            if "applied_seq" in data:
                r.applied_seq = max(r.applied_seq, int(data["applied_seq"]))
            return r, data
        except ShardQueryTimeout:
            raise ShardCallError(shard.name, ShardFailure.TIMEOUT, f"replica {r.name} timed out") from None
        except ShardQueryError as exc:
            raise ShardCallError(shard.name, ShardFailure.UNAVAILABLE, f"replica {r.name}: {exc}") from None
        finally:
            r.in_flight -= 1
            elapsed = time.perf_counter() - t0
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                r.observe_lower_bound(elapsed)  # a lost hedge: at least this slow
            else:
                r.observe(elapsed, ok)
                if ok:
                    shard.latency.add(elapsed)
                self.metrics.child(self.metrics.replica_latency, shard.name, r.name, c.phase).observe(elapsed)

    async def call(
        self,
        shard: ShardRuntime,
        path: str,
        payload: dict[str, Any],
        deadline: float,
        phase: str,
        prefer: ReplicaState | None = None,
    ) -> tuple[ReplicaState, dict[str, Any]]:
        """`deadline` is a time.perf_counter() value; raises ShardCallError when it passes or no
        replica can answer."""
        c = _Call(shard, path, payload, deadline, phase, prefer)
        if not self.hedge or len(shard.replicas) < 2 or (p95 := shard.latency.quantile(0.95)) is None:
            return await self._one_at_a_time(c)
        return await self._hedged(c, time.perf_counter() + max(p95, self.hedge_min_s))

    async def _hedged(self, c: _Call, hedge_at: float | None) -> tuple[ReplicaState, dict[str, Any]]:
        """call() with a hedge: a second replica asked at `hedge_at` if none has answered."""
        shard, deadline = c.shard, c.deadline
        tried: set[str] = set()
        pending: dict[asyncio.Task[tuple[ReplicaState, dict[str, Any]]], ReplicaState] = {}
        last: ShardCallError | None = None

        def start(kind: str) -> None:
            r = self._next_replica(c, tried)
            if r is None:
                return
            tried.add(r.url)
            if kind != "first":
                self.metrics.retries.labels(shard.name, kind).inc()
            pending[asyncio.create_task(self._attempt(c, r))] = r

        start("first")
        try:
            while pending:
                now = time.perf_counter()
                wake = deadline if hedge_at is None else min(deadline, hedge_at)
                done, _ = await asyncio.wait(pending, timeout=max(0.0, wake - now), return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    pending.pop(t)
                    try:
                        return t.result()
                    except ShardCallError as exc:
                        if exc.failure is ShardFailure.BAD_QUERY:
                            raise
                        last = exc
                if not done:
                    if time.perf_counter() >= deadline:
                        raise ShardCallError(
                            shard.name, ShardFailure.TIMEOUT, "no replica answered within the deadline"
                        )
                    if hedge_at is not None and time.perf_counter() >= hedge_at:
                        hedge_at = None
                        start("hedge")
                    continue
                if not pending and time.perf_counter() < deadline:
                    start("failover")  # the failed replica is marked down; try another now
            raise last or ShardCallError(shard.name, ShardFailure.UNAVAILABLE, "no replica available")
        finally:
            for t in pending:
                t.cancel()

    async def _one_at_a_time(self, c: _Call) -> tuple[ReplicaState, dict[str, Any]]:
        """call() when no hedge can be sent: each attempt awaited in this task (no task of its
        own, no asyncio.wait: ~50 µs of router CPU per shard call), failover as in call()."""
        shard, deadline = c.shard, c.deadline
        tried: set[str] = set()
        last: ShardCallError | None = None
        while time.perf_counter() < deadline:
            r = self._next_replica(c, tried)
            if r is None:
                break
            if tried:
                self.metrics.retries.labels(shard.name, "failover").inc()
            tried.add(r.url)
            try:
                return await self._attempt(c, r)
            except ShardCallError as exc:
                if exc.failure is ShardFailure.BAD_QUERY:
                    raise
                last = exc
        if last is None and time.perf_counter() >= deadline:
            last = ShardCallError(shard.name, ShardFailure.TIMEOUT, "no replica answered within the deadline")
        raise last or ShardCallError(shard.name, ShardFailure.UNAVAILABLE, "no replica available")
