"""Write-log compaction through real processes: once both replicas of a shard applied the
entries, the router has their logs compacted; a replica down for longer than the logs keep
comes back by copying its peer's index, then the log after it; a replica restarts from its compacted
log with every document."""

from __future__ import annotations

from pathlib import Path

import httpx

from sluice.search import corpus
from tests.system.search.cluster import ingest, restart, search, start_router, start_shard, status, wait_for


def _shard_status(url: str) -> dict:
    return httpx.get(url + "/v1/shard/status", timeout=10).json()


def test_logs_are_compacted_and_a_replica_too_far_behind_copies_its_peer(tmp_path: Path):
    reps = [start_shard(tmp_path / f"r{i}") for i in range(2)]
    config = ('[search]\nshard_deadline_ms = 20000\nlog_compact_every = 5\nlog_keep_max = 20\n[[shards]]\nname = "s"\n'
              f'replicas = ["{reps[0].url[7:]}", "{reps[1].url[7:]}"]\n')
    router = start_router(tmp_path, config)
    try:
        docs = corpus.documents(600)
        ingest(router.url, docs[:300], batch=10)  # 30 entries
        wait_for(lambda: all(_shard_status(r.url)["log_base"] >= 25 for r in reps), 60, "both logs compacted")
        st = _shard_status(reps[0].url)
        assert st["logged_seq"] == 30 and st["doc_count"] == 300

        down = reps[1]
        down.kill9()
        behind = _shard_status(reps[0].url)["applied_seq"]
        ingest(router.url, docs[300:600], batch=10)  # 30 more: further behind than the logs keep (20)
        wait_for(lambda: _shard_status(reps[0].url)["log_base"] > behind, 60, "the peer to compact past it")
        reps[1] = restart(down)
        wait_for(lambda: _shard_status(reps[1].url)["applied_seq"] == 60, 60, "the replica to catch up")
        back = _shard_status(reps[1].url)
        assert back["snapshots_installed"] == 1 and back["doc_count"] == 600

        reps[0].kill9()  # restarts from its compacted log (its index + the entries after its base)
        reps[0] = restart(reps[0])
        assert _shard_status(reps[0].url)["doc_count"] == 600
        wait_for(lambda: all(r["up"] for r in status(router.url)["shards"][0]["replicas"]), 60, "both up")
        hits = search(router.url, corpus.queries(docs, 1)[0]).json()
        assert hits["partial"] is False and hits["hits"]
    finally:
        router.stop()
        for r in reps:
            r.stop()
