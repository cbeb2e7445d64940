"""One search across the shards: resolve → (phase 1: statistics) → phase 2: top-k → merge.

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

import asyncio
import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

from sluice.search.errors import QuerySyntaxError
from sluice.search.index.analyzer import Analyzer
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.hits import Hit, merge
from sluice.search.index.query_tree import (ResolvedQuery, Tree, cache_key, resolve_query, scored_leaves, terms_of,
                                            wildcards_of)
from sluice.search.router.config import StatsMode
from sluice.search.router.replica_state import ReplicaState
from sluice.search.router.global_stats.one_round import ShardAnswer, exact_top_k
from sluice.search.router.result_cache import ResultCache
from sluice.search.router.search_metrics import SearchMetrics
from sluice.search.router.shard_client import Failure, ShardCallError, ShardClient
from sluice.search.router.global_stats.stats_cache import StatsCache
from sluice.search.router.global_stats import wildcards
from sluice.search.tiers.cold_tier import ColdTier
from sluice.search.router.topology import ShardRuntime, Topology


TREES_KEPT = 10_000
FOLLOWED_SHARE = 0.5  # of the time left, what a round that another round follows may spend


@dataclasses.dataclass(slots=True)
class _Run:
    """One query's state across its rounds."""

    revision: tuple[int, ...]
    deadline: float  # time.perf_counter() by which the last round must be done
    chosen: dict[int, ReplicaState | None]  # shard position → the replica that answered its first round
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # shard name → why

    def followed_deadline(self) -> float:
        """The deadline of a round that another follows: half of the time left."""
        now = time.perf_counter()
        return now + max(0.0, self.deadline - now) * FOLLOWED_SHARE


@dataclasses.dataclass(slots=True)
class SearchResult:
    hits: list[Hit]
    shards: int
    shards_answered: int
    failed: dict[str, str]  # shard name → why (timeout, unavailable)
    took_ms: float = 0.0
    cached: bool = False

    @property
    def partial(self) -> bool:
        return self.shards_answered < self.shards

    def to_json(self) -> dict[str, Any]:
        return {"hits": [h.to_json() for h in self.hits], "shards": self.shards, "shards_answered": self.shards_answered,
                "partial": self.partial, "failed_shards": self.failed, "took_ms": round(self.took_ms, 3),
                "cached": self.cached}


