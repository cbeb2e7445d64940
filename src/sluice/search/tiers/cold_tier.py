"""The cold tier: read-only shards whose index lives in object storage, served by the router.

A cold shard is fetched on its first query (download + unpack into the router's cache folder),
opened read-only, and answers the statistics round and the search like any replica: it is a
ShardService (service.py) taking the contract's typed requests, answered by the same code as a
replica process (shard/answers.py), so its scores merge exactly. Fetched shards are kept under a
disk budget: when a fetch would exceed it, the least recently queried other shards are evicted
(closed and deleted) first.
Queries run in a worker thread (Xapian releases no GIL-free promise; the event loop must not
wait on a download); one lock per shard serializes its Xapian handle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xapian

from sluice.search.contract import ShardSearchAnswer, ShardSearchRequest, StatsAnswer, StatsRequest
from sluice.search.index.schema import Schema
from sluice.search.index.shard_index import ShardIndex
from sluice.search.shard.answers import search_answer, stats_answer

Fetch = Callable[[str, Path], Path]  # (archive url, destination folder) → the index folder
COLD_SEQ = 0  # a cold shard is read-only: it never applies a write-log entry


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclasses.dataclass(slots=True)
class ColdShard:
    """One fetched archive, opened read-only: a ShardService (one lock serializes its Xapian handle)."""

    index: ShardIndex
    folder: Path
    size: int
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def stats(self, req: StatsRequest) -> StatsAnswer:
        with self.lock:
            return stats_answer(self.index, req, COLD_SEQ)

    def search(self, req: ShardSearchRequest) -> ShardSearchAnswer:
        with self.lock:
            return search_answer(self.index, req, COLD_SEQ)


class ColdTier:
    def __init__(self, cache_dir: Path, budget_bytes: int, fetch: Fetch, schema: Schema | None = None):
        self.cache_dir, self.budget_bytes, self.fetch, self.schema = cache_dir, budget_bytes, fetch, schema
        self._open: OrderedDict[str, ColdShard] = OrderedDict()  # LRU: first = least recently used
        self._lock = threading.Lock()
        self.fetches = 0
        self.evictions = 0
        self.last_fetch_s: dict[str, float] = {}

    def used_bytes(self) -> int:
        return sum(o.size for o in self._open.values())

    def _get(self, url: str) -> ColdShard:
        with self._lock:
            o = self._open.get(url)
            if o is not None:
                self._open.move_to_end(url)
                return o
            t0 = time.perf_counter()
            folder = self.cache_dir / hashlib.sha256(url.encode()).hexdigest()[:24]
            shutil.rmtree(folder, ignore_errors=True)
            index_dir = self.fetch(url, folder)
            size = folder_size(folder)
            while self._open and self.used_bytes() + size > self.budget_bytes:
                _, victim = self._open.popitem(last=False)
                with victim.lock:
                    victim.index.close()
                shutil.rmtree(victim.folder, ignore_errors=True)
                self.evictions += 1
            o = ColdShard(ShardIndex.read_only(xapian.Database(str(index_dir)), self.schema), folder, size)
            self._open[url] = o
            self.fetches += 1
            self.last_fetch_s[url] = time.perf_counter() - t0
            return o

    def answer(self, url: str, req: StatsRequest | ShardSearchRequest) -> StatsAnswer | ShardSearchAnswer:
        """Answer one request from the cold shard at `url` (fetched first if it is not here)."""
        shard = self._get(url)
        return shard.stats(req) if isinstance(req, StatsRequest) else shard.search(req)

    async def call(self, url: str, req: StatsRequest | ShardSearchRequest) -> StatsAnswer | ShardSearchAnswer:
        return await asyncio.to_thread(self.answer, url, req)

    def status(self) -> dict[str, Any]:
        return {
            "open": list(self._open),
            "used_bytes": self.used_bytes(),
            "budget_bytes": self.budget_bytes,
            "fetches": self.fetches,
            "evictions": self.evictions,
            "first_query_fetch_s": {k: round(v, 3) for k, v in self.last_fetch_s.items()},
        }
