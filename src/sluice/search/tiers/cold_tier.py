"""The cold tier: read-only shards whose index lives in object storage, served by the router.

A cold shard is fetched on its first query (download + unpack into the router's cache folder),
opened read-only, and answers phase 1 and phase 2 like any replica (the same ShardIndex code,
so its scores merge exactly). Fetched shards are kept under a disk budget: when a fetch would
exceed it, the least recently queried other shards are evicted (closed and deleted) first.
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

from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.query_tree import check_tree
from sluice.search.index.schema import Schema
from sluice.search.index.shard_index import ShardIndex

Fetch = Callable[[str, Path], Path]  # (archive url, destination folder) → the index folder


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclasses.dataclass(slots=True)
class _Open:
    index: ShardIndex
    folder: Path
    size: int
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class ColdTier:
    def __init__(self, cache_dir: Path, budget_bytes: int, fetch: Fetch, schema: Schema | None = None):
        self.cache_dir, self.budget_bytes, self.fetch, self.schema = cache_dir, budget_bytes, fetch, schema
        self._open: OrderedDict[str, _Open] = OrderedDict()  # LRU: first = least recently used
        self._lock = threading.Lock()
        self.fetches = 0
        self.evictions = 0
        self.last_fetch_s: dict[str, float] = {}

    def used_bytes(self) -> int:
        return sum(o.size for o in self._open.values())

    def _get(self, url: str) -> _Open:
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
            o = _Open(ShardIndex.read_only(xapian.Database(str(index_dir)), self.schema), folder, size)
            self._open[url] = o
            self.fetches += 1
            self.last_fetch_s[url] = time.perf_counter() - t0
            return o

    def handle(self, url: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Answer one shard-protocol request (stats or search) from the cold shard at `url`."""
        o = self._get(url)
        with o.lock:
            if path == "/v1/shard/stats":
                out = {**o.index.stats(list(payload["terms"])).to_json(), "applied_seq": 0}
                if payload.get("prefixes"):
                    out["expansions"] = {p: o.index.expand(p) for p in payload["prefixes"]}
                return out
            tree = payload.get("tree")
            st = payload.get("stats")
            hits = o.index.search(None if tree is None else check_tree(tree), int(payload.get("top_k", 10)),
                                  None if st is None else CollectionStats.from_json(st))
            return {"hits": [h.to_json() for h in hits], "applied_seq": 0}

    async def call(self, url: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.handle, url, path, payload)

    def status(self) -> dict[str, Any]:
        return {"open": list(self._open), "used_bytes": self.used_bytes(), "budget_bytes": self.budget_bytes,
                "fetches": self.fetches, "evictions": self.evictions,
                "first_query_fetch_s": {k: round(v, 3) for k, v in self.last_fetch_s.items()}}
