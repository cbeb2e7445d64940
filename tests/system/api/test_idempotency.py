"""Idempotency-Key end to end: real `sluice serve` processes (two, sharing one real worker and a
real Redis for keys and replay), the official SDKs as clients. Engine requests are counted
through /metrics (`sluice_gateway_requests_total`, every kind), so "not generated twice" is
proven on the server, and the rate-limit charge through a 1-rpm key."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from httpx_sse import connect_sse

from tests.server_process import MODEL, start_server, start_worker
from tests.system.api.test_gateway import make_key

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def worker():
    address = f"unix:{Path(tempfile.mkdtemp(prefix='sluice-idem-')) / 'w.sock'}"
    proc = start_worker(address)
    proc.extra["address"] = address
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def fleet(worker, redis_server, tmp_path_factory):
    data = tmp_path_factory.mktemp("keys")
    keys = {"main": make_key(data, "acme", "standard"), "slow": make_key(data, "slowco", "standard", "--rpm", "1")}
    env = {
        "SLUICE_DATA_DIR": str(data),
        "SLUICE_IDEMPOTENCY_STORE": "redis",
        "SLUICE_REPLAY_STORE": "redis",
        "SLUICE_LIMITS_STORE": "redis",
        "SLUICE_REDIS_URL": redis_server.url,
    }
    a = start_server(["--worker", worker.extra["address"]], env=env)
    b = start_server(["--worker", worker.extra["address"]], env=env)
    yield a, b, keys
    a.stop()
    b.stop()


def generations(*servers) -> float:
    """Requests that reached the gateway's engine path (engine, coalesced or cached), all servers."""
    total = 0.0
    for s in servers:
        for line in httpx.get(s.base_url + "/metrics").text.splitlines():
            if line.startswith("sluice_gateway_requests_total{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def idem() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def test_sdk_retries_through_another_replica_are_not_generated_again(fleet):
    a, b, keys = fleet
    headers = idem()
    before = generations(a, b)
    first = anthropic.Anthropic(base_url=a.base_url, api_key=keys["main"], max_retries=0).messages.create(
        model=MODEL, max_tokens=12, messages=ASK, extra_headers=headers
    )
    raw = anthropic.Anthropic(
        base_url=b.base_url, api_key=keys["main"], max_retries=0
    ).messages.with_raw_response.create(model=MODEL, max_tokens=12, messages=ASK, extra_headers=headers)
    retry = raw.parse()
    assert retry.id == first.id and retry.content == first.content and retry.usage == first.usage
    assert raw.headers["idempotent-replayed"] == "true"
    assert generations(a, b) - before == 1
    with pytest.raises(anthropic.UnprocessableEntityError) as info:  # same key, another request
        anthropic.Anthropic(base_url=b.base_url, api_key=keys["main"], max_retries=0).messages.create(
            model=MODEL, max_tokens=13, messages=ASK, extra_headers=headers
        )
    assert info.value.body["error"]["type"] == "invalid_request_error"


def test_openai_sdk_retry_and_stream_replay(fleet):
    a, b, keys = fleet
    headers = idem()
    before = generations(a, b)
    one = openai.OpenAI(base_url=a.base_url + "/v1", api_key=keys["main"], max_retries=0)
    two = openai.OpenAI(base_url=b.base_url + "/v1", api_key=keys["main"], max_retries=0)
    first = one.chat.completions.create(model=MODEL, max_tokens=12, messages=ASK, extra_headers=headers)
    again = two.chat.completions.create(model=MODEL, max_tokens=12, messages=ASK, extra_headers=headers)
    assert again.id == first.id and again.choices[0].message.content == first.choices[0].message.content
    stream_headers = idem()
    texts = []
    for client in (one, two):  # the retry replays the recorded chunks from the start
        chunks = list(
            client.chat.completions.create(
                model=MODEL, max_tokens=12, messages=ASK, stream=True, extra_headers=stream_headers
            )
        )
        texts.append(("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), {c.id for c in chunks}))
    assert texts[0] == texts[1] and texts[0][0]
    assert generations(a, b) - before == 2


def test_a_dropped_stream_is_resumed_by_its_retry_on_another_replica(fleet):
    a, b, keys = fleet
    headers = {**idem(), "x-api-key": keys["main"]}
    body = {
        "model": MODEL,
        "max_tokens": 40,
        "stream": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Describe the sea."}],
    }
    before = generations(a, b)
    got = []
    with (
        httpx.Client(timeout=120) as c,
        connect_sse(c, "POST", a.base_url + "/v1/messages", json=body, headers=headers) as es,
    ):
        for sse in es.iter_sse():
            if sse.event != "ping":  # a ping carries the last id on (SSE's last-event-id is sticky)
                got.append(sse)
            if len(got) == 3:
                break  # the connection drops; the keyed stream keeps generating
    rest = []
    with (
        httpx.Client(timeout=120) as c,
        connect_sse(
            c, "POST", b.base_url + "/v1/messages", json=body, headers={**headers, "Last-Event-ID": got[-1].id}
        ) as es,
    ):
        assert es.response.headers["idempotent-replayed"] == "true"
        rest = [sse for sse in es.iter_sse() if sse.event != "ping"]
    combined = got + rest
    assert [int(e.id.rsplit(":", 1)[1]) for e in combined] == list(range(1, len(combined) + 1))
    assert combined[-1].event == "message_stop"
    sdk = anthropic.Anthropic(base_url=b.base_url, api_key=keys["main"], max_retries=0)
    with sdk.messages.stream(
        model=MODEL,
        max_tokens=40,
        messages=body["messages"],
        extra_body={"temperature": 0},
        extra_headers={"Idempotency-Key": headers["Idempotency-Key"]},
    ) as s:
        final = s.get_final_message()
    text = "".join(json.loads(e.data)["delta"]["text"] for e in combined if e.event == "content_block_delta")
    assert final.content[0].text == text
    assert generations(a, b) - before == 1


def test_retries_are_charged_once(fleet):
    """A 1-rpm key: three tries of one keyed request all succeed (each would be a new request
    otherwise), and the next new request is over the limit — the first try was charged."""
    a, b, keys = fleet
    headers = {**idem(), "x-api-key": keys["slow"]}
    body = {"model": MODEL, "max_tokens": 4, "messages": ASK}
    tries = [httpx.post(s.base_url + "/v1/messages", json=body, headers=headers, timeout=120) for s in (a, b, a)]
    assert [r.status_code for r in tries] == [200, 200, 200] and len({r.content for r in tries}) == 1
    fresh = httpx.post(b.base_url + "/v1/messages", json=body, headers={"x-api-key": keys["slow"]}, timeout=120)
    assert fresh.status_code == 429
