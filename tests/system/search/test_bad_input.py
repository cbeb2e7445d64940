"""Bad input through a real `sluice search serve` (issue 40): text `json` accepts but the write or
query path cannot carry, bodies over their bounds, keys before bodies. Every answer is a
documented status with the API's error shape; a batch is never half written behind a 500; no
body over its bound is read whole."""

from __future__ import annotations

import json
import select
import socket

import httpx
import pytest

from sluice.search.router.cluster.topology import hash_shard
from tests.system.search.cluster import search, start_router

BAD_LINES = {
    "nan": '{"id": "bad", "title": NaN}',
    "infinity": '{"id": "bad", "n": Infinity}',
    "overflow": '{"id": "bad", "n": 1e999}',
    "5000 digits": '{"id": "bad", "n": ' + "1" * 5000 + "}",
    "surrogate in a field": '{"id": "bad", "title": "\\ud800"}',
    "surrogate in the id": '{"id": "\\ud800", "title": "x"}',
    "nested 10000 deep": '{"id": "bad", "x": ' + "[" * 10_000 + "]" * 10_000 + "}",
}

BAD_SEARCH_BODIES = {
    "nested 10000 deep": b'{"query": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    "lone surrogate": b'{"query": "\\ud800"}',
    "surrogate key": b'{"query": "a", "\\udc00": 1}',
    "invalid utf-8": b'{"query": "\xff\xfe"}',
    "5000-digit top_k": b'{"query": "a", "top_k": ' + b"1" * 5000 + b"}",
    "nan top_k": b'{"query": "a", "top_k": NaN}',
    "float top_k": b'{"query": "a", "top_k": 1e999}',
    "not an object": b'["query"]',
    "empty": b"",
}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    r = start_router(tmp_path_factory.mktemp("bad-input"))
    try:
        yield r
    finally:
        r.stop()


def _error_shape(r: httpx.Response, status: int, kind: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["type"] == kind and body["error"]["message"], body


@pytest.mark.parametrize("name", BAD_LINES)
def test_a_line_json_accepts_but_the_path_cannot_is_an_error_by_number_and_the_rest_is_written(router, name):
    # one good document for each shard, then the bad line: nothing may be half written behind a 500
    good = [
        next({"id": f"{name}-{k}", "title": "gadget"} for k in range(100) if hash_shard(f"{name}-{k}", 2) == s)
        for s in (0, 1)
    ]
    body = "\n".join([json.dumps(good[0]), json.dumps(good[1]), BAD_LINES[name]]) + "\n"
    r = httpx.post(router.url + "/v1/search/documents", content=body.encode(), timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["accepted"] == 2 and [e["line"] for e in out["errors"]] == [3] and out["failed"] == {}, out
    assert set(out["written"]) == {"s0", "s1"}
    found = {h["id"] for h in search(router.url, "gadget", top_k=100).json()["hits"]}
    assert {g["id"] for g in good} <= found


@pytest.mark.parametrize("name", BAD_SEARCH_BODIES)
def test_a_malformed_search_body_is_a_400_in_the_api_shape(router, name):
    r = httpx.post(
        router.url + "/v1/search",
        content=BAD_SEARCH_BODIES[name],
        headers={"content-type": "application/json"},
        timeout=60,
    )
    _error_shape(r, 400, "invalid_request_error")


def _upload(
    url: str, path: str, total: int, headers: dict[str, str] | None = None, chunked: bool = True
) -> tuple[int, str, int]:
    """POST `total` bytes of body (chunked, or with its content-length) over a raw socket,
    reading the answer as soon as one comes: (status, the answer's text, body bytes sent).
    The answer arriving before the body is all sent is what "refused before read whole" means;
    every wait is bounded (60 s without progress fails the test, never hangs it)."""
    host, port = url.removeprefix("http://").split(":")
    head = [f"POST {path} HTTP/1.1", f"host: {host}", "content-type: application/json"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    head.append("transfer-encoding: chunked" if chunked else f"content-length: {total}")
    piece = b" " * (256 << 10)
    frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
    sock = socket.create_connection((host, int(port)), timeout=60)
    sent, answer = 0, b""
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sock.setblocking(False)
        pending = memoryview(b"")
        while b"\r\n\r\n" not in answer:
            want_write = sent < total or len(pending) > 0
            readable, writable, _ = select.select([sock], [sock] if want_write else [], [], 60)
            if not readable and not writable:
                raise AssertionError(f"no answer and no progress for 60 s ({sent} bytes sent)")
            if readable:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
                continue
            if not pending:
                pending, sent = memoryview(frame), sent + len(piece)
            try:
                pending = pending[sock.send(pending) :]
            except (BrokenPipeError, ConnectionResetError):
                want_write = False  # the server closed its side; its answer may still be readable
                sock.setblocking(True)
                answer += sock.recv(65536)
                break
        sock.setblocking(True)
        while b"\r\n\r\n" in answer and len(answer.partition(b"\r\n\r\n")[2]) < 2 and (more := sock.recv(65536)):
            answer += more
    finally:
        sock.close()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 "), answer[:200]
    return int(status_line.split()[1]), rest.decode(errors="replace"), sent


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("chunked", [True, False])
def test_a_100mb_search_body_is_refused_before_it_is_read_and_memory_stays_flat(router, chunked):
    before = _rss_kb(router.pid)
    status, text, sent = _upload(router.url, "/v1/search", 100 << 20, chunked=chunked)
    assert status == 413 and "request_too_large" in text and "connection: close" in text.lower(), text
    assert sent < 100 << 20  # answered before the body ended
    assert _rss_kb(router.pid) - before < 32 << 10, "the router grew by more than 32 MB"


def test_a_100mb_bulk_body_is_refused_as_soon_as_it_passes_64mb(router):
    status, text, sent = _upload(router.url, "/v1/search/documents", 100 << 20)
    assert status == 413 and "request_too_large" in text, text
    assert sent < 100 << 20
    status, text, sent = _upload(router.url, "/v1/search/documents", 100 << 20, chunked=False)
    assert status == 413 and sent < 100 << 20  # a declared length over the bound: refused unread


def test_with_api_keys_the_key_is_checked_before_the_body_is_read(tmp_path):
    cfg = '[search]\napi_keys = ["search-key-1"]\ningest_keys = ["ingest-key-1"]\n[[shards]]\nname = "only"\n'
    r = start_router(tmp_path, cfg, "keyed")
    try:
        for path in ("/v1/search", "/v1/search/documents"):
            status, text, sent = _upload(r.url, path, 100 << 20)
            assert status == 401 and "authentication_error" in text, (path, text)
            assert "connection: close" in text.lower(), (path, text)
            assert sent < 100 << 20
        bad = httpx.post(r.url + "/v1/search", content=b"{", headers={"x-api-key": "search-key-1"}, timeout=60)
        _error_shape(bad, 400, "invalid_request_error")  # with the key: the body is judged
    finally:
        r.stop()
