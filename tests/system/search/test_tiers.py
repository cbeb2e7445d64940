"""The cold tier through real processes: a real S3-compatible server (moto's server mode), an
archive made by `sluice search archive`, a router whose content-sharded config puts one shard in
object storage. The cold shard is fetched on its first query and merges exactly with the live
one; writes that would land on it are refused by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sluice.search.dense.embedder import Embedder, attach_vectors
from sluice.search.index.hits import merge
from sluice.search.index.query_syntax import dense_text
from sluice.search.index.query_tree import resolve
from sluice.search.index.shard_index import ShardIndex
from sluice.search.shard.replica import Replica
from tests import corpus
from tests.server_process import free_port
from tests.system.search.cluster import HTTP, ingest, search, start_router, status, wait_for

AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    server = Path(sys.executable).parent / "moto_server"
    p = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), 60, "moto_server")
        yield url
    finally:
        p.terminate()
        p.wait(20)


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/moto-api/", timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


COLD_CONFIG = """[search]
sharding = "content"
content_field = "year"
s3_endpoint = "{s3}"
shard_deadline_ms = 60000
[[shards]]
name = "live"
default = true
[[shards]]
name = "y2019"
replicas = []
archive = "s3://archive/y2019.tar.gz"
values = ["2019"]
"""


def _upserts(docs: list[dict], embedder: Embedder) -> list[dict]:
    """The documents as one write batch, their vectors attached as the router would at ingest."""
    ops = {0: [{"op": "upsert", "id": d["id"], "fields": {k: v for k, v in d.items() if k != "id"}} for d in docs]}
    attach_vectors(ops, embedder, ("title", "body"))
    return ops[0]


def _archive(s3: str, data: Path, docs: list[dict], embedder: Embedder) -> None:
    """The cold shard's index: built by a replica, archived by the CLI."""
    r = Replica(data, fsync=False)
    r.append(1, _upserts(docs, embedder))
    r.log.close()
    out = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "search", "archive", "--data", str(data)]
        + ["--to", "s3://archive/y2019.tar.gz", "--s3-endpoint", s3],
        env={**os.environ, **AWS},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def _assert_merges_exactly(
    url: str, docs: list[dict], old: list[dict], reference: ShardIndex, embedder: Embedder
) -> None:
    """Lexical and dense answers of the router (live + cold shard) equal one index over everything."""
    for q in corpus.queries(docs, 40):
        got = search(url, q).json()
        want = merge([reference.search(resolve(q, reference.analyzer), 10)], 10)
        assert [h["id"] for h in got["hits"]] == [h.doc_id for h in want], q
        for g, w in zip(got["hits"], want):
            assert g["score"] == pytest.approx(w.score, rel=1e-9, abs=0)
    cold_hits = 0
    for q in corpus.queries(docs, 20, seed=3):  # the archive carried the vectors: dense merges exactly too
        got = HTTP.post(url + "/v1/search", json={"query": q, "mode": "dense"}).json()
        want = reference.dense_search(embedder.query(dense_text(q)), 10)
        assert [h["id"] for h in got["hits"]] == [h.doc_id for h in want], q
        cold_hits += sum(h["id"] in {d["id"] for d in old} for h in got["hits"])
    assert cold_hits >= 20


def test_a_cold_shard_is_fetched_on_first_query_and_merges_exactly(s3, tmp_path, monkeypatch):
    for k, v in AWS.items():
        monkeypatch.setenv(k, v)
    import boto3

    boto3.client("s3", endpoint_url=s3, region_name="us-east-1").create_bucket(Bucket="archive")
    docs = corpus.documents(800)
    old, live = [dict(d, year="2019") for d in docs[:400]], [dict(d, year="2024") for d in docs[400:]]
    embedder = Embedder()
    _archive(s3, tmp_path / "old-replica", old, embedder)
    router = start_router(tmp_path, COLD_CONFIG.format(s3=s3), "tiers")
    try:
        ingest(router.url, live)
        assert status(router.url)["cold_tier"]["fetches"] == 0  # nothing fetched before a query
        # the first query starts the fetch and waits for it within its deadline (60 s, half of it
        # for the statistics round); on a machine busy enough to outlast that, the answer must say
        # so (partial, the live shard's hits) and the fetch go on to serve the next query
        first = HTTP.post(router.url + "/v1/search", json={"query": "library", "top_k": 10}, timeout=180).json()
        if first["partial"]:
            assert first["shards_answered"] == 1, first
            wait_for(lambda: status(router.url)["cold_tier"]["used_bytes"] > 0, 300, "the cold fetch")
            first = search(router.url, "library").json()
        assert not first["partial"] and first["shards_answered"] == 2, first
        cold = status(router.url)["cold_tier"]
        assert cold["fetches"] == 1 and cold["used_bytes"] > 0
        print(
            f"first query with a cold fetch: {first['took_ms']} ms (fetch {cold['first_query_fetch_s']}); "
            f"next: {search(router.url, 'library package').json()['took_ms']} ms"
        )
        reference = ShardIndex(None)
        reference.apply(1, _upserts(old + live, embedder))
        _assert_merges_exactly(router.url, docs, old, reference, embedder)
        assert status(router.url)["cold_tier"]["fetches"] == 1  # kept, not fetched again
        bad = HTTP.post(router.url + "/v1/search/documents", content=json.dumps(dict(docs[0], year="2019"))).json()
        assert bad["errors"] == [{"line": 1, "message": "shard y2019 is a read-only cold shard"}]
    finally:
        router.stop()
