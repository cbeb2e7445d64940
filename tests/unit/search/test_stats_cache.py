"""The router's term-statistics cache (router/query/global_stats/stats_cache.py): per shard, per write-log entry,
per term, bounded; a write to one shard forgets only that shard's statistics."""

from __future__ import annotations

from sluice.search.index.bm25 import CollectionStats
from sluice.search.router.query.global_stats.stats_cache import StatsCache


def test_known_terms_answer_from_memory_and_only_unknown_terms_are_asked():
    c = StatsCache()
    assert c.lookup(0, 5, ["a", "b"]) == (None, ["a", "b"])  # nothing known yet: ask everything
    assert c.store(0, 5, 5, CollectionStats(10, 100, {"a": 3, "b": 1}))
    known, unknown = c.lookup(0, 5, ["a", "b"])
    assert unknown == [] and known == CollectionStats(10, 100, {"a": 3, "b": 1})
    known, unknown = c.lookup(0, 5, ["a", "z"])
    assert unknown == ["z"] and known == CollectionStats(10, 100, {"a": 3})
    assert (c.hits, c.misses) == (1, 2)


def test_a_write_to_one_shard_forgets_only_that_shards_statistics():
    c = StatsCache()
    c.store(0, 5, 5, CollectionStats(10, 100, {"a": 3}))
    c.store(1, 7, 7, CollectionStats(20, 300, {"a": 4}))
    # shard 0 applied entry 6 (a write): its statistics are asked again, whole; shard 1's stay
    assert c.lookup(0, 6, ["a"]) == (None, ["a"])
    assert c.lookup(1, 7, ["a"]) == (CollectionStats(20, 300, {"a": 4}), [])
    c.store(0, 6, 6, CollectionStats(11, 120, {"a": 5}))
    assert c.lookup(0, 6, ["a"]) == (CollectionStats(11, 120, {"a": 5}), [])
    # the old entry's term not asked again at the new entry is unknown, not stale
    c.store(0, 6, 6, CollectionStats(11, 120, {"b": 1}))
    assert c.lookup(0, 6, ["a", "b"])[1] == []


def test_a_lagging_replicas_answer_is_not_kept_as_the_heads():
    c = StatsCache()
    assert not c.store(0, 9, 8, CollectionStats(10, 100, {"a": 3}))  # replica at 8, head at 9
    assert c.lookup(0, 9, ["a"]) == (None, ["a"])


def test_each_shard_keeps_its_most_recently_used_terms():
    c = StatsCache(max_terms=3)
    c.store(0, 1, 1, CollectionStats(10, 100, {"a": 1, "b": 2, "c": 3}))
    c.lookup(0, 1, ["a"])  # a is used: b is now the oldest
    c.store(0, 1, 1, CollectionStats(10, 100, {"d": 4}))
    assert c.lookup(0, 1, ["a", "b", "c", "d"]) == (CollectionStats(10, 100, {"a": 1, "c": 3, "d": 4}), ["b"])
    assert len(c) == 3


def test_local_statistics_are_the_replicas_answers_and_a_reader_behind_falls_back(tmp_path):
    """With every shard read in the router's process the statistics round reads the readers
    directly (tiers/local_reads.py LocalReads.stats): the same statistics and entry as a
    replica's stats answer; a reader that cannot reach its shard's entry says so (None), and
    the round then asks the replicas."""
    from sluice.search.contract import StatsRequest
    from sluice.search.shard.replica import Replica
    from sluice.search.tiers.local_reads import LocalReads

    replicas = [Replica(tmp_path / f"r{i}", fsync=False) for i in range(2)]
    for i, r in enumerate(replicas):
        r.append(
            1, [{"op": "upsert", "id": f"{i}-{j}", "fields": {"body": "alpha beta " * (i + j + 1)}} for j in range(3)]
        )
    reads = LocalReads({i: tmp_path / f"r{i}" / "index" for i in range(2)}, None)
    terms = ["alpha", "gamma"]
    got = reads.stats([(0, 1, terms), (1, 1, ["beta"])])
    assert got == [
        (replicas[0].stats(StatsRequest(terms)).stats, 1),
        (replicas[1].stats(StatsRequest(["beta"])).stats, 1),
    ]
    assert got[0][0].term_freqs == {"alpha": 3, "gamma": 0} and reads.answered == 2
    assert reads.stats([(0, 1, terms), (1, 2, terms)]) is None  # shard 1's head is at entry 2, its index at 1
    assert reads.call(1, StatsRequest(terms), 2) is None  # a query's own round: the same fallback
    assert reads.fell_back == 2
    reads.close()
