"""One search across the shards: resolve → (phase 1: statistics) → phase 2: top-k → merge.

The rounds before the search are global_stats/rounds.py's, each round a fan_out.py round of
the contract's typed requests.

Phase 1 asks one replica of each shard for what the router does not already know at that
shard's newest entry (global_stats/stats_cache.py: its document count, total length and the
document frequency of each query term); the sums over the shards are the global statistics.
Phase 2 sends the resolved query and those statistics to every shard (to the replica that
answered its phase 1, if it was asked: both phases see one revision when nothing is being
written), and each shard scores with them (index/bm25.py): merged scores equal one index
holding every document. Phase 1 is skipped when every term is known at every shard's entry,
with one shard (its own statistics are the global ones), and — when only some terms' frequencies
are new — by the one-round search (global_stats/one_round.py: the shards score those terms with
their own frequencies and report their parts; the router corrects and verifies, or asks a
second round). `stats = "local"` skips phase 1 (one round trip; each shard scores with its
own statistics, cheaper and inexact on skewed shards).

A query with trailing wildcards has a statistics round in every mode: each shard lists the terms
its prefixes expand to (global_stats/wildcards.py), and their union replaces each wildcard
before the search round.

A shard that misses its deadline or has no replica left is reported, never hidden: `partial`
is true and `shards_answered` < `shards`. The query has one deadline, and a round that another
follows (the statistics round, the one-round search, a wildcard expansion) may spend only half
of the time left, so that a stalled shard costs that round its answer but never the other
shards theirs: the last round searches the shards that answered, with their statistics
(a partial answer is scored as if they held every document).
"""

from __future__ import annotations

import dataclasses
import time

from sluice.search.contract import SearchRequest, SearchResponse, ShardSearchAnswer, ShardSearchRequest
from sluice.search.errors import QuerySyntaxError, ShardFailure
from sluice.search.index.analyzer import Analyzer
from sluice.search.index.hits import Hit, merge
from sluice.search.index.query_tree import ResolvedQuery, cache_key, resolve_query, terms_of
from sluice.search.router.cluster.topology import Topology
from sluice.search.router.config import StatsMode
from sluice.search.router.query.fan_out import FanOut, QueryRun
from sluice.search.router.query.global_stats.rounds import StatisticsRounds
from sluice.search.router.query.global_stats.stats_cache import StatsCache
from sluice.search.router.query.result_cache import ResultCache
from sluice.search.router.query.shard_call import ShardCaller
from sluice.search.router.search_metrics import SearchMetrics
from sluice.search.tiers.cold_tier import ColdTier

TREES_KEPT = 10_000


class Searcher:
    def __init__(self, topo: Topology, caller: ShardCaller, metrics: SearchMetrics, cache: ResultCache,
                 analyzer: Analyzer, stats_mode: StatsMode, deadline_s: float, cold: ColdTier | None = None):
        self.topo, self.metrics, self.cache = topo, metrics, cache
        self.analyzer = analyzer
        self.stats_mode = stats_mode
        self.deadline_s = deadline_s
        self.stats_cache = StatsCache()
        self.fan_out = FanOut(caller, metrics, cold)
        self.rounds = StatisticsRounds(self.fan_out, self.stats_cache)
        self._trees: dict[str, ResolvedQuery] = {}  # query text → its resolved tree (parsing costs ~40 µs)

    @property
    def one_round(self) -> dict[str, int]:
        return self.rounds.one_round

    def _resolved(self, query: str) -> ResolvedQuery:
        resolved = self._trees.get(query)
        if resolved is None:
            try:
                resolved = resolve_query(query, self.analyzer)
            except QuerySyntaxError:
                self.metrics.errors.labels(ShardFailure.BAD_QUERY.value).inc()
                raise
            if len(self._trees) >= TREES_KEPT:
                self._trees.clear()
            self._trees[query] = resolved
        return resolved

    async def search(self, req: SearchRequest) -> SearchResponse:
        t0 = time.perf_counter()
        resolved = self._resolved(req.query)
        key = (cache_key(resolved.tree), req.options_key(), self.topo.revision())
        cached = self.cache.get(key)
        self.metrics.child(self.metrics.cache, "hit" if cached is not None else "miss").inc()
        self.metrics.cache_hit_ratio.set(self.cache.hit_ratio)
        if cached is not None:
            res = dataclasses.replace(cached, cached=True, took_ms=(time.perf_counter() - t0) * 1000)
            self.metrics.child(self.metrics.query_latency, "cached").observe(time.perf_counter() - t0)
            return res
        shards = self.topo.shards
        run = QueryRun(key[-1], t0 + self.deadline_s, {s.position: None for s in shards})
        merged = await self._hits(resolved, req, run)
        result = SearchResponse(merged, len(shards), len(shards) - len(run.failed), run.failed)
        result.took_ms = (time.perf_counter() - t0) * 1000
        if result.partial:
            self.metrics.partial.inc()
        else:
            self.cache.put(key, result)
        self.metrics.child(self.metrics.query_latency, "partial" if result.partial else "complete").observe(time.perf_counter() - t0)
        return result

    async def _hits(self, resolved: ResolvedQuery, req: SearchRequest, run: QueryRun) -> list[Hit]:
        """The rounds: (expansion or statistics or one-round search) → search → merge."""
        shards, top_k = self.topo.shards, req.top_k
        tree, glob = resolved.tree, None
        exact = self.stats_mode is StatsMode.GLOBAL and len(shards) > 1  # one shard's own statistics are global
        if tree is not None and resolved.wildcards:
            tree, glob = await self.rounds.expand(run.live(shards), resolved, run, exact)
        elif tree is not None and exact:
            merged = await self.rounds.one_round_search(shards, tree, req, run)
            if merged is not None:
                return merged
            glob = await self.rounds.global_stats(run.live(shards), terms_of(tree), run)
        if tree is None or top_k == 0:
            return []  # matches nothing: no shard needs asking
        answers = await self.fan_out.round(run.live(shards), ShardSearchRequest(tree, top_k, glob, snippet_chars=req.snippet_chars, filter=req.filter), run.deadline, run,
                                           prefer_chosen=True)
        return merge([a.hits for _, a in answers if isinstance(a, ShardSearchAnswer)], top_k)
