"""Resumable streams: drop a connection, resume through the endpoint (also via another gateway
process with Redis), and get exactly the uninterrupted reply — no gap, no duplicate."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from tests.server_process import MODEL, start_server, start_worker, wait_engine_idle

pytestmark = pytest.mark.slow
BODY = {
    "model": MODEL,
    "max_tokens": 60,
    "stream": True,
    "temperature": 0,
    "messages": [{"role": "user", "content": "Describe a lighthouse at night in detail."}],
}


@pytest.fixture(scope="module")
def worker():
    address = f"unix:{Path(tempfile.mkdtemp(prefix='sluice-rs-')) / 'w.sock'}"
    proc = start_worker(address)
    proc.extra["address"] = address
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gateways(worker, redis_server):
    env = {"SLUICE_REPLAY_STORE": "redis", "SLUICE_REDIS_URL": redis_server.url}
    a = start_server(["--worker", worker.extra["address"]], env=env)
    b = start_server(["--worker", worker.extra["address"]], env=env)
    yield a, b
    a.stop()
    b.stop()


def read(url: str, method: str = "POST", stop_after: int | None = None, **kw) -> list:
    events = []
    with httpx.Client(timeout=60) as c, connect_sse(c, method, url, **kw) as es:
        assert es.response.status_code == 200, es.response.read()
        for sse in es.iter_sse():
            if sse.event == "ping":
                continue
            events.append(sse)
            if stop_after is not None and len(events) >= stop_after:
                break
    return events


def text_of(events: list) -> str:
    return "".join(json.loads(e.data)["delta"]["text"] for e in events if e.event == "content_block_delta")


def seqs(events: list) -> list[int]:
    return [int(e.id.rsplit(":", 1)[1]) for e in events]


def test_resume_after_a_drop_through_another_gateway(gateways):
    a, b = gateways
    whole = read(a.base_url + "/v1/messages", json=BODY)
    assert whole[-1].event == "message_stop"
    first = read(a.base_url + "/v1/messages", json={**BODY, "background": True}, stop_after=5)
    msg_id, last = first[-1].id.rsplit(":", 1)
    rest = read(b.base_url + f"/v1/messages/{msg_id}/stream", method="GET", headers={"Last-Event-ID": first[-1].id})
    combined = first + rest
    assert seqs(combined) == list(range(1, len(combined) + 1))  # no duplicate, no gap
    assert combined[-1].event == "message_stop"
    assert text_of(combined) == text_of(whole)
    again = read(a.base_url + f"/v1/messages/{msg_id}/stream?starting_after=2", method="GET")
    assert seqs(again)[0] == 3 and text_of(again) == text_of(combined[2:])


def test_unknown_id_is_a_404(gateways):
    a, _ = gateways
    r = httpx.get(a.base_url + "/v1/messages/msg_nope/stream")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_dropping_a_foreground_stream_aborts_and_the_log_says_so(gateways):
    a, _ = gateways
    first = read(a.base_url + "/v1/messages", json={**BODY, "max_tokens": 400}, stop_after=4)
    msg_id = first[-1].id.rsplit(":", 1)[0]
    wait_engine_idle(a.base_url, 0, float("inf"))  # (the abort itself: tests/system/api/test_serving.py)
    rest = read(a.base_url + f"/v1/messages/{msg_id}/stream", method="GET", headers={"Last-Event-ID": first[-1].id})
    assert rest[-1].event == "error" and "disconnected" in rest[-1].data


def test_memory_store_resume(worker):
    server = start_server(["--worker", worker.extra["address"]])
    try:
        first = read(server.base_url + "/v1/messages", json={**BODY, "background": True}, stop_after=3)
        msg_id = first[-1].id.rsplit(":", 1)[0]
        rest = read(
            server.base_url + f"/v1/messages/{msg_id}/stream", method="GET", headers={"Last-Event-ID": first[-1].id}
        )
        assert seqs(first + rest) == list(range(1, len(first) + len(rest) + 1)) and rest[-1].event == "message_stop"
    finally:
        server.stop()
