"""One search across the shards: resolve → (phase 1: statistics) → phase 2: top-k → merge.

The rounds before the search are global_stats/rounds.py's, each round a fan_out.py round of
the contract's typed requests.

Phase 1 asks one replica of each shard for what the router does not already know at that
shard's newest entry (global_stats/stats_cache.py: its document count, total length and the
document frequency of each query term); the sums over the shards are the global statistics.
Phase 2 sends the resolved query and those statistics to every shard (to the replica that
answered its phase 1, if it was asked: both phases see one revision when nothing is being
written), and each shard scores with them (index/bm25.py): merged scores equal one index
holding every document. When every shard is read in this process, there are no phases: the
shards' databases are searched as one (FanOut.local_union), whose statistics are the global
ones; after a wildcard's expansion (or should a reader not answer), phase 2 over two or more is
a query then fetch (FanOut.local_top): only the merged top_k documents' stored fields are
read. Phase 1 is skipped when every term is known at every shard's entry, with one shard (its
own statistics are the global ones), and — when only some terms' frequencies are new — by the
one-round search (global_stats/one_round.py: the shards score those terms with their own
frequencies and report their parts; the router corrects and verifies, or asks a second
round). `stats = "local"` skips phase 1 (one round trip; each shard scores with its
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

The mode (retrieval.py): `lexical` is the above; `dense` is one round of the query's vector
(embedded here, dense/embedder.py) to every shard, merged by cosine; `hybrid` runs both at
once, each to the depth `window`, and fuses them (fusion.py). The merged hits' snippets are
made here, for the hits returned only (index/snippets.py SnippetMaker).
"""

from __future__ import annotations

import asyncio
import time

from sluice.search.contract import SearchRequest, SearchResponse, ShardSearchAnswer, ShardSearchRequest
from sluice.search.dense.embedder import Embedder
from sluice.search.errors import SearchError, SearchErrorKind
from sluice.search.index.analyzer import Analyzer
from sluice.search.index.hits import Hit, merge
from sluice.search.index.query_syntax import dense_text
from sluice.search.index.query_tree import ResolvedQuery, Tree, cache_key, resolve_query, terms_of
from sluice.search.index.ranking import Ranking
from sluice.search.index.snippets import SnippetMaker
from sluice.search.retrieval import HybridOptions, RetrievalMode, VectorSearch
from sluice.search.router.cluster.topology import Topology
from sluice.search.router.config import StatsMode
from sluice.search.router.query.fan_out import FanOut, QueryRun
from sluice.search.router.query.fusion import fuse
from sluice.search.router.query.global_stats.rounds import StatisticsRounds
from sluice.search.router.query.global_stats.stats_cache import StatsCache
from sluice.search.router.query.result_cache import ResultCache
from sluice.search.router.query.shard_call import ShardCaller
from sluice.search.router.search_metrics import SearchMetrics
from sluice.search.tiers.cold_tier import ColdTier
from sluice.search.tiers.local_reads import LocalReads

TREES_KEPT = 10_000


