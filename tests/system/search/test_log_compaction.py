"""Write-log compaction through real processes: once both replicas of a shard applied the
entries, the router has their logs compacted; a replica down for longer than the logs keep
comes back by copying its peer's index, then the log after it, with every document."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests import corpus
from tests.system.search.cluster import ingest, restart, search, start_router, start_shard, status, wait_for


def _shard_status(url: str) -> dict:
    return httpx.get(url + "/v1/shard/status", timeout=10).json()


def _log_entries(url: str) -> float:
    m = re.search(
        r'sluice_search_replica_log_entries\{replica="s/0",shard="s"\} (\S+)', httpx.get(url + "/metrics").text
    )
    return float(m.group(1)) if m else -1.0


def test_logs_are_compacted_and_a_replica_too_far_behind_copies_its_peer(tmp_path: Path):
    with ThreadPoolExecutor(2) as pool:  # both start at once (a process start is seconds here)
        reps = list(pool.map(lambda i: start_shard(tmp_path / f"r{i}"), range(2)))
    config = (
        '[search]\nshard_deadline_ms = 20000\nlog_compact_every = 4\nlog_keep_max = 8\n[[shards]]\nname = "s"\n'
        f'replicas = ["{reps[0].url[7:]}", "{reps[1].url[7:]}"]\n'
    )
    router = start_router(tmp_path, config)
    try:
        docs = corpus.documents(240)
        ingest(router.url, docs[:120], batch=10)  # 12 entries
        wait_for(lambda: all(_shard_status(r.url)["log_base"] >= 8 for r in reps), 60, "both logs compacted")
        st = _shard_status(reps[0].url)
        assert st["logged_seq"] == 12 and st["doc_count"] == 120 and st["vector_count"] == 120  # vectors in the log
        wait_for(lambda: 0 <= _log_entries(router.url) <= 4, 30, "the compacted log's size in the metrics")

        down = reps[1]
        down.kill9()
        behind = _shard_status(reps[0].url)["applied_seq"]
        ingest(router.url, docs[120:240], batch=10)  # 12 more: further behind than the logs keep (8)
        wait_for(lambda: _shard_status(reps[0].url)["log_base"] > behind, 60, "the peer to compact past it")
        reps[1] = restart(down)
        wait_for(lambda: _shard_status(reps[1].url)["applied_seq"] == 24, 60, "the replica to catch up")
        back = _shard_status(reps[1].url)
        # the peer's index snapshot and the log after it carried every document's vector
        assert back["snapshots_installed"] == 1 and back["doc_count"] == 240 and back["vector_count"] == 240
        # (a restart from a compacted log: tests/unit/search/test_log_compaction.py)
        wait_for(lambda: all(r["up"] for r in status(router.url)["shards"][0]["replicas"]), 60, "both up")
        hits = search(router.url, corpus.queries(docs, 1)[0]).json()
        assert hits["partial"] is False and hits["hits"]
        q = {"query": docs[200]["title"], "mode": "dense", "top_k": 3}
        both = httpx.post(router.url + "/v1/search", json=q, timeout=30).json()["hits"]
        reps[0].stop()  # only the replica that copied its peer's snapshot is left
        wait_for(lambda: not status(router.url)["shards"][0]["replicas"][0]["up"], 60, "the peer marked down")
        alone = httpx.post(router.url + "/v1/search", json={**q, "top_k": 4}, timeout=30).json()
        assert not alone["partial"] and [h["id"] for h in alone["hits"]][:3] == [h["id"] for h in both]
        assert docs[200]["id"] in [h["id"] for h in both]
    finally:
        router.stop()
        for r in reps:
            r.stop()
