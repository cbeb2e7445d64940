"""Global term statistics remembered per index revision: phase 1 only for terms not seen since
the last write.

The global statistics of a term change only when a shard applies a write, and the revision
(every shard's newest acknowledged entry) moves with every write, so statistics gathered at one
revision are exact for any later query at the same revision. A repeated term (most of a real
query mix: Zipf) then costs one round trip instead of two. A new revision empties the cache.
"""

from __future__ import annotations

from sluice.search.index.bm25 import CollectionStats

MAX_TERMS = 200_000


class StatsCache:
    def __init__(self) -> None:
        self._revision: tuple[int, ...] | None = None
        self._base: tuple[int, int] | None = None  # doc_count, total_length
        self._tf: dict[str, int] = {}
        self.hits = 0
        self.misses = 0

    def lookup(self, revision: tuple[int, ...], terms: list[str]) -> CollectionStats | None:
        if revision != self._revision or self._base is None or any(t not in self._tf for t in terms):
            self.misses += 1
            return None
        self.hits += 1
        return CollectionStats(self._base[0], self._base[1], {t: self._tf[t] for t in terms})

    def store(self, revision: tuple[int, ...], stats: CollectionStats) -> None:
        if revision != self._revision or len(self._tf) > MAX_TERMS:
            self._revision, self._tf = revision, {}
        self._base = (stats.doc_count, stats.total_length)
        self._tf.update(stats.term_freqs)
