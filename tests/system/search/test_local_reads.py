"""local_reads (the embedded default): the router answers queries from its local replicas'
indexes in its own process. The answers equal those of a router that asks the replica
processes over HTTP (ids, scores, snippets, dense too); every acknowledged write is seen by the
next query; a stopped replica process does not stop the answers."""

from __future__ import annotations

import os
import signal

import httpx

from tests import corpus
from tests.system.search.cluster import ingest, search, start_router, status

HTTP_CONFIG = '[search]\nlocal_reads = false\n[[shards]]\nname = "s0"\n[[shards]]\nname = "s1"\n'


def test_local_reads_answer_as_the_replicas_do_and_see_every_acknowledged_write(tmp_path):
    docs = corpus.documents(400)
    local = start_router(tmp_path, None, "local")  # the embedded default
    remote = start_router(tmp_path, HTTP_CONFIG, "remote")
    try:
        for r in (local, remote):
            ingest(r.url, docs)
        queries = corpus.queries(docs, 60, seed=8)
        for q in queries:
            a, b = search(local.url, q).json(), search(remote.url, q).json()
            assert a["hits"] == b["hits"], q
        for q in queries[:10]:
            body = {"query": q, "mode": "hybrid", "top_k": 5}
            a = httpx.post(local.url + "/v1/search", json=body, timeout=60).json()
            b = httpx.post(remote.url + "/v1/search", json=body, timeout=60).json()
            assert a["hits"] == b["hits"], q
        st = status(local.url)
        assert st["local_reads"]["answered"] >= 120 and st["local_reads"]["fell_back"] == 0, st["local_reads"]
        assert "local_reads" not in status(remote.url)
        # new terms: the remote router saves a round trip with the one-round search; the local one
        # has none to save and asks its readers for the statistics (searcher.py), with equal answers
        assert st["cache"]["one_round"] == {"answered": 0, "second_round": 0}, st["cache"]
        assert status(remote.url)["cache"]["one_round"]["answered"] >= 1
        for i in range(20):  # read-your-writes: each write acknowledged, then found at once
            word = f"zqxword{i}"
            r = httpx.post(
                local.url + "/v1/search/documents", content=f'{{"id": "new{i}", "body": "{word}"}}', timeout=60
            )
            assert r.status_code == 200, r.text
            assert [h["id"] for h in search(local.url, word).json()["hits"]] == [f"new{i}"]
            assert httpx.delete(local.url + f"/v1/search/documents/new{i}", timeout=60).status_code == 200
            assert search(local.url, word).json()["hits"] == []
        pids = status(local.url)["local_pids"]
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)  # the replica processes stalled: the indexes are still readable
        try:
            got = search(local.url, queries[0] + " extra").json()
            assert not got["partial"] and got["shards_answered"] == 2
        finally:
            for pid in pids.values():
                os.kill(pid, signal.SIGCONT)
    finally:
        local.stop()
        remote.stop()
