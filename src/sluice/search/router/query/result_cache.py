"""Search results by (normalized query, top_k, index revision), least recently used out.

The normalized query is the resolved query tree (stemmed, lower-cased, flattened: query_tree.py),
so `Running  Dogs` and `run dog` share an entry. The revision is every shard's newest write-log
entry as the router knows it; a write moves it, so a cached answer is never served after a write
it does not reflect (with several routers, another router's writes are seen at the next health
poll). Partial answers are not cached.

An entry is kept as tuples of plain values, not as the answer's objects. Why: the cache is most
of what a router keeps alive, and every object it keeps that the cyclic collector tracks (a
`Hit`, a list) is walked again by each collection until it leaves the cache — with 10 hits an
answer, that walking cost the router ~20 µs a query under a load of distinct queries (measured
with gc.callbacks; docs/BENCHMARKS.md). A tuple of strings and numbers is untracked by the first
collection that sees it, so a kept entry costs the collector nothing after that. An answer is
made again from its entry on a hit (~2 µs for 10 hits).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from sluice.search.contract import SearchResponse
from sluice.search.index.hits import Hit

Key = tuple[Any, ...]  # (normalized query, the request's other fields..., revision)
# one flat tuple: the number of shards, then each hit's id, score, stored fields' JSON text and
# snippet (flat, because a collection untracks a tuple only once it has untracked the tuples in
# it, and it may meet the outer one first)
_Entry = tuple[Any, ...]
_PER_HIT = 4


class ResultCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._d: OrderedDict[Key, _Entry] = OrderedDict()
        self.hits = 0
        self.lookups = 0

    def get(self, key: Key) -> SearchResponse | None:
        """The answer kept under `key`, made anew (`cached` set, `took_ms` left for the caller)."""
        if self.capacity <= 0:
            return None
        self.lookups += 1
        v = self._d.get(key)
        if v is None:
            return None
        self._d.move_to_end(key)
        self.hits += 1
        shards = v[0]
        hits = [Hit(v[i], v[i + 1], v[i + 2], v[i + 3]) for i in range(1, len(v), _PER_HIT)]
        return SearchResponse(hits, shards, shards, {}, cached=True)

    def put(self, key: Key, value: SearchResponse) -> None:
        """Keep a complete answer (a partial one is refused by the caller)."""
        if self.capacity <= 0:
            return
        self._d[key] = (value.shards, *[x for h in value.hits for x in (h.doc_id, h.score, h.stored_text(), h.snippet)])
        self._d.move_to_end(key)
        while len(self._d) > self.capacity:
            self._d.popitem(last=False)

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def __len__(self) -> int:
        return len(self._d)
