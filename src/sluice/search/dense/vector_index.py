"""One shard's vector index: every document's vector by its Xapian document id, searched by
cosine similarity (the vectors are normalized: a dot product) with usearch.

Two ways to search, the same scores:
- **exact** — usearch's brute-force search (`usearch.index.search(..., exact=True)`) over a
  dense matrix of every vector (or of the vectors a filter lets through). One kernel computes
  every document's score, on every shard, so a document scores the same wherever it is and the
  merged top-k of N shards is one index's (tested). The default for a shard of at most
  `EXACT_MAX_VECTORS` vectors.
- **approximate** — usearch's HNSW graph (`Index`, built on first use, then kept up to date),
  for larger shards: a few candidates per query instead of every vector; its recall@10 against
  exact is measured (bench/search/search_dense_quality.py). With a filter it asks for more candidates
  until enough pass (or falls back to exact over the filter's documents).

A hit's score is the cosine, 1 − usearch's inner-product distance. Ties (equal vectors: equal
texts) are ordered by document id, as lexical ties are (hits.py): a search asks usearch for
more candidates while the last one ties the k-th, so no tied document is cut at random.

The vectors themselves are durable in the shard's Xapian database (a value slot of each
document, committed with it: index/shard_index.py), so a snapshot, a cold archive and a
memory replica's rebuild carry them; this index is built from them when the database opens.
Not thread-safe: the shard's index lock covers it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from usearch.index import Index, MetricKind, search

from sluice.search.dense.vectors import DIM

EXACT_MAX_VECTORS = 20_000
# HNSW: usearch's defaults but a wider search beam (64 → 200): on 3,000 random unit vectors
# recall@10 0.74 → 0.98 for 0.27 → 0.30 ms a query (exact: 0.50 ms); bench/ measures real text
HNSW_CONNECTIVITY, HNSW_EXPANSION_ADD, HNSW_EXPANSION_SEARCH = 16, 128, 200
FILTER_OVERSAMPLE = 4  # approximate search with a filter: candidates asked per hit wanted, then doubled


class VectorIndex:
    def __init__(self) -> None:
        self._matrix = np.zeros((0, DIM), dtype=np.float32)  # rows [0, n): the vectors, capacity beyond
        self._keys = np.zeros(0, dtype=np.uint64)
        self._row: dict[int, int] = {}  # document id → row
        self._n = 0
        self._hnsw: Index | None = None

    def __len__(self) -> int:
        return self._n

    def add(self, key: int, vector: np.ndarray) -> None:
        self.remove(key)
        if self._n == len(self._matrix):
            grow = max(64, 2 * self._n)
            self._matrix = np.concatenate([self._matrix, np.zeros((grow - self._n, DIM), dtype=np.float32)])
            self._keys = np.concatenate([self._keys, np.zeros(grow - self._n, dtype=np.uint64)])
        self._matrix[self._n] = vector
        self._keys[self._n] = key
        self._row[key] = self._n
        self._n += 1
        if self._hnsw is not None:
            self._hnsw.add(key, vector, threads=1)

    def add_many(self, items: Iterable[tuple[int, np.ndarray]]) -> None:
        for key, vector in items:
            self.add(key, vector)

    def remove(self, key: int) -> None:
        row = self._row.pop(key, None)
        if row is None:
            return
        last = self._n - 1
        if row != last:  # the last row fills the hole
            self._matrix[row] = self._matrix[last]
            moved = int(self._keys[last])
            self._keys[row] = moved
            self._row[moved] = row
        self._n = last
        if self._hnsw is not None:
            self._hnsw.remove(key)

    def vector(self, key: int) -> np.ndarray | None:
        row = self._row.get(key)
        return None if row is None else self._matrix[row]

    def search(
        self, query: np.ndarray, k: int, exact: bool | None = None, allowed: set[int] | None = None
    ) -> list[tuple[int, float]]:
        """Up to k (document id, cosine) pairs, best first, and every document tied with the
        k-th (the caller orders ties by id and cuts); `exact` None: exact on a small shard;
        `allowed`: only these documents (a filter's)."""
        if k <= 0 or self._n == 0:
            return []
        if exact is None:
            exact = self._n <= EXACT_MAX_VECTORS
        if allowed is not None:
            if exact or len(allowed) <= FILTER_OVERSAMPLE * k:
                rows = np.fromiter((self._row[d] for d in allowed if d in self._row), dtype=np.int64)
                return self._exact(self._matrix[rows], self._keys[rows], query, k)
            return self._approximate(query, k, allowed)
        if exact:
            return self._exact(self._matrix[: self._n], self._keys[: self._n], query, k)
        return self._approximate(query, k, None)

    @staticmethod
    def _exact(matrix: np.ndarray, keys: np.ndarray, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        n = len(matrix)
        count = min(n, k + 1)  # one past the k-th: does it tie?
        while True:
            if count == 0:
                return []
            m = search(matrix, query, count, MetricKind.IP, exact=True, threads=1)
            dist = m.distances
            if count >= n or dist[-1] != dist[k - 1]:
                break
            count = min(n, 2 * count)  # the last candidate ties the k-th: see every tied one
        kth = dist[min(k, len(dist)) - 1]
        return [(int(keys[int(p)]), 1.0 - float(d)) for i, (p, d) in enumerate(zip(m.keys, dist)) if i < k or d == kth]

    def _graph(self) -> Index:
        if self._hnsw is None:
            self._hnsw = Index(
                ndim=DIM,
                metric=MetricKind.IP,
                dtype="f32",
                connectivity=HNSW_CONNECTIVITY,
                expansion_add=HNSW_EXPANSION_ADD,
                expansion_search=HNSW_EXPANSION_SEARCH,
            )
            if self._n:
                self._hnsw.add(self._keys[: self._n], self._matrix[: self._n], threads=1)
        return self._hnsw

    def _approximate(self, query: np.ndarray, k: int, allowed: set[int] | None) -> list[tuple[int, float]]:
        graph = self._graph()
        count = min(self._n, k if allowed is None else FILTER_OVERSAMPLE * k)
        while True:
            m = graph.search(query, count, threads=1)
            got = [
                (int(key), 1.0 - float(d))
                for key, d in zip(m.keys, m.distances)
                if allowed is None or int(key) in allowed
            ]
            if len(got) >= k or count >= self._n:
                return got
            count = min(self._n, 2 * count)
