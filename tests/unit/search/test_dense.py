"""Dense retrieval's parts: the embedding model loads from its package with the network off,
the vector index (exact ties ordered by id, removal, filters, approximate recall), fusion, and
a shard index's vectors surviving a reopen (they live in its Xapian values)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sluice.search.dense import vectors
from sluice.search.dense.vector_index import VectorIndex
from sluice.search.index.hits import Hit
from sluice.search.index.shard_index import ShardIndex
from sluice.search.retrieval import Fusion
from sluice.search.router.query.fusion import fuse


def test_the_embedder_loads_from_its_package_with_no_network():
    """Every socket connection refused in the child: WordLlama must not try to download."""
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise OSError("network is off")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from sluice.search.dense.embedder import Embedder
        e = Embedder()
        v = e.embed(["a tool to manage python packages", "package manager for python", "the weather in paris"])
        print(round(float(v[0] @ v[1]), 2), round(float(v[0] @ v[2]), 2), v.shape)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    close, far, shape = out.stdout.split(" ", 2)
    assert float(close) > 0.6 and float(far) < 0.3 and shape.strip() == "(3, 256)"


def _unit(rng, n):
    v = rng.standard_normal((n, vectors.DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_exact_search_returns_every_tie_of_the_kth_and_removal_keeps_the_rest():
    rng = np.random.default_rng(1)
    vs = _unit(rng, 50)
    ix = VectorIndex()
    for i, v in enumerate(vs):
        ix.add(i + 1, v)
    for dup in range(100, 108):  # eight copies of one vector: tied scores
        ix.add(dup, vs[0])
    got = ix.search(vs[0], 3, exact=True)
    assert {k for k, _ in got} >= {1, *range(100, 108)} and len(got) >= 9  # all nine tied at the top
    ix.remove(1)
    ix.remove(104)
    got = ix.search(vs[0], 3, exact=True)
    assert {k for k, s in got if s > 0.999} == {100, 101, 102, 103, 105, 106, 107}
    assert len(ix) == 56 and ix.vector(1) is None
    assert [k for k, _ in ix.search(vs[5], 1, exact=True, allowed={6, 7})] == [6]


def test_approximate_search_finds_what_exact_finds():
    rng = np.random.default_rng(2)
    vs = _unit(rng, 3000)
    ix = VectorIndex()
    for i, v in enumerate(vs):
        ix.add(i, v)
    queries = _unit(rng, 50)
    recall = np.mean(
        [
            len({k for k, _ in ix.search(q, 10, exact=False)} & {k for k, _ in ix.search(q, 10, exact=True)}) / 10
            for q in queries
        ]
    )
    assert recall >= 0.9, recall  # random vectors are HNSW's hard case; bench/ measures real text


def test_fusion_rrf_and_weighted():
    lex = [Hit("a", 9.0, {}), Hit("b", 5.0, {}), Hit("c", 1.0, {})]
    dense = [Hit("c", 0.9, {}), Hit("d", 0.8, {}), Hit("a", 0.1, {})]
    rrf = fuse(lex, dense, 10)
    assert [h.doc_id for h in rrf] == ["a", "c", "b", "d"]
    assert rrf[0].score == pytest.approx(1 / 61 + 1 / 63)
    weighted = fuse(lex, dense, 10, Fusion.WEIGHTED, dense_weight=0.5)
    assert [h.doc_id for h in weighted][:2] == ["a", "c"] and weighted[0].score == pytest.approx(0.5)
    only_dense = fuse(lex, dense, 2, dense_weight=1.0)
    assert [h.doc_id for h in only_dense] == ["c", "d"]


def test_a_shard_index_keeps_its_vectors_in_the_database(tmp_path):
    rng = np.random.default_rng(3)
    vs = _unit(rng, 20)
    ix = ShardIndex(tmp_path / "ix")
    ix.apply(
        1,
        [
            {"op": "upsert", "id": f"d{i}", "fields": {"body": f"doc {i}", "n": i % 2}, "vector": vectors.encode(v)}
            for i, v in enumerate(vs)
        ],
    )
    ix.apply(2, [{"op": "delete", "id": "d3"}, {"op": "upsert", "id": "d4", "fields": {"body": "no vector now"}}])
    want = [(h.doc_id, h.score) for h in ix.dense_search(vs[3], 5)]
    assert "d3" not in dict(want) and "d4" not in dict(want) and len(want) == 5
    ix.close()
    again = ShardIndex(tmp_path / "ix")
    assert [(h.doc_id, h.score) for h in again.dense_search(vs[3], 5)] == want
    filtered = again.dense_search(vs[3], 5, clauses=[["in", "n", ["n1"]]])
    assert filtered and all(int(h.doc_id[1:]) % 2 == 1 for h in filtered)


def test_a_memory_replica_rebuilds_its_vectors_from_its_snapshot_and_log(tmp_path):
    from sluice.search.shard.replica import Replica

    rng = np.random.default_rng(4)
    vs = _unit(rng, 30)
    ops = [
        {"op": "upsert", "id": f"d{i}", "fields": {"body": f"doc {i}"}, "vector": vectors.encode(v)}
        for i, v in enumerate(vs)
    ]
    r = Replica(tmp_path / "r", fsync=False, memory=True)
    r.append(1, ops[:20])
    r.append(2, ops[20:25])
    assert r.compact(2) == 2  # the index is written to a snapshot on disk, the log dropped
    r.append(3, ops[25:])
    want = [(h.doc_id, h.score) for h in r.index.dense_search(vs[7], 5)]
    r.log.close()
    again = Replica(tmp_path / "r", fsync=False, memory=True)  # snapshot + the log after it
    assert again.status()["vector_count"] == 30
    assert [(h.doc_id, h.score) for h in again.index.dense_search(vs[7], 5)] == want


def test_the_time_of_the_last_applied_write_survives_a_reopen(tmp_path):
    ix = ShardIndex(tmp_path / "ix")
    assert ix.applied_ts == 0.0
    ix.apply(1, [{"op": "upsert", "id": "a", "fields": {"body": "x"}}], ts=1_700_000_000.25)
    ix.close()
    assert ShardIndex(tmp_path / "ix").applied_ts == 1_700_000_000.25
