"""The rounds before the search: what gives the search round its global statistics.

- the statistics round (phase 1): each shard's counts and term frequencies, asked only of the
  shards, and only for the terms, the statistics cache lacks (stats_cache.py);
- the one-round search (one_round.py): the search itself, sent when only some terms'
  frequencies are new; exact from its answers, or followed by a second round;
- the wildcard expansion (wildcards.py): every shard's terms for each prefix, their union put
  in the tree, with their statistics.

Each may be followed by another round, so each spends at most half of the time left
(fan_out.QueryRun); a shard that misses it is left out of the rest of the query.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.search.contract import SearchRequest, ShardSearchAnswer, ShardSearchRequest, StatsAnswer, StatsRequest
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.hits import Hit
from sluice.search.index.query_tree import ResolvedQuery, Tree, scored_leaves, terms_of, wildcards_of
from sluice.search.router.cluster.topology import ShardRuntime
from sluice.search.router.query.fan_out import FanOut, QueryRun
from sluice.search.router.query.global_stats import wildcards
from sluice.search.router.query.global_stats.one_round import ShardAnswer, exact_top_k
from sluice.search.router.query.global_stats.stats_cache import StatsCache


class StatisticsRounds:
    def __init__(self, fan_out: FanOut, stats_cache: StatsCache):
        self.fan_out, self.stats_cache = fan_out, stats_cache
        self.pruned = False  # rankings by Xapian's early termination (search.toml ranking; index/ranking.py)
        self.one_round = {"answered": 0, "second_round": 0}  # one_round.py's outcomes (the status JSON)

    async def global_stats(self, shards: Sequence[ShardRuntime], terms: list[str], run: QueryRun) -> CollectionStats:
        """The sum of every shard's statistics for `terms`, asking only for what the cache lacks."""
        glob = CollectionStats()
        ask: dict[int, tuple[CollectionStats | None, list[str]]] = {}
        for s in shards:
            known, unknown = self.stats_cache.lookup(s.position, run.revision[s.position], terms)
            if known is not None and not unknown:
                glob.add(known)
            else:
                ask[s.position] = (known, unknown)
        if not ask:
            return glob
        asked = [s for s in shards if s.position in ask]
        answers = self.fan_out.local_stats(asked, lambda s: ask[s.position][1])
        if answers is None:
            answers = [
                (s, a.stats, a.applied_seq)
                for s, a in await self.fan_out.round(
                    asked, lambda s: StatsRequest(ask[s.position][1]), run.followed_deadline(), run
                )
                if isinstance(a, StatsAnswer)
            ]
        for s, got, applied_seq in answers:
            self.stats_cache.store(s.position, run.revision[s.position], applied_seq, got)
            known = ask[s.position][0]
            if known is not None:  # the rest of this shard's terms came from the cache
                got.term_freqs = {**known.term_freqs, **got.term_freqs}
            glob.add(got)
        return glob

    async def one_round_search(
        self,
        shards: Sequence[ShardRuntime],
        tree: Tree,
        terms: list[str],
        search: SearchRequest,
        top_k: int,
        run: QueryRun,
    ) -> list[Hit] | CollectionStats | None:
        """The exact top_k in one round trip although some terms' statistics are new, or None:
        then the statistics round (for what is still unknown) and the search. Tried when every
        shard's counts are known at its entry and some term's frequency is not; when every
        statistic of `terms` (the tree's) is known, their sums: global_stats's answer, without
        looking them up again (the search round alone is exact)."""
        scored = scored_leaves(tree)
        if top_k == 0 or scored is None or any(s.cold_url is not None for s in shards):
            return None
        known: dict[int, CollectionStats] = {}
        unknown: set[str] = set()
        for s in shards:
            k, u = self.stats_cache.lookup(s.position, run.revision[s.position], terms, count=False)
            if k is None:
                return None  # this shard's entry moved: its counts are new too
            known[s.position] = k
            unknown.update(u)
        if not unknown:
            self.stats_cache.hits += len(known)  # as global_stats's lookups would count them
            return _summed(known.values(), terms)
        glob = _summed(known.values(), [t for t in terms if t not in unknown])
        req = ShardSearchRequest(tree, top_k, glob, sorted(unknown), search.filter, pruned=self.pruned)
        got: list[ShardAnswer] = []
        for s, answer in await self.fan_out.round(shards, req, run.followed_deadline(), run):
            assert isinstance(answer, ShardSearchAnswer)
            k = known[s.position]
            freqs = answer.term_freqs
            if answer.applied_seq != run.revision[s.position] or freqs is None or not unknown <= freqs.keys():
                continue  # not usable (the entry moved, or an answer without parts): a second round asks again
            got.append(ShardAnswer(answer.hits, answer.parts or [], freqs, k.doc_count))
            self.stats_cache.store(
                s.position,
                run.revision[s.position],
                answer.applied_seq,
                CollectionStats(k.doc_count, k.total_length, dict(freqs)),
            )
        merged = None
        if not run.failed and len(got) == len(shards):
            try:
                merged = exact_top_k(got, glob.doc_count, top_k, [t for t, n in scored.items() if n])
            except (KeyError, TypeError, ValueError):
                merged = None
        self.one_round["answered" if merged is not None else "second_round"] += 1
        return merged

    async def expand(
        self, shards: Sequence[ShardRuntime], resolved: ResolvedQuery, run: QueryRun, exact: bool
    ) -> tuple[Tree | None, CollectionStats | None]:
        """The wildcard expansion round: the tree with each prefix's union of terms in its place,
        and (for exact scores) the global statistics of every term it now has."""
        req = StatsRequest(terms_of(resolved.tree) if exact else [], wildcards_of(resolved.tree))
        answers = await self.fan_out.round(shards, req, run.followed_deadline(), run)
        got = [a for _, a in answers if isinstance(a, StatsAnswer)]
        terms = wildcards.union([a.expansions for a in got], resolved)
        tree = wildcards.expanded_tree(resolved, terms)
        if not exact:
            return tree, None
        glob = CollectionStats()
        for s, answer in answers:
            assert isinstance(answer, StatsAnswer)
            st = wildcards.with_expanded_freqs(answer.stats, answer.expansions, terms)
            self.stats_cache.store(s.position, run.revision[s.position], answer.applied_seq, st)
            glob.add(st)
        return tree, glob


def _summed(shards: Iterable[CollectionStats], terms: Iterable[str]) -> CollectionStats:
    """The global statistics: each count and each of `terms`' frequencies (every shard knows
    them) summed over the shards — loops, not a generator per term (~5 µs a query less)."""
    doc_count = total_length = 0
    freqs = dict.fromkeys(terms, 0)
    for k in shards:
        doc_count += k.doc_count
        total_length += k.total_length
        tf = k.term_freqs
        for t in freqs:
            freqs[t] += tf[t]
    return CollectionStats(doc_count, total_length, freqs)
