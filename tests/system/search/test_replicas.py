"""Replicas through real processes: kill -9 and SIGSTOP during a query load cost no query;
acknowledged writes survive kill -9; a replica that was down catches up from its peer."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest

from tests import corpus
from tests.system.search.cluster import ingest, query_load, restart, start_router, start_shard, status, wait_for

N_DOCS = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replicas")
    shards = {name: [start_shard(tmp / name / f"r{i}") for i in range(2)] for name in ("a", "b")}
    config = "[search]\nshard_deadline_ms = 20000\nhedge = true\n" + "".join(
        f'[[shards]]\nname = "{name}"\nreplicas = {json.dumps([p.url.removeprefix("http://") for p in procs])}\n'
        for name, procs in shards.items()
    )
    router = start_router(tmp, config)
    docs = corpus.documents(N_DOCS + 400)
    ingest(router.url, docs[:N_DOCS])
    state = {"router": router, "shards": shards, "docs": docs, "queries": corpus.queries(docs, 300)}
    try:
        yield state
    finally:
        router.stop()
        for procs in state["shards"].values():
            for p in procs:
                p.stop()


def _replica(st, url):
    return next(r for s in st["shards"] for r in s["replicas"] if r["url"] == url)


def _shard_docs(url: str) -> int:
    return httpx.post(url + "/v1/shard/stats", json={"terms": []}, timeout=10).json()["doc_count"]


def _caught_up(cluster, shard: str) -> bool:
    st = status(cluster["router"].url)
    s = next(x for x in st["shards"] if x["name"] == shard)
    return all(r["up"] and r["applied_seq"] == s["head_seq"] for r in s["replicas"])


def _under_load(cluster, fault, n_after: int = 60):
    """Run 2 query loops; apply `fault` after 20 answers; stop n_after answers later."""
    results: list = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=query_load, args=(cluster["router"].url, cluster["queries"][k::2], results, stop))
        for k in range(2)
    ]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(results) >= 20, 120, "20 answers before the fault")
        fault()
        seen = len(results)
        wait_for(lambda: len(results) >= seen + n_after, 300, f"{n_after} answers after the fault")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    return results


def test_kill9_of_a_replica_under_load_fails_no_query(cluster):
    victim = cluster["shards"]["a"][0]
    results = _under_load(cluster, victim.kill9)
    assert all(code == 200 and partial is False for code, partial in results), [
        r for r in results if r != (200, False)
    ][:5]
    cluster["shards"]["a"][0] = restart(victim)
    wait_for(lambda: _caught_up(cluster, "a"), 60, "the restarted replica to be up and current")


def test_writes_while_a_replica_is_down_are_caught_up(cluster):
    down = cluster["shards"]["b"][1]
    peer = cluster["shards"]["b"][0]
    down.kill9()
    ingest(cluster["router"].url, cluster["docs"][N_DOCS : N_DOCS + 200])  # acknowledged by the peer alone
    cluster["shards"]["b"][1] = up = restart(down)
    wait_for(lambda: _caught_up(cluster, "b"), 60, "the restarted replica to catch up")
    assert _shard_docs(up.url) == _shard_docs(peer.url) > 0


def test_acknowledged_writes_survive_kill9_of_every_replica(cluster):
    wait_for(lambda: _caught_up(cluster, "a") and _caught_up(cluster, "b"), 60, "every replica up and current")
    held = sum(_shard_docs(procs[0].url) for procs in cluster["shards"].values())  # whatever ran before
    ingest(cluster["router"].url, cluster["docs"][N_DOCS + 200 : N_DOCS + 400])  # documents no other test writes
    before = {name: _shard_docs(procs[0].url) for name, procs in cluster["shards"].items()}
    for procs in cluster["shards"].values():
        for i, p in enumerate(procs):
            p.kill9()
            procs[i] = restart(p)  # replays its write log into the index
    for name, procs in cluster["shards"].items():
        assert [_shard_docs(p.url) for p in procs] == [before[name]] * 2
    assert sum(before.values()) == held + 200
    wait_for(lambda: _caught_up(cluster, "a") and _caught_up(cluster, "b"), 60, "the router to see them up")


def test_a_stopped_replica_is_avoided_and_comes_back(cluster):
    victim = cluster["shards"]["a"][1]
    try:
        results = _under_load(cluster, lambda: os.kill(victim.pid, signal.SIGSTOP))
        assert all(code == 200 and partial is False for code, partial in results), [
            r for r in results if r != (200, False)
        ][:5]
        wait_for(
            lambda: not _replica(status(cluster["router"].url), victim.url)["up"],
            60,
            "the router to mark the stopped replica down",
        )
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    wait_for(lambda: _caught_up(cluster, "a"), 60, "the resumed replica to be up again")
