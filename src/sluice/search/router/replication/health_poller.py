"""The health poller: every interval, ask each replica how far it has applied; bring laggards
up to date from a peer; keep the replica gauges (up, applied entry, freshness) current.

A replica that does not answer is marked down (replica choice skips it). One that answers again
is marked up and, if behind the shard's head, told to catch up from the most advanced peer
(POST /v1/shard/catch_up): it copies the missing log entries and applies them in order (or a
peer's index first, when it is empty or the entries it lacks were compacted away). Catch-ups
and compactions run beside the poll, one at a time per replica, so a long copy never delays
the health of the others. The poll also learns writes made through another router (the head is
the longest log seen), which moves the result cache's revision, and tells replicas when their
logs may be compacted (compaction.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import httpx

from sluice.search.router.cluster.replica_state import ReplicaState
from sluice.search.router.cluster.shard_query_client import ShardQueryClient, ShardQueryError
from sluice.search.router.cluster.topology import ShardRuntime, Topology
from sluice.search.router.replication.compaction import compaction_point, should_compact
from sluice.search.router.search_metrics import SearchMetrics

log = logging.getLogger("sluice.search.router")


class HealthPoller:
    def __init__(
        self,
        topo: Topology,
        http: httpx.AsyncClient,
        metrics: SearchMetrics,
        interval_s: float = 0.5,
        compact_every: int = 0,
        keep_max: int = 1_000_000,
    ):
        self.topo, self.http, self.metrics, self.interval_s = topo, http, metrics, interval_s
        # status reads through the query path's kind of client, but its own (its own connections
        # and slots: a query load that fills the query client's must not starve the health polls)
        self.status_client = ShardQueryClient(max_connections=64)
        self.compact_every, self.keep_max = compact_every, keep_max
        self.polls = 0
        self._polled = asyncio.Event()  # set at the end of each poll round (next_poll)
        self._jobs: dict[str, asyncio.Task[None]] = {}  # replica url → its catch-up or compaction

    def _job(self, r: ReplicaState, coro: Coroutine[Any, Any, None]) -> None:
        """Run a replica's catch-up or compaction beside the poll, one at a time per replica."""
        if r.url in self._jobs and not self._jobs[r.url].done():
            coro.close()
            return
        self._jobs[r.url] = asyncio.create_task(coro)

    async def _status(self, r: ReplicaState) -> dict | None:
        # not through httpx: a read every interval per replica cost the router ~9 ms of CPU a
        # second through httpx, spread over the queries it serves
        try:
            code, got = await self.status_client.get_json(r.url + "/v1/shard/status", max(0.5, self.interval_s * 2))
        except ShardQueryError:
            return None
        return got if code == 200 else None

    async def poll_shard(self, shard: ShardRuntime) -> None:
        statuses = await asyncio.gather(*(self._status(r) for r in shard.replicas))
        logged = {}
        for r, st in zip(shard.replicas, statuses):
            if st is not None:
                if not r.reachable or r.down_until > time.monotonic():
                    log.info("replica %s is up (applied %s)", r.name, st["applied_seq"])
                r.reachable, r.down_until, r.failures = True, 0.0, 0
                r.applied_seq = int(st["applied_seq"])
                r.log_base = int(st.get("log_base", 0))
                r.applied_ts = float(st.get("last_apply_ts") or 0.0)
                logged[r.url] = int(st["logged_seq"])
                self.metrics.log_entries.labels(shard.name, r.name).set(logged[r.url] - r.log_base)
            else:
                if r.reachable:
                    log.warning("replica %s is not answering", r.name)
                r.reachable = False
                r.down_until = time.monotonic() + self.interval_s * 2
            self.metrics.replica_up.labels(shard.name, r.name).set(1 if st is not None else 0)
        if logged:
            longest = max(logged.values())
            if longest > shard.head_seq and shard.pending is None:
                shard.head_seq = longest  # written through another router (or before our start)
            if not shard.head_known and shard.pending is None:
                shard.head_known = len(logged) == len(shard.replicas)
        self.metrics.head_seq.labels(shard.name).set(shard.head_seq)
        best = max((r for r in shard.replicas if r.url in logged), key=lambda r: logged[r.url], default=None)
        laggards = []
        if best is not None:
            laggards = [r for r in shard.replicas if r.url in logged and logged[r.url] < logged[best.url]]
            for r in laggards:
                self._job(r, self._catch_up(shard, r, best))
        point = compaction_point([r.applied_seq for r in shard.replicas], shard.head_seq, self.keep_max)
        for r in shard.replicas:
            if r.url in logged and r not in laggards and should_compact(point, r.log_base, self.compact_every):
                self._job(r, self._compact(shard, r, point))
        now = time.time()
        for r in shard.replicas:
            if not r.serving and r.reachable and r.applied_seq >= shard.head_seq:
                r.serving = True  # an added replica has caught up: it may take queries now
                log.info("added replica %s is current (entry %d) and serving", r.name, r.applied_seq)
            self.metrics.applied_seq.labels(shard.name, r.name).set(r.applied_seq)
            self.metrics.freshness.labels(shard.name, r.name).set(shard.freshness_s(r, now))

    async def _catch_up(self, shard: ShardRuntime, r: ReplicaState, peer: ReplicaState) -> None:
        try:
            resp = await self.http.post(r.url + "/v1/shard/catch_up", json={"peer": peer.url}, timeout=600.0)
            if resp.status_code == 200:
                r.applied_seq = int(resp.json()["applied_seq"])
                log.info("replica %s caught up from %s to entry %d", r.name, peer.name, r.applied_seq)
        except (httpx.HTTPError, ValueError):
            pass  # next poll tries again

    async def _compact(self, shard: ShardRuntime, r: ReplicaState, upto: int) -> None:
        try:
            resp = await self.http.post(r.url + "/v1/shard/compact", json={"upto": upto}, timeout=120.0)
            if resp.status_code == 200:
                r.log_base = int(resp.json()["log_base"])
                log.info("replica %s compacted its write log through entry %d", r.name, r.log_base)
        except (httpx.HTTPError, ValueError):
            pass  # next poll tries again

    async def stop(self) -> None:
        for t in self._jobs.values():
            t.cancel()
        await asyncio.gather(*self._jobs.values(), return_exceptions=True)
        await self.status_client.aclose()

    async def poll_once(self) -> None:
        await asyncio.gather(*(self.poll_shard(s) for s in self.topo.shards if s.cold_url is None))
        self.polls += 1
        self._polled.set()

    async def next_poll(self) -> None:
        """Returns once the next poll round has ended (readiness is judged from the polls)."""
        self._polled.clear()
        await self._polled.wait()

    async def run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # a poll must never stop polling
                log.exception("health poll failed")
            await asyncio.sleep(self.interval_s)
