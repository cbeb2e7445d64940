"""A stalled shard must not take the healthy shard's hits with it (issue 40): 2 shards × 1 local
replica, one replica SIGSTOPped, queries with words the router has never seen (so a statistics
round or a one-round search comes first). The answer holds the healthy shard's hits, flagged
partial, with the stalled shard named; once the router has marked the replica down the shard is
reported `unavailable` (not asked: no `timeout`); resumed, it answers again. Bounded waits only;
what is asserted is the content of the answers."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter

from sluice.search.router.cluster.topology import hash_shard
from tests import corpus
from tests.system.search.cluster import ingest, search, start_router, status, wait_for

# a generous deadline: on a busy machine the healthy shard must never miss its half
CONFIG = '[search]\nshard_deadline_ms = 10000\n[[shards]]\nname = "s0"\n[[shards]]\nname = "s1"\n'


def _words_on_both_shards(docs: list[dict], n: int) -> list[str]:
    """Words that documents on each shard hold, most frequent first (never queried before)."""
    on: dict[int, Counter[str]] = {0: Counter(), 1: Counter()}
    for d in docs:
        on[hash_shard(d["id"], 2)].update(set(re.findall(r"[a-z]{5,}", (d["title"] + " " + d["body"]).lower())))
    return [w for w, _ in (on[0] & on[1]).most_common(n)]


def _up(url: str, replica: str) -> bool:
    return next(r["up"] for s in status(url)["shards"] for r in s["replicas"] if r["name"] == replica)


def test_a_stalled_shard_leaves_the_healthy_shards_hits(tmp_path):
    docs = corpus.documents(400)
    router = start_router(tmp_path, CONFIG)
    stalled = None
    try:
        ingest(router.url, docs)
        words = _words_on_both_shards(docs, 6)
        assert len(words) == 6
        search(router.url, "warmup")  # the router now knows both shards' counts: new words take one round
        stalled = status(router.url)["local_pids"]["s1/0"]
        os.kill(stalled, signal.SIGSTOP)

        def healthy_hits(word: str, why: set[str]) -> None:
            body = search(router.url, word, top_k=20).json()
            assert body["partial"] is True and body["shards_answered"] == 1, body
            assert set(body["failed_shards"]) == {"s1"} and body["failed_shards"]["s1"] in why, body
            assert body["hits"] and all(hash_shard(h["id"], 2) == 0 for h in body["hits"]), body

        healthy_hits(words[0], {"timeout", "unavailable"})  # before the router noticed
        healthy_hits(f"{words[1]} {words[2]}", {"timeout", "unavailable"})
        wait_for(lambda: not _up(router.url, "s1/0"), 60, "the router to mark the stalled replica down")
        healthy_hits(words[3], {"unavailable"})  # known down: not asked, not waited for
        healthy_hits(f"+{words[4]} {words[5]}", {"unavailable"})
        os.kill(stalled, signal.SIGCONT)
        stalled = None
        wait_for(lambda: _up(router.url, "s1/0"), 60, "the resumed replica to be up")
        body = search(router.url, words[0], top_k=20).json()
        assert body["partial"] is False and {hash_shard(h["id"], 2) for h in body["hits"]} == {0, 1}, body
    finally:
        if stalled is not None:
            os.kill(stalled, signal.SIGCONT)
        router.stop()