class Searcher:
    def __init__(self, topo: Topology, client: ShardClient, metrics: SearchMetrics, cache: ResultCache,
                 analyzer: Analyzer, stats_mode: StatsMode, deadline_s: float, cold: ColdTier | None = None):
        self.topo, self.client, self.metrics, self.cache = topo, client, metrics, cache
        self.analyzer = analyzer
        self.stats_mode = stats_mode
        self.deadline_s = deadline_s
        self.stats_cache = StatsCache()
        self._trees: dict[str, Any] = {}  # query text → its resolved tree (parsing costs ~40 µs)
        self.one_round = {"answered": 0, "second_round": 0}  # global_stats/one_round.py's outcomes
        self.cold = cold

    def _resolved(self, query: str) -> ResolvedQuery:
        resolved = self._trees.get(query)
        if resolved is None:
            try:
                resolved = resolve_query(query, self.analyzer)
            except QuerySyntaxError:
                self.metrics.errors.labels(Failure.BAD_QUERY.value).inc()
                raise
            if len(self._trees) >= TREES_KEPT:
                self._trees.clear()
            self._trees[query] = resolved
        return resolved

    async def search(self, query: str, top_k: int) -> SearchResult:
        t0 = time.perf_counter()
        resolved = self._resolved(query)
        key = (cache_key(resolved.tree), top_k, self.topo.revision())
        cached = self.cache.get(key)
        self.metrics.child(self.metrics.cache, "hit" if cached is not None else "miss").inc()
        self.metrics.cache_hit_ratio.set(self.cache.hit_ratio)
        if cached is not None:
            res = dataclasses.replace(cached, cached=True, took_ms=(time.perf_counter() - t0) * 1000)
            self.metrics.child(self.metrics.query_latency, "cached").observe(time.perf_counter() - t0)
            return res
        shards = self.topo.shards
        run = _Run(key[2], t0 + self.deadline_s, {s.position: None for s in shards})
        merged = await self._hits(resolved, top_k, run)
        result = SearchResult(merged, len(shards), len(shards) - len(run.failed), run.failed)
        result.took_ms = (time.perf_counter() - t0) * 1000
        if result.partial:
            self.metrics.partial.inc()
        else:
            self.cache.put(key, result)
        self.metrics.child(self.metrics.query_latency, "partial" if result.partial else "complete").observe(time.perf_counter() - t0)
        return result

    async def _hits(self, resolved: ResolvedQuery, top_k: int, run: _Run) -> list[Hit]:
        """The rounds: (expansion or statistics or one-round search) → search → merge."""
        shards = self.topo.shards
        tree, glob = resolved.tree, None
        exact = self.stats_mode is StatsMode.GLOBAL and len(shards) > 1  # one shard's own statistics are global
        if tree is not None and resolved.wildcards:
            tree, glob = await self._expand(resolved, run, exact)
        elif tree is not None and exact:
            merged = await self._one_round(shards, tree, top_k, run)
            if merged is not None:
                return merged
            glob = await self._global_stats(self._live(run), terms_of(tree), run)
        if tree is None or top_k == 0:
            return []  # matches nothing: no shard needs asking
        live = self._live(run)
        payload = {"tree": tree, "top_k": top_k, "stats": None if glob is None else glob.to_json()}
        answers = await asyncio.gather(*(self._one(s, "/v1/shard/search", payload, run.deadline, "search",
                                                   run.chosen[s.position]) for s in live), return_exceptions=True)
        per_shard: list[list[Hit]] = []
        for s, a in _answered(live, answers, run.failed):
            per_shard.append([Hit.from_json(h) for h in a[1]["hits"]])
            _note_index_time(s, a[1])
        return merge(per_shard, top_k)

    def _live(self, run: _Run) -> list[ShardRuntime]:
        return [s for s in self.topo.shards if s.name not in run.failed]

    async def _expand(self, resolved: ResolvedQuery, run: _Run, exact: bool) -> tuple[Tree | None, CollectionStats | None]:
        """The wildcard expansion round (global_stats/wildcards.py): every live shard's terms
        for each prefix — and, for exact scores, its statistics — then the tree with the union
        in place of each wildcard, and the global statistics of every term it now has."""
        prefixes = wildcards_of(resolved.tree)
        live = self._live(run)
        payload = {"terms": terms_of(resolved.tree) if exact else [], "prefixes": prefixes}
        deadline = run.followed_deadline()
        answers = await asyncio.gather(*(self._one(s, "/v1/shard/stats", payload, deadline, "stats", None)
                                         for s in live), return_exceptions=True)
        got: list[tuple[ShardRuntime, dict[str, Any], wildcards.Expansions]] = []
        for s, (replica, data) in _answered(live, answers, run.failed):
            run.chosen[s.position] = replica
            try:
                got.append((s, data, wildcards.shard_expansions(data, prefixes)))
            except ValueError:
                run.failed[s.name] = Failure.UNAVAILABLE.value  # a malformed answer: leave that shard out
        terms = wildcards.union([exp for _, _, exp in got], resolved)
        tree = wildcards.expanded_tree(resolved, terms)
        if not exact:
            return tree, None
        glob = CollectionStats()
        for s, data, exp in got:
            st = wildcards.with_expanded_freqs(CollectionStats.from_json(data), exp, terms)
            seq = data.get("applied_seq")
            self.stats_cache.store(s.position, run.revision[s.position], seq if isinstance(seq, int) else -1, st)
            glob.add(st)
        return tree, glob

    async def _one_round(self, shards: Sequence[ShardRuntime], tree: Tree, top_k: int, run: _Run) -> list[Hit] | None:
        """The exact top_k in one round trip although some terms' statistics are new
        (one_round.py), or None: then phase 1 (for what is still unknown) and phase 2. Tried
        when every shard's counts are known at its entry and some term's frequency is not.
        A round another may follow: half of the time left (a shard that misses it is left out
        of both, and the second round scores the others with their own statistics)."""
        revision, chosen, failed = run.revision, run.chosen, run.failed
        scored = scored_leaves(tree)
        if top_k == 0 or scored is None or any(s.cold_url is not None for s in shards):
            return None
        terms = terms_of(tree)
        known: dict[int, CollectionStats] = {}
        unknown: set[str] = set()
        for s in shards:
            k, u = self.stats_cache.lookup(s.position, revision[s.position], terms, count=False)
            if k is None:
                return None  # this shard's entry moved: its counts are new too
            known[s.position] = k
            unknown.update(u)
        if not unknown:
            return None  # every statistic is known: phase 2 alone is exact
        ks = known.values()
        glob = CollectionStats(sum(k.doc_count for k in ks), sum(k.total_length for k in ks),
                               {t: sum(k.term_freqs[t] for k in ks) for t in terms if t not in unknown})
        payload = {"tree": tree, "top_k": top_k, "stats": glob.to_json(), "unknown": sorted(unknown)}
        deadline = run.followed_deadline()
        answers = await asyncio.gather(*(self._one(s, "/v1/shard/search", payload, deadline, "search", None)
                                         for s in shards), return_exceptions=True)
        got: list[ShardAnswer] = []
        for s, (replica, data) in _answered(shards, answers, failed):
            chosen[s.position] = replica
            _note_index_time(s, data)
            k = known[s.position]
            try:
                if data.get("applied_seq") != revision[s.position]:
                    raise ValueError("the shard's entry moved")
                freqs = CollectionStats.from_json({"doc_count": k.doc_count, "total_length": k.total_length,
                                                   "term_freqs": data["term_freqs"]})
                if not unknown <= freqs.term_freqs.keys():
                    raise ValueError("a frequency missing")
                hits, parts = [Hit.from_json(h) for h in data["hits"]], list(data["parts"])
                if len(parts) != len(hits) or not all(isinstance(p, dict) for p in parts):
                    raise ValueError("parts do not match the hits")
                got.append(ShardAnswer(hits, parts, freqs.term_freqs, k.doc_count))
            except (KeyError, TypeError, ValueError):
                continue  # not usable: the second round will ask again
            self.stats_cache.store(s.position, revision[s.position], revision[s.position], freqs)
        merged = None
        if not failed and len(got) == len(shards):
            try:
                merged = exact_top_k(got, glob.doc_count, top_k, [t for t, n in scored.items() if n])
            except (KeyError, TypeError, ValueError):
                merged = None
        self.one_round["answered" if merged is not None else "second_round"] += 1
        return merged

    async def _global_stats(self, shards: Sequence[ShardRuntime], terms: list[str], run: _Run) -> CollectionStats:
        """Phase 1: the sum of every shard's statistics for `terms`, asking only the shards whose
        statistics the cache lacks, and only for what it lacks (stats_cache.py). Half of the
        time left: a shard that misses it is left out of the sum and of phase 2."""
        revision, chosen, failed = run.revision, run.chosen, run.failed
        glob = CollectionStats()
        ask: list[tuple[ShardRuntime, CollectionStats | None, list[str]]] = []
        for s in shards:
            known, unknown = self.stats_cache.lookup(s.position, revision[s.position], terms)
            if known is not None and not unknown:
                glob.add(known)
            else:
                ask.append((s, known, unknown))
        if not ask:
            return glob
        asked = [s for s, _, _ in ask]
        deadline = run.followed_deadline()
        answers = await asyncio.gather(*(self._one(s, "/v1/shard/stats", {"terms": unknown}, deadline, "stats", None)
                                         for s, _, unknown in ask), return_exceptions=True)
        known_of = {s.position: known for s, known, _ in ask}
        for s, (replica, data) in _answered(asked, answers, failed):
            chosen[s.position] = replica
            got = CollectionStats.from_json(data)
            seq = data.get("applied_seq")
            self.stats_cache.store(s.position, revision[s.position], seq if isinstance(seq, int) else -1, got)
            known = known_of[s.position]
            if known is not None:  # the rest of this shard's terms came from the cache
                got.term_freqs = {**known.term_freqs, **got.term_freqs}
            glob.add(got)
        return glob

    async def _one(self, shard: ShardRuntime, path: str, payload: dict[str, Any], deadline: float, phase: str,
                   prefer: ReplicaState | None) -> tuple[ReplicaState, dict[str, Any]]:
        t0 = time.perf_counter()
        if shard.cold_url is not None and self.cold is not None:
            return await self._cold(shard, path, payload, deadline, phase)
        try:
            out = await self.client.call(shard, path, payload, deadline, phase, prefer)
        except ShardCallError as exc:
            if exc.failure is Failure.BAD_QUERY:
                self.metrics.errors.labels(exc.failure.value).inc()
                raise QuerySyntaxError(0, exc.message) from None
            self.metrics.errors.labels(exc.failure.value).inc()
            raise
        self.metrics.child(self.metrics.shard_latency, shard.name, phase).observe(time.perf_counter() - t0)
        return out

    async def _cold(self, shard: ShardRuntime, path: str, payload: dict[str, Any], deadline: float,
                    phase: str) -> tuple[None, dict[str, Any]]:
        """A cold shard answers from the router's cold tier; its first query fetches it (which may
        miss the deadline: the fetch goes on, the answer is partial, the next query is warm)."""
        t0 = time.perf_counter()
        task = asyncio.ensure_future(self.cold.call(shard.cold_url, path, payload))
        try:
            out = await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - t0))
        except asyncio.TimeoutError:
            self.metrics.errors.labels(Failure.TIMEOUT.value).inc()
            raise ShardCallError(shard.name, Failure.TIMEOUT, "cold shard not fetched within the deadline") from None
        except Exception as exc:  # the object store is down or the archive is missing
            self.metrics.errors.labels(Failure.UNAVAILABLE.value).inc()
            raise ShardCallError(shard.name, Failure.UNAVAILABLE, f"cold shard: {type(exc).__name__}: {exc}"[:300]) from None
        self.metrics.child(self.metrics.shard_latency, shard.name, phase).observe(time.perf_counter() - t0)
        return None, out


def _note_index_time(s: ShardRuntime, data: dict[str, Any]) -> None:
    if isinstance(data.get("index_s"), (int, float)):
        s.index_latency.add(float(data["index_s"]))
        s.index_busy_s += float(data["index_s"])  # the hot-shard signal (hot_shards.py)


def _answered(shards: Sequence[ShardRuntime], answers: Sequence[Any], failed: dict[str, str]) -> Iterator[tuple[ShardRuntime, Any]]:
    """Each shard with its answer, in order; a shard whose call failed (timeout, unavailable) is
    recorded in `failed` — the result says partial — and any other error is raised."""
    for s, a in zip(shards, answers):
        if isinstance(a, ShardCallError):
            failed[s.name] = a.failure.value
            continue
        if isinstance(a, BaseException):
            raise a
        yield s, a
