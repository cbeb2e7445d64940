"""Hot shards through real processes: content sharding plus a skewed query mix loads one shard;
the router adds a replica to it (copied from a peer's index), the replica serves, and it is
removed once the load stops — with no failed or partial query, and nothing added to the cool
shard.

Deterministic load, not machine speed: every shard process spends a simulated 150 µs per
matching document inside its index lock (SLUICE_SEARCH_SIMULATED_COST_US, as a far larger shard
would), and every query matches all 300 documents of shard `hot` but only a few of `cool`'s.
Four closed-loop clients then keep `hot` ~100 % busy (~45 ms of index time per query) whatever
the machine's speed, while `cool` stays near 0 % — a slower machine only lowers the query rate,
which lowers `cool`'s figure further. Waits are bounded and generous.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from tests import corpus
from tests.system.search.cluster import HTTP, ingest, query_load, search, start_router, status, wait_for

CONFIG = """[search]
sharding = "content"
content_field = "section"
shard_deadline_ms = 2000
cache_entries = 0
hot_shards = true
hot_interval_s = 0.5
hot_at = 0.5
cool_at = 0.1
hot_for = 2
cool_for = 4
hot_max_added = 1
[[shards]]
name = "hot"
replicas = ["local"]
values = ["trending"]
[[shards]]
name = "cool"
replicas = ["local"]
default = true
"""


def _docs() -> list[dict]:
    docs = corpus.documents(400)
    for i, d in enumerate(docs):
        if i < 300:  # the hot section: every one of them matches every query below
            d["section"], d["body"] = "trending", f"{d['body']} buzzword"
        else:
            d["section"] = "other"
    return docs


def _shard(url: str, name: str) -> dict:
    return next(s for s in status(url)["shards"] if s["name"] == name)


def _served_by(url: str, replica: str) -> int:
    m = re.search(
        rf'sluice_search_replica_request_seconds_count\{{phase="search",replica="{re.escape(replica)}",'
        rf'shard="hot"\}} (\S+)',
        HTTP.get(url + "/metrics").text,
    )
    return int(float(m.group(1))) if m else 0


def test_a_hot_shard_gets_a_warm_replica_that_serves_and_leaves_when_cool(tmp_path: Path):
    router = start_router(tmp_path, CONFIG, env={"SLUICE_SEARCH_SIMULATED_COST_US": "150"})
    results: list = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        docs = _docs()
        ingest(router.url, docs)
        queries = [f"buzzword {q}" for q in corpus.queries(docs, 100)]  # skewed: all of them hit `hot`
        threads = [
            threading.Thread(target=query_load, args=(router.url, queries[k::4], results, stop)) for k in range(4)
        ]
        for t in threads:
            t.start()
        wait_for(lambda: len(_shard(router.url, "hot")["replicas"]) == 2, 120, "a replica added to the hot shard")
        added = _shard(router.url, "hot")["replicas"][1]
        assert added["added"]
        wait_for(lambda: _shard(router.url, "hot")["replicas"][1]["serving"], 120, "the added replica to serve")
        shard_status = HTTP.get(added["url"] + "/v1/shard/status").json()
        assert shard_status["snapshots_installed"] == 1  # warm: a copy of the peer's index, not its log replayed
        assert shard_status["doc_count"] == 300
        wait_for(lambda: _served_by(router.url, added["name"]) >= 2, 120, "queries answered by the added replica")
        stop.set()
        for t in threads:
            t.join(60)
        st = status(router.url)
        assert st["hot_shards"]["cool"]["added"] == 0 and len(_shard(router.url, "cool")["replicas"]) == 1
        wait_for(lambda: len(_shard(router.url, "hot")["replicas"]) == 1, 120, "the added replica to be removed")
        wait_for(lambda: added["name"] not in status(router.url).get("local_pids", {}), 60, "its process to stop")
        assert not (tmp_path / "router-data" / "hot" / "replica-1").exists()  # its data is deleted
        assert len(results) > 20
        assert all(code == 200 and partial is False for code, partial in results), [
            r for r in results if r != (200, False)
        ][:5]
        assert search(router.url, "buzzword").json()["shards_answered"] == 2
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        router.stop()
