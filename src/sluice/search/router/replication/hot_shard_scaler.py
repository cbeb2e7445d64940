"""Carries out the hot-shard policy (hot_shards.py) on a timer: measures each shard's index
utilization per serving replica over the interval, adds a local replica to a hot shard, and
removes an added one from a cooled shard.

An added replica starts empty and serves only once it has caught up (the health poller marks
it serving). A removed one first leaves the replica set — no new queries; in-flight ones finish
or fail over — then is stopped after a shard deadline and its data deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sluice.search.router.cluster.replica_state import ReplicaState
from sluice.search.router.cluster.topology import ShardRuntime, Topology
from sluice.search.router.config import SearchSettings
from sluice.search.router.replication.hot_shards import Change, HotShardTracker, utilization
from sluice.search.router.replication.supervisor import Supervisor

log = logging.getLogger("sluice.search.router")


class HotShardScaler:
    def __init__(self, topo: Topology, sup: Supervisor, settings: SearchSettings, status: dict[str, Any]):
        self.topo, self.sup, self.settings, self.status = topo, sup, settings, status
        self.tracker = HotShardTracker(settings)  # the thresholds are the settings' (hot_at, cool_at, hot_for, …)

    async def run(self) -> None:
        last = {s.name: s.index_busy_s for s in self.topo.shards}
        then = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.hot_interval_s)
            now = time.monotonic()
            interval, then = now - then, now  # the measured one: a busy loop may wake late
            loads = {}
            for s in self.topo.shards:
                if s.cold_url is None:
                    serving = sum(1 for r in s.replicas if r.serving)
                    loads[s.name] = utilization(s.index_busy_s - last[s.name], interval, serving)
                    last[s.name] = s.index_busy_s
            self.status["hot_shards"] = {
                n: {"utilization": round(u, 4), "added": self.tracker.added(n)} for n, u in loads.items()
            }
            for name, change in self.tracker.evaluate(loads):
                shard = next(s for s in self.topo.shards if s.name == name)
                if change is Change.ADD:
                    self._add(shard, loads[name])
                else:
                    await self._remove(shard)

    def _add(self, shard: ShardRuntime, load: float) -> None:
        r = self.sup.start_added(shard.name)
        shard.replicas.append(ReplicaState(r.url, r.name, local=True, serving=False, added=True))
        log.info("shard %s is hot (%.0f %% busy per replica): added replica %s", shard.name, load * 100, r.name)

    async def _remove(self, shard: ShardRuntime) -> None:
        victim = next((r for r in reversed(shard.replicas) if r.added), None)
        if victim is None:
            return
        shard.replicas.remove(victim)  # no new queries; in-flight ones finish or fail over
        await asyncio.sleep(self.settings.shard_deadline_ms / 1000)
        self.sup.remove(victim.url)
        log.info("shard %s cooled: removed replica %s", shard.name, victim.name)
