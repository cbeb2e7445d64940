"""Writes: each shard's write log is sequenced here and appended on every replica of the shard.

Per shard, one write at a time (a lock): the next entry is head + 1; it is sent to every
replica at once, and each appends it to its log, fsyncs, applies it, and answers. The write is
acknowledged when at least one replica has it durably — normally all of them, because the
router waits for every answer (bounded by the write timeout). A replica that missed it (down,
or behind: it answers 409 with its last entry) is brought up to date by the health poller
(replication/health_poller.py), which has it copy the missing entries from a peer's log, in order.

If no replica confirms an entry, its sequence number stays reserved: the entry is kept as
`pending` and sent again (same number, same operations — appends are idempotent) before any
new write to that shard, so no two different entries ever share a number and no replica sees
a gap it cannot fill. The client got a 503 and may retry; upserts and deletes are idempotent.

The router is the shard's single sequencer: run one writing router per deployment (any number
may search). On start it learns each shard's head as the largest log any replica holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx

from sluice.search.contract import WriteOutcome
from sluice.search.router.cluster.topology import ShardRuntime, Topology
from sluice.search.router.search_metrics import SearchMetrics

log = logging.getLogger("sluice.search.router")


class WriteUnavailable(Exception):
    def __init__(self, shard: str, message: str):
        super().__init__(f"shard {shard}: {message}")
        self.shard = shard


def _encode(entry: dict[str, Any]) -> bytes:
    """The entry as the replicas read it (strict JSON: the bulk path refused whatever this
    would fail on, so a failure here is a bug, reported for the shard, never a half-reserved
    number)."""
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class Writer:
    def __init__(self, topo: Topology, http: httpx.AsyncClient, metrics: SearchMetrics, timeout_s: float = 10.0):
        self.topo, self.http, self.metrics, self.timeout_s = topo, http, metrics, timeout_s

    async def learn_head(self, shard: ShardRuntime) -> None:
        """The shard's head = the longest log among its replicas (needs one to answer)."""

        async def status(url: str) -> int | None:
            try:
                r = await self.http.get(url + "/v1/shard/status", timeout=self.timeout_s)
                r.raise_for_status()
                return int(r.json()["logged_seq"])
            except (httpx.HTTPError, ValueError, KeyError):
                return None

        seqs = [s for s in await asyncio.gather(*(status(r.url) for r in shard.replicas)) if s is not None]
        if not seqs:
            raise WriteUnavailable(shard.name, "no replica answered; cannot learn the write log's head")
        shard.head_seq = max(shard.head_seq, max(seqs))
        shard.head_known = True

    async def _send(self, shard: ShardRuntime, entry: dict[str, Any]) -> int:
        """Append `entry` on every replica; returns how many hold it now. Never raises but
        for cancellation: a replica that fails in any way has not confirmed."""
        body = _encode(entry)  # once for every replica; encodable: write_shard checked it first

        async def one(replica) -> bool:
            t0 = time.perf_counter()
            try:
                r = await self.http.post(
                    replica.url + "/v1/shard/append",
                    content=body,
                    headers={"content-type": "application/json"},
                    timeout=self.timeout_s,
                )
                if r.status_code != 200:
                    return False  # 409: behind (the poller catches it up); 4xx/5xx: failing
                applied = int(r.json()["applied_seq"])
                if applied >= entry["seq"]:  # it applied this entry: its index is as new as the entry
                    replica.applied_ts = max(replica.applied_ts, float(entry["ts"]))
                replica.applied_seq = max(replica.applied_seq, applied)
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                replica.observe(time.perf_counter() - t0, ok=False)
                return False
            self.metrics.replica_latency.labels(shard.name, replica.name, "write").observe(time.perf_counter() - t0)
            return True

        results = await asyncio.gather(*(one(r) for r in shard.replicas))
        return sum(results)

    async def write_shard(self, shard: ShardRuntime, ops: list[dict[str, Any]]) -> int:
        """Sequence and replicate one batch for one shard; returns its entry's sequence number."""
        async with shard.write_lock:
            if not shard.head_known:
                await self.learn_head(shard)
            if shard.pending is not None:
                if await self._send(shard, shard.pending) == 0:
                    raise WriteUnavailable(
                        shard.name, f"entry {shard.pending['seq']} is still unconfirmed; no replica accepts writes"
                    )
                shard.record_ack(shard.pending["seq"], time.time())
                shard.pending = None
            seq = shard.head_seq + 1
            entry = {"seq": seq, "ops": ops, "ts": time.time()}
            _encode(entry)  # an entry that cannot be sent must not reserve a number (it would wedge the shard)
            if await self._send(shard, entry) == 0:
                shard.pending = entry  # its number stays reserved; resent before the next write
                raise WriteUnavailable(
                    shard.name, "no replica confirmed the write (it may still be applied; retrying is safe)"
                )
            shard.record_ack(seq, time.time())
            self.metrics.head_seq.labels(shard.name).set(shard.head_seq)
            return seq

    async def write(self, batches: dict[int, list[dict[str, Any]]]) -> WriteOutcome:
        """Write each shard's batch concurrently: which shards' parts were written (their
        entries), and which were not (why).

        Never raises for one shard's failure: the other shards' parts may be written by then,
        and the answer must say which were (a 503 naming the failed shards; retrying the whole
        batch is safe, upserts and deletes being idempotent)."""
        shards = self.topo.shards
        items = [(shards[i], ops) for i, ops in batches.items() if ops and shards[i].cold_url is None]
        results = await asyncio.gather(*(self.write_shard(s, ops) for s, ops in items), return_exceptions=True)
        written: dict[str, int] = {}
        failed: dict[str, str] = {}
        for (s, _), res in zip(items, results):
            if isinstance(res, WriteUnavailable):
                failed[s.name] = str(res)
            elif isinstance(res, Exception):
                log.error("write to shard %s failed", s.name, exc_info=res)
                failed[s.name] = f"shard {s.name}: the write failed ({type(res).__name__}); retrying is safe"
            elif isinstance(res, BaseException):
                raise res  # cancelled: the client is gone
            else:
                written[s.name] = res
        return WriteOutcome(written, failed)
