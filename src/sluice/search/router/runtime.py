"""The router: its parts, built from a config and the replicas' URLs, their lifetime, and the
search service's operations over them (service.py's SearchService: search, write, delete,
status), which the HTTP API (http/) decodes requests for and renders answers of."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from sluice.search.contract import BulkAnswer, DeleteAnswer, SearchRequest, SearchResponse
from sluice.search.dense.embedder import Embedder, attach_vectors
from sluice.search.index.analyzer import Analyzer
from sluice.search.index.schema import Schema, check_id
from sluice.search.router.auth import SearchAuth
from sluice.search.router.cluster.shard_query_client import ShardQueryClient
from sluice.search.router.cluster.topology import Topology
from sluice.search.router.config import SearchConfig
from sluice.search.router.query.result_cache import ResultCache
from sluice.search.router.query.searcher import Searcher
from sluice.search.router.query.shard_call import ShardCaller
from sluice.search.router.replication.health_poller import HealthPoller
from sluice.search.router.search_metrics import SearchMetrics
from sluice.search.router.writes.bulk import plan_bulk
from sluice.search.router.writes.writer import Writer
from sluice.search.tiers.archive import S3Location, download
from sluice.search.tiers.cold_tier import ColdTier
from sluice.search.tiers.local_reads import LocalReads


def schema_of(cfg: SearchConfig) -> Schema:
    s = cfg.search
    return Schema(
        default_fields=tuple(s.default_fields),
        snippet=None if s.snippet_fields is None else tuple(s.snippet_fields),
        ranges=dict(s.range_fields),
    )


class RouterRuntime:
    def __init__(
        self,
        cfg: SearchConfig,
        replica_urls: list[list[str]],
        local: list[list[bool]] | None = None,
        poll_interval_s: float = 0.5,
        local_dirs: dict[int, Path] | None = None,
    ):
        """`local_dirs`: shard position → a local replica's index folder (read in-process with
        `local_reads`: tiers/local_reads.py)."""
        self.cfg = cfg
        local = local or [[False] * len(u) for u in replica_urls]
        self.topo = Topology(cfg, replica_urls, local)
        self.schema = schema_of(cfg)
        self.metrics = SearchMetrics()
        self.metrics.watch_index_ages(self.topo.index_ages)
        # TCP_NODELAY: a request's headers and body go out as separate writes; with Nagle on,
        # the second waits for the peer's delayed ACK (40 ms on Linux)
        transport = httpx.AsyncHTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=256),
        )
        self.http = httpx.AsyncClient(transport=transport, timeout=cfg.search.shard_deadline_ms / 1000)
        s = cfg.search
        # the query path's client (cluster/shard_query_client.py); httpx for the rest
        self.shard_query_client = ShardQueryClient()
        self.caller = ShardCaller(self.shard_query_client, self.metrics, s.hedge, s.hedge_min_ms / 1000)
        self.cache = ResultCache(s.cache_entries)
        self.cold = None
        if any(sh.archive for sh in cfg.shards):
            self.cold = ColdTier(
                Path(s.data_dir) / "cold-cache",
                s.cold_cache_mb << 20,
                lambda url, dest: download(S3Location.parse(url), dest, s.s3_endpoint),
                self.schema,
            )
        self.embedder = Embedder() if s.vectors else None
        self.local_reads = LocalReads(local_dirs, self.schema) if s.local_reads and local_dirs else None
        self.searcher = Searcher(
            self.topo,
            self.caller,
            self.metrics,
            self.cache,
            Analyzer(self.schema),
            s.stats,
            s.shard_deadline_ms / 1000,
            self.cold,
            self.embedder,
            s.vector_search,
            self.local_reads,
            s.ranking,
        )
        self.writer = Writer(self.topo, self.http, self.metrics)
        self.poller = HealthPoller(
            self.topo, self.http, self.metrics, poll_interval_s, s.log_compact_every, s.log_keep_max
        )
        self.auth = SearchAuth(s.api_keys, s.ingest_keys)
        self.started = time.time()
        self._tasks: list[asyncio.Task] = []
        self.extra_status: dict[str, Any] = {}

    # the SearchService (service.py)
    async def search(self, request: SearchRequest) -> SearchResponse:
        return await self.searcher.search(request)

    async def write(self, ndjson: bytes) -> BulkAnswer:
        plan = plan_bulk(ndjson, self.topo, self.schema)
        if self.embedder is not None:  # in a worker thread: ~0.1 ms a document, off the event loop
            await asyncio.to_thread(attach_vectors, plan.batches, self.embedder, self.schema.default_fields)
        self.metrics.bad_lines.inc(len(plan.errors))
        outcome = await self.writer.write(plan.batches)
        self.metrics.documents.labels("upsert").inc(plan.accepted if not outcome.failed else 0)
        return BulkAnswer(plan.accepted, plan.errors, outcome)

    async def delete(self, doc_id: str) -> DeleteAnswer:
        check_id(doc_id)
        topo = self.topo
        shards = (
            [i for i, s in enumerate(topo.shards) if s.cold_url is None]
            if topo.moves_documents
            else [topo.shard_for_id(doc_id)]
        )
        outcome = await self.writer.write({i: [{"op": "delete", "id": doc_id}] for i in shards})
        self.metrics.documents.labels("delete").inc(0 if outcome.failed else 1)
        return DeleteAnswer(doc_id, outcome)

    async def start(self) -> None:
        await self.poller.poll_once()
        self._tasks.append(asyncio.create_task(self.poller.run()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.poller.stop()
        await self.http.aclose()
        await self.shard_query_client.aclose()
        if self.local_reads is not None:
            self.local_reads.close()

    def not_ready_reason(self) -> str | None:
        if self.poller.polls == 0:
            return "starting"
        down = [s.name for s in self.topo.shards if s.cold_url is None and not any(r.reachable for r in s.replicas)]
        return f"unavailable: no replica of shard(s) {', '.join(down)}" if down else None

    def status(self) -> dict[str, Any]:
        now = time.time()
        return {
            "uptime_s": round(now - self.started, 1),
            "sharding": self.cfg.search.sharding.value,
            "stats": self.cfg.search.stats.value,
            "auth": self.auth.mode,
            "errors": self.metrics.error_counts(),
            "cache": {
                "entries": len(self.cache),
                "hit_ratio": round(self.cache.hit_ratio, 4),
                "hits": self.cache.hits,
                "lookups": self.cache.lookups,
                "stats_hits": self.searcher.stats_cache.hits,
                "stats_misses": self.searcher.stats_cache.misses,
                "one_round": dict(self.searcher.one_round),
            },
            "shards": [
                {
                    "name": s.name,
                    "head_seq": s.head_seq,
                    "p50_ms": _ms(s.latency.quantile(0.5)),
                    "p95_ms": _ms(s.latency.quantile(0.95)),
                    "p99_ms": _ms(s.latency.quantile(0.99)),
                    "index_age_s": _s(s.index_age_s(now)),
                    "index_p95_ms": _ms(s.index_latency.quantile(0.95)),
                    "replicas": [
                        {
                            "name": r.name,
                            "url": r.url,
                            "local": r.local,
                            "up": r.reachable,
                            "applied_seq": r.applied_seq,
                            "log_base": r.log_base,
                            "in_flight": r.in_flight,
                            "serving": r.serving,
                            "added": r.added,
                            "ewma_ms": round(r.ewma_s * 1000, 3),
                            "freshness_s": round(s.freshness_s(r, now), 3),
                            "index_age_s": _s(s.index_age_s(now, r)),
                        }
                        for r in s.replicas
                    ],
                }
                for s in self.topo.shards
            ],
            **({"cold_tier": self.cold.status()} if self.cold is not None else {}),
            **({"local_reads": self.local_reads.status()} if self.local_reads is not None else {}),
            **self.extra_status,
        }


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 3)


def _s(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
