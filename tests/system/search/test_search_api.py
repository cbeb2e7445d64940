"""The router's HTTP API through `sluice search serve` (the embedded default and a keyed config):
bulk errors by line, query syntax errors by position, bounds, deletes, keys, the result cache,
metrics, the OpenAPI document, and the supervisor restarting a killed local replica."""

from __future__ import annotations

import json
import os
import re
import signal

import httpx
import pytest

from sluice.search.index.snippets import visible_length
from tests.system.search.cluster import search, start_router, status, wait_for

DOCS = [
    {
        "id": "apt",
        "title": "commandline package manager",
        "body": "apt provides commandline tools for searching packages",
    },
    {"id": "dpkg", "title": "Debian package management system", "body": "dpkg installs, removes and manages packages"},
    {
        "id": "python3",
        "title": "interactive high-level object-oriented language",
        "body": "Python is a programming language",
    },
    {"id": "grep", "title": "GNU grep, egrep and fgrep", "body": "grep searches files for lines matching a pattern"},
]


def _bulk(url, text, **kw):
    return httpx.post(url + "/v1/search/documents", content=text, timeout=60, **kw)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """The embedded default holding DOCS: each test runs on them alone or after the others
    (a test that writes more, or deletes, puts back what it changed or writes its own)."""
    r = start_router(tmp_path_factory.mktemp("api"))
    try:
        assert _bulk(r.url, "\n".join(json.dumps(d) for d in DOCS)).json()["accepted"] == len(DOCS)
        yield r
    finally:
        r.stop()


def test_bulk_reports_bad_lines_by_number_and_keeps_the_rest(router):
    # DOCS again (upserts: the same four documents), with bad lines between them
    lines = [
        json.dumps(DOCS[0]),
        "{not json",
        json.dumps(DOCS[1]),
        "",
        json.dumps({"title": "no id"}),
        json.dumps({"id": "x", "Bad-Field": "y"}),
        json.dumps(DOCS[2]),
        json.dumps(DOCS[3]),
    ]
    r = _bulk(router.url, "\n".join(lines))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["accepted"] == 4
    assert [e["line"] for e in body["errors"]] == [2, 5, 6]
    hits = search(router.url, "package").json()["hits"]
    assert {h["id"] for h in hits} == {"apt", "dpkg"}
    assert hits[0]["fields"]["title"]


def test_search_answers_with_scores_shards_and_timing(router):
    body = search(router.url, "+package -debian").json()
    assert [h["id"] for h in body["hits"]] == ["apt"]
    assert body["shards"] == body["shards_answered"] == 2 and body["partial"] is False
    assert body["took_ms"] >= 0 and body["hits"][0]["score"] > 0
    assert [h["id"] for h in search(router.url, 'title:"commandline package"').json()["hits"]] == ["apt"]


@pytest.mark.parametrize("query,position", [("(python", 0), ('apt "package', 4), ("apt AND", 4), ("a)", 1)])
def test_query_syntax_errors_are_400_with_the_position(router, query, position):
    r = search(router.url, query)
    assert r.status_code == 400
    assert r.json()["error"]["position"] == position and "position" in r.json()["error"]["message"]


def test_bounds(router):
    assert search(router.url, "x" * 5000).status_code == 400
    assert search(router.url, "apt", top_k=100000).status_code == 400
    assert search(router.url, " ".join(f"w{i}" for i in range(100))).status_code == 400


def test_every_hit_carries_its_snippet_marked_escaped_and_bounded(router):
    r = _bulk(
        router.url,
        json.dumps(
            {
                "id": "html",
                "title": "markup",
                "body": "The packaged tools: <script> & tags manage packages well. " + "filler words " * 40,
            }
        ),
    )
    assert r.status_code == 200, r.text
    hits = {h["id"]: h for h in search(router.url, "package").json()["hits"]}
    assert set(hits) == {"apt", "dpkg", "html"} and all("<b>" in h["snippet"] for h in hits.values())
    snippet = hits["html"]["snippet"]
    assert "&lt;script&gt; &amp; tags" in snippet and "<b>packaged</b>" in snippet and "<b>packages</b>" in snippet
    short = HTTP_SEARCH(router.url, {"query": "package", "snippet_chars": 20})["hits"]
    assert short and all(0 < visible_length(h["snippet"]) <= 20 for h in short), short
    assert all(h["snippet"] == "" for h in HTTP_SEARCH(router.url, {"query": "package", "snippet_chars": 0})["hits"])
    for bad in (2001, -1, "300", 1.5):
        r = httpx.post(router.url + "/v1/search", json={"query": "package", "snippet_chars": bad}, timeout=30)
        assert r.status_code == 400 and "snippet_chars" in r.json()["error"]["message"], r.text
    assert httpx.delete(router.url + "/v1/search/documents/html", timeout=30).status_code == 200


