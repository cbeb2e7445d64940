"""The health poller: every interval, ask each replica how far it has applied; bring laggards
up to date from a peer; keep the replica gauges (up, applied entry, freshness) current.

A replica that does not answer is marked down (replica choice skips it). One that answers again
is marked up and, if behind the shard's head, told to catch up from the most advanced peer
(POST /v1/shard/catch_up): it copies the missing log entries and applies them in order. The
poll also learns writes made through another router (the head is the longest log seen), which
moves the result cache's revision.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from sluice.search.router.replica_state import ReplicaState
from sluice.search.router.search_metrics import SearchMetrics
from sluice.search.router.topology import ShardRuntime, Topology

log = logging.getLogger("sluice.search.router")


class HealthPoller:
    def __init__(self, topo: Topology, http: httpx.AsyncClient, metrics: SearchMetrics, interval_s: float = 0.5):
        self.topo, self.http, self.metrics, self.interval_s = topo, http, metrics, interval_s
        self.polls = 0

    async def _status(self, r: ReplicaState) -> dict | None:
        try:
            resp = await self.http.get(r.url + "/v1/shard/status", timeout=max(0.5, self.interval_s * 2))
            resp.raise_for_status()
            return resp.json()
        except (httpx.HTTPError, ValueError):
            return None

    async def poll_shard(self, shard: ShardRuntime) -> None:
        statuses = await asyncio.gather(*(self._status(r) for r in shard.replicas))
        logged = {}
        for r, st in zip(shard.replicas, statuses):
            up = st is not None
            if up:
                if not r.reachable or r.down_until > time.monotonic():
                    log.info("replica %s is up (applied %s)", r.name, st["applied_seq"])
                r.reachable, r.down_until, r.failures = True, 0.0, 0
                r.applied_seq = int(st["applied_seq"])
                logged[r.url] = int(st["logged_seq"])
            else:
                if r.reachable:
                    log.warning("replica %s is not answering", r.name)
                r.reachable = False
                r.down_until = time.monotonic() + self.interval_s * 2
            self.metrics.replica_up.labels(shard.name, r.name).set(1 if up else 0)
        if logged:
            longest = max(logged.values())
            if longest > shard.head_seq and shard.pending is None:
                shard.head_seq = longest  # written through another router (or before our start)
            if not shard.head_known and shard.pending is None:
                shard.head_known = len(logged) == len(shard.replicas)
        self.metrics.head_seq.labels(shard.name).set(shard.head_seq)
        best = max((r for r in shard.replicas if r.url in logged), key=lambda r: logged[r.url], default=None)
        laggards = [r for r in shard.replicas if r.url in logged and best is not None
                    and r is not best and logged[r.url] < logged[best.url]]
        await asyncio.gather(*(self._catch_up(shard, r, best) for r in laggards))
        now = time.time()
        for r in shard.replicas:
            if not r.serving and r.reachable and r.applied_seq >= shard.head_seq:
                r.serving = True  # an added replica has caught up: it may take queries now
                log.info("added replica %s is current (entry %d) and serving", r.name, r.applied_seq)
            self.metrics.applied_seq.labels(shard.name, r.name).set(r.applied_seq)
            self.metrics.freshness.labels(shard.name, r.name).set(shard.freshness_s(r, now))

    async def _catch_up(self, shard: ShardRuntime, r: ReplicaState, peer: ReplicaState) -> None:
        try:
            resp = await self.http.post(r.url + "/v1/shard/catch_up", json={"peer": peer.url}, timeout=30.0)
            if resp.status_code == 200:
                r.applied_seq = int(resp.json()["applied_seq"])
                log.info("replica %s caught up from %s to entry %d", r.name, peer.name, r.applied_seq)
        except (httpx.HTTPError, ValueError):
            pass  # next poll tries again

    async def poll_once(self) -> None:
        await asyncio.gather(*(self.poll_shard(s) for s in self.topo.shards if s.cold_url is None))
        self.polls += 1

    async def run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # a poll must never stop polling
                log.exception("health poll failed")
            await asyncio.sleep(self.interval_s)
