"""The router's live view of the deployment: shards, their replicas, write heads, placement.

Placement: hash sharding puts a document on crc32(id) mod N (stable across processes and
releases; changing N means re-ingesting — there is no online resharding). Content sharding puts
it on the shard whose `values` hold the document's `content_field` value, else on the default
shard; since an update may move a document between shards, an upsert under content sharding
also deletes that id on every other shard (a delete of an absent id is cheap in Xapian).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator

from sluice.search.index.schema import SourceDocument
from sluice.search.router.cluster.replica_state import LatencyWindow, ReplicaState
from sluice.search.router.config import SearchConfig, Sharding, ShardSpec

ACK_TIMES_KEPT = 100_000


@dataclasses.dataclass(slots=True)
class ShardRuntime:
    spec: ShardSpec
    position: int
    replicas: list[ReplicaState]
    latency: LatencyWindow = dataclasses.field(default_factory=LatencyWindow)
    index_latency: LatencyWindow = dataclasses.field(default_factory=LatencyWindow)  # time inside the index
    index_busy_s: float = 0.0  # total time answers spent inside the index (hot_shards.py)
    head_seq: int = 0  # the newest acknowledged write-log entry
    head_known: bool = False  # learned from the replicas (max of their logs) before the first write
    pending: dict | None = None  # an entry no replica confirmed: retried before any new write
    write_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    ack_times: OrderedDict[int, float] = dataclasses.field(default_factory=OrderedDict)
    lag_seen: dict[str, float] = dataclasses.field(default_factory=dict)  # replica url → first seen behind

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def cold_url(self) -> str | None:
        """The archive of a cold (read-only, object-storage) shard; None for a live shard."""
        return self.spec.archive

    def record_ack(self, seq: int, at: float) -> None:
        self.head_seq = max(self.head_seq, seq)
        self.ack_times[seq] = at
        while len(self.ack_times) > ACK_TIMES_KEPT:
            self.ack_times.popitem(last=False)

    def index_age_s(self, now: float, replica: ReplicaState | None = None) -> float | None:
        """Seconds since the shard's (or one replica's) last applied write: the newest entry
        a replica applied, by the time it was sequenced; None before any write is known."""
        ts = max((r.applied_ts for r in self.replicas), default=0.0) if replica is None else replica.applied_ts
        return max(0.0, now - ts) if ts > 0 else None

    def freshness_s(self, replica: ReplicaState, now: float | None = None) -> float:
        """Seconds since the replica's oldest unapplied write was acknowledged (0: up to date)."""
        now = time.time() if now is None else now
        if replica.applied_seq >= self.head_seq:
            self.lag_seen.pop(replica.url, None)
            return 0.0
        since = self.ack_times.get(replica.applied_seq + 1)
        if since is None:
            since = self.lag_seen.setdefault(replica.url, now)
        return max(0.0, now - since)


class Topology:
    def __init__(self, cfg: SearchConfig, replica_urls: list[list[str]], local: list[list[bool]]):
        self.cfg = cfg
        self.shards = [
            ShardRuntime(spec, i, [ReplicaState(url, f"{spec.name}/{j}", local[i][j]) for j, url in enumerate(urls)])
            for i, (spec, urls) in enumerate(zip(cfg.shards, replica_urls))
        ]
        self._by_value = {v: i for i, s in enumerate(cfg.shards) for v in s.values}
        self._default = next((i for i, s in enumerate(cfg.shards) if s.default), 0)

    def shard_for(self, doc: SourceDocument) -> int:
        if self.cfg.search.sharding is Sharding.CONTENT:
            value = doc.fields.get(self.cfg.search.content_field or "")
            return self._by_value.get(value, self._default) if isinstance(value, str) else self._default
        return hash_shard(doc.doc_id, len(self.shards))

    def shard_for_id(self, doc_id: str) -> int:
        """Where a document with this id lives under hash sharding (content sharding: unknown)."""
        return hash_shard(doc_id, len(self.shards))

    @property
    def moves_documents(self) -> bool:
        """Whether an update can move a document to another shard (content sharding)."""
        return self.cfg.search.sharding is Sharding.CONTENT and len(self.shards) > 1

    def index_ages(self) -> Iterator[tuple[str, str, float]]:
        """(shard, replica, seconds since its last applied write) for each replica with one."""
        now = time.time()
        for shard in self.shards:
            for r in shard.replicas:
                age = shard.index_age_s(now, r)
                if age is not None:
                    yield shard.name, r.name, age

    def revision(self) -> tuple[int, ...]:
        return tuple(s.head_seq for s in self.shards)


def hash_shard(doc_id: str, n: int) -> int:
    return zlib.crc32(doc_id.encode()) % n