def HTTP_SEARCH(url, body):
    r = httpx.post(url + "/v1/search", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_delete_and_the_cache_follow_writes(router):
    assert search(router.url, "(grep").status_code == 400  # a query syntax error of its own, for /metrics
    first = search(router.url, "grep").json()
    assert [h["id"] for h in first["hits"]] == ["grep"]
    again = search(router.url, "GREP").json()  # normalized: the same entry
    assert again["cached"] is True and again["hits"] == first["hits"]
    assert httpx.delete(router.url + "/v1/search/documents/grep", timeout=30).status_code == 200
    after = search(router.url, "grep").json()
    assert after["cached"] is False and after["hits"] == []
    metrics = httpx.get(router.url + "/metrics", timeout=10).text
    assert 'sluice_search_cache_requests_total{result="hit"}' in metrics
    for name in (
        "sluice_search_replica_request_seconds_bucket",
        "sluice_search_index_freshness_seconds",
        "sluice_search_cache_hit_ratio",
        "sluice_search_errors_total",
    ):
        assert name in metrics
    assert 'sluice_search_errors_total{type="query_syntax_error"}' in metrics
    assert _bulk(router.url, json.dumps(DOCS[3])).json()["accepted"] == 1  # back, for the tests after


def test_errors_latency_cache_and_freshness_are_on_metrics_status_and_page(router):
    """Every refusal is counted by its type (a 400 invalid_request_error too), each shard's p50
    and p99 and the time since its last applied write are in the status JSON, the histograms
    resolve a 2 ms shard, and the status page shows them and asks for no favicon."""
    # a write of its own: the index age needs one, and this test must not lean on the others'
    # having run before it (alone, it found no write and no index age on /metrics)
    fresh = {"id": "fresh", "title": "index age", "body": "a document this test writes"}
    assert _bulk(router.url, json.dumps(fresh)).json()["accepted"] == 1
    for k in range(1, 26):  # searches that reach every shard (distinct top_k: no cache hit), 20 make a quantile
        assert search(router.url, "searching tools", top_k=k).status_code == 200
    assert search(router.url, "searching tools", top_k=1).json()["cached"] is True  # a hit of its own
    before = status(router.url)["errors"].get("invalid_request_error", 0)
    assert search(router.url, "apt", top_k=101).status_code == 400
    assert httpx.post(router.url + "/v1/search", content=b"{", timeout=30).status_code == 400
    st = status(router.url)
    assert st["errors"]["invalid_request_error"] == before + 2
    metrics = httpx.get(router.url + "/metrics", timeout=10).text
    assert f'sluice_search_errors_total{{type="invalid_request_error"}} {before + 2}.0' in metrics
    for le in ("0.0015", "0.002", "0.0025", "0.003"):
        assert re.search(rf'sluice_search_shard_seconds_bucket{{le="{le}",phase="\w+",shard="s0"}}', metrics), le
    assert "sluice_search_cache_hit_ratio" in metrics and 'sluice_search_index_age_seconds{replica="s' in metrics
    assert st["cache"]["lookups"] >= st["cache"]["hits"] >= 1 and 0 < st["cache"]["hit_ratio"] <= 1
    written = [i for i, sh in enumerate(st["shards"]) if sh["head_seq"] > 0]
    for sh in st["shards"]:
        assert sh["p50_ms"] is not None and sh["p99_ms"] >= sh["p50_ms"]
        assert (sh["index_age_s"] is not None) == (sh["head_seq"] > 0) == (sh["replicas"][0]["index_age_s"] is not None)
    # no writes since: the time since the last applied write grows (it was 0 forever before)
    i = written[0]
    wait_for(
        lambda: status(router.url)["shards"][i]["index_age_s"] > st["shards"][i]["index_age_s"] + 0.5,
        60,
        "the index age to grow",
    )
    page = httpx.get(router.url + "/status", timeout=10).text
    assert '<link rel="icon" href="data:,">' in page and "p99" in page and "errors" in page


def test_openapi_documents_the_api(router):
    doc = httpx.get(router.url + "/openapi.json", timeout=10).json()
    assert {"/v1/search", "/v1/search/documents", "/v1/search/documents/{doc_id}"} <= set(doc["paths"])


def test_a_killed_local_replica_is_restarted_with_its_data(router):
    before = status(router.url)["local_pids"]
    name, pid = sorted(before.items())[0]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: status(router.url).get("local_pids", {}).get(name, pid) != pid, 60, "a restart")
    wait_for(lambda: all(r["up"] for s in status(router.url)["shards"] for r in s["replicas"]), 60, "up again")
    assert {h["id"] for h in search(router.url, "packages").json()["hits"]} == {"apt", "dpkg"}


def test_keys_guard_search_and_ingest(tmp_path):
    cfg = '[search]\napi_keys = ["search-key-1"]\ningest_keys = ["ingest-key-1"]\n[[shards]]\nname = "only"\n'
    r = start_router(tmp_path, cfg, "keyed")
    try:
        line = json.dumps(DOCS[0])
        assert _bulk(r.url, line).status_code == 401
        assert _bulk(r.url, line, headers={"authorization": "Bearer search-key-1"}).status_code == 401
        assert _bulk(r.url, line, headers={"authorization": "Bearer ingest-key-1"}).status_code == 200
        assert search(r.url, "apt").status_code == 401
        assert search(r.url, "apt", headers={"x-api-key": "search-key-1"}).json()["hits"][0]["id"] == "apt"
        assert httpx.delete(r.url + "/v1/search/documents/apt", timeout=30).status_code == 401
    finally:
        r.stop()