class Searcher:
    def __init__(
        self,
        topo: Topology,
        caller: ShardCaller,
        metrics: SearchMetrics,
        cache: ResultCache,
        analyzer: Analyzer,
        stats_mode: StatsMode,
        deadline_s: float,
        cold: ColdTier | None = None,
        embedder: Embedder | None = None,
        vector_search: VectorSearch = VectorSearch.AUTO,
        local: LocalReads | None = None,
        ranking: Ranking = Ranking.EXACT,
    ):
        self.topo, self.metrics, self.cache = topo, metrics, cache
        metrics.watch_cache(cache)  # its counts read when scraped, not counted again per query
        self.analyzer = analyzer
        self.embedder, self.vector_search = embedder, vector_search
        self.snippets = SnippetMaker(analyzer.schema.snippet_fields)
        self.stats_mode = stats_mode
        self.deadline_s = deadline_s
        self.stats_cache = StatsCache()
        self.fan_out = FanOut(caller, metrics, cold, local)
        self.rounds = StatisticsRounds(self.fan_out, self.stats_cache)
        self.pruned = self.rounds.pruned = ranking is Ranking.PRUNED
        self._trees: dict[str, ResolvedQuery] = {}  # query text → its resolved tree (parsing costs ~40 µs)

    @property
    def one_round(self) -> dict[str, int]:
        return self.rounds.one_round

    def _resolved(self, query: str) -> ResolvedQuery:
        resolved = self._trees.get(query)
        if resolved is None:
            resolved = resolve_query(query, self.analyzer)  # a syntax error is counted where it is answered
            if len(self._trees) >= TREES_KEPT:
                self._trees.clear()
            self._trees[query] = resolved
        return resolved

    async def search(self, req: SearchRequest) -> SearchResponse:
        t0 = time.perf_counter()
        resolved = self._resolved(req.query)
        # a dense ranking is of the query's words as written: "image" and "images" share a
        # stemmed tree, not a vector
        dense = None if req.mode is RetrievalMode.LEXICAL else dense_text(req.query)
        key = (cache_key(resolved.tree), req.options_key(), dense, self.topo.revision())
        cached = self.cache.get(key)
        if cached is not None:
            cached.took_ms = (time.perf_counter() - t0) * 1000
            self.metrics.child(self.metrics.query_latency, "cached").observe(time.perf_counter() - t0)
            return cached
        shards = self.topo.shards
        run = QueryRun(key[-1], t0 + self.deadline_s, {s.position: None for s in shards})
        merged, tree = await self._ranked(resolved, req, dense or "", run)
        merged = self.snippets.add(merged, tree, req.snippet_chars)
        result = SearchResponse(merged, len(shards), len(shards) - len(run.failed), run.failed)
        result.took_ms = (time.perf_counter() - t0) * 1000
        if result.partial:
            self.metrics.partial.inc()
        else:
            self.cache.put(key, result)
        self.metrics.child(self.metrics.query_latency, "partial" if result.partial else "complete").observe(
            time.perf_counter() - t0
        )
        return result

    async def _ranked(
        self, resolved: ResolvedQuery, req: SearchRequest, text: str, run: QueryRun
    ) -> tuple[list[Hit], Tree | None]:
        """The merged hits of the request's mode, and the tree their snippets mark."""
        if req.mode is RetrievalMode.LEXICAL:
            return await self._lexical(resolved, req, req.top_k, run)
        if self.embedder is None:
            raise SearchError(
                SearchErrorKind.INVALID_REQUEST,
                f"mode {req.mode.value!r} needs vectors, and this service has none (search.toml: vectors = false)",
            )
        if req.mode is RetrievalMode.DENSE:
            return await self._dense(req, text, req.top_k, run), resolved.tree
        h = req.hybrid or HybridOptions()
        (lexical, tree), dense = await asyncio.gather(
            self._lexical(resolved, req, h.window, run), self._dense(req, text, h.window, run)
        )
        return fuse(lexical, dense, req.top_k, h.fusion, h.rrf_k, h.dense_weight), tree

    async def _dense(self, req: SearchRequest, text: str, top_k: int, run: QueryRun) -> list[Hit]:
        """The top_k by cosine with `text`'s vector across the shards: one round, no statistics
        (a cosine is the same on any shard); exact shards merge into one index's answer."""
        assert self.embedder is not None
        if not text or top_k == 0:
            return []
        request = ShardSearchRequest(
            None, top_k, filter=req.filter, vector=self.embedder.query(text), exact=self.vector_search.exact
        )
        answers = await self.fan_out.round(run.live(self.topo.shards), request, run.deadline, run)
        return merge([a.hits for _, a in answers if isinstance(a, ShardSearchAnswer)], top_k)

    async def _lexical(
        self, resolved: ResolvedQuery, req: SearchRequest, top_k: int, run: QueryRun
    ) -> tuple[list[Hit], Tree | None]:
        """The rounds: (expansion or statistics or one-round search) → search → merge; and the
        tree searched (wildcards expanded)."""
        shards = self.topo.shards
        tree, glob = resolved.tree, None
        exact = self.stats_mode is StatsMode.GLOBAL and len(shards) > 1  # one shard's own statistics are global
        if (
            tree is not None
            and not resolved.wildcards
            and top_k > 0
            and not self.pruned  # Xapian prunes a union worse than one index (ranking.py)
            and (exact or len(shards) == 1)
        ):
            # every shard read in this process: one search of their union, whose own statistics
            # are the global ones (LocalReads.union_top); None when not, or a reader cannot answer
            union = self.fan_out.local_union(shards, ShardSearchRequest(tree, top_k, filter=req.filter))
            if union is not None:
                return union, tree
        if tree is not None and resolved.wildcards:
            tree, glob = await self.rounds.expand(run.live(shards), resolved, run, exact)
        elif tree is not None and exact and self.fan_out.all_local(shards):
            # every shard read in this process, but the union could not answer: the statistics
            # round reads the others (FanOut.local_stats), cheaper than the one-round search's
            # parts, corrections and second rounds (docs/SEARCH.md)
            glob = await self.rounds.global_stats(shards, terms_of(tree), run)
        elif tree is not None and exact:
            terms = terms_of(tree)
            got = await self.rounds.one_round_search(shards, tree, terms, req, top_k, run)
            if isinstance(got, list):
                return got, tree
            glob = got if got is not None else await self.rounds.global_stats(run.live(shards), terms, run)
        if tree is None or top_k == 0:
            return [], tree  # matches nothing: no shard needs asking
        live, request = run.live(shards), ShardSearchRequest(tree, top_k, glob, filter=req.filter, pruned=self.pruned)
        local = self.fan_out.local_top(live, request)  # every shard in this process: query then fetch
        if local is not None:
            return local, tree
        answers = await self.fan_out.round(live, request, run.deadline, run, prefer_chosen=True)
        return merge([a.hits for _, a in answers if isinstance(a, ShardSearchAnswer)], top_k), tree
