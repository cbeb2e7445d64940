"""The Anthropic Messages contract against a real `sluice serve` with the bundled model.

Clients are the official `anthropic` SDK (max_retries=0) and raw httpx / httpx-sse for wire
checks. Numbers in the test names refer to the conformance checks in
shared/reference/anthropic_api.md §11.
"""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import pytest
from httpx_sse import connect_sse

from tests.server_process import MODEL, SETTLE_S, metric, start_server, wait_engine_idle

pytestmark = pytest.mark.slow
KEY = "sk-test-0123456789"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server():
    proc = start_server(
        ["--ping-interval", "0.5"],
        env={
            "SLUICE_API_KEY": KEY,
            "SLUICE_MAX_BODY_BYTES": str(2 * 1024 * 1024),
            "SLUICE_MODEL_ALIASES": '["smollm2", "smollm2-latest"]',
        },
    )
    yield proc
    assert proc.stop() == 0
    assert KEY not in proc.log()  # the key is never logged


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)


def headers(**extra: str) -> dict[str, str]:
    return {"x-api-key": KEY, "anthropic-version": "2023-06-01", **extra}


def create(client: anthropic.Anthropic, text: str = "Name three colors.", max_tokens: int = 12, **kw):
    body = {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}], **kw}
    extra = body.pop("extra_body", GREEDY)
    return client.messages.create(**body, extra_body=extra)


# -- 1. auth -----------------------------------------------------------------------------------
def test_01_both_auth_styles(server, client):
    assert create(client).type == "message"  # SDK 2.x: Authorization: Bearer
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.base_url + "/v1/messages", json=body, headers=headers())  # x-api-key style
    assert r.status_code == 200, r.text


def test_01_missing_or_wrong_key(server):
    wrong = anthropic.Anthropic(base_url=server.base_url, api_key="sk-test-0123456780", max_retries=0)  # same length
    with pytest.raises(anthropic.AuthenticationError) as info:
        create(wrong)
    assert info.value.body["error"]["type"] == "authentication_error"
    assert info.value.request_id and info.value.request_id.startswith("req_")
    r = httpx.post(server.base_url + "/v1/messages", json={}, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


# -- 2. version header ------------------------------------------------------------------------
def test_02_versions(server):
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5}
    for version in ("2023-06-01", "2026-10-21"):
        r = httpx.post(server.base_url + "/v1/messages", json=body, headers=headers(**{"anthropic-version": version}))
        assert r.status_code == 200, r.text  # sampling params accepted under both (lenient default)
    r = httpx.post(server.base_url + "/v1/messages", json=body, headers={"x-api-key": KEY})
    assert r.status_code == 200  # missing header: the default version
    for bad in ("1999-01-01", ""):  # a header sent empty is a bad value, not a missing one
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = httpx.post(server.base_url + path, json=body, headers=headers(**{"anthropic-version": bad}))
            assert r.status_code == 400 and "anthropic-version" in r.json()["error"]["message"], (bad, path, r.text)


# -- 3. non-streaming create ------------------------------------------------------------------
def test_03_create(client):
    m = create(client)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.stop_reason in ("end_turn", "max_tokens") and m.content[0].type == "text" and m.content[0].text
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    assert m._request_id and m._request_id.startswith("req_")


# -- 4. streaming equals non-streaming ----------------------------------------------------------
def test_04_stream_matches_create(client):
    prompt = "Write one sentence about rivers."
    full = create(client, prompt, max_tokens=24)
    with client.messages.stream(
        model=MODEL, max_tokens=24, messages=[{"role": "user", "content": prompt}], extra_body=GREEDY
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == final.content[0].text == full.content[0].text
    assert final.stop_reason == full.stop_reason
    assert final.usage.output_tokens == full.usage.output_tokens
    assert (
        final.usage.input_tokens + final.usage.cache_read_input_tokens
        == full.usage.input_tokens + full.usage.cache_read_input_tokens
    )


# -- 5. raw wire capture ------------------------------------------------------------------------
def test_05_wire_format(server):
    body = {"model": MODEL, "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "Hello"}]}
    with httpx.Client(timeout=30) as c:
        with c.stream(
            "POST", server.base_url + "/v1/messages", json=body, headers=headers(**{"accept-encoding": "gzip"})
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert "content-encoding" not in r.headers
            assert r.headers["x-accel-buffering"] == "no"
            assert r.headers["request-id"].startswith("req_")
            raw = "".join(r.iter_text())
    frames = [f for f in raw.replace("\r\n", "\n").split("\n\n") if f.strip()]
    names = []
    for frame in frames:
        lines = frame.split("\n")
        event = [ln for ln in lines if ln.startswith("event: ")]
        data = [ln for ln in lines if ln.startswith("data: ")]
        assert len(event) == 1 and len(data) == 1, frame  # an event: line on every frame, one-line JSON
        name = event[0][7:]
        assert json.loads(data[0][6:])["type"] == name
        names.append(name)
    names = [n for n in names if n != "ping"]
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert set(names[2:-3]) <= {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_05_event_ids_are_sequential(server):
    body = {"model": MODEL, "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    with (
        httpx.Client(timeout=30) as c,
        connect_sse(c, "POST", server.base_url + "/v1/messages", json=body, headers=headers()) as es,
    ):
        ids = [sse.id for sse in es.iter_sse() if sse.event != "ping"]
    msg_id = ids[0].split(":")[0]
    assert msg_id.startswith("msg_")
    assert ids == [f"{msg_id}:{i}" for i in range(1, len(ids) + 1)]


# -- 6. stop conditions -----------------------------------------------------------------------
def test_06_stop_sequence_and_max_tokens(client):
    base = create(client, "Count from 1 to 10 separated by commas.", max_tokens=40)
    text = base.content[0].text
    assert "3" in text, text
    stop = "3"
    m = create(client, "Count from 1 to 10 separated by commas.", max_tokens=40, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert stop not in m.content[0].text and text.startswith(m.content[0].text)
    with client.messages.stream(
        model=MODEL,
        max_tokens=40,
        messages=[{"role": "user", "content": "Count from 1 to 10 separated by commas."}],
        stop_sequences=[stop],
        extra_body=GREEDY,
    ) as s:
        final = s.get_final_message()
    assert (
        final.stop_reason == "stop_sequence"
        and final.stop_sequence == stop
        and final.content[0].text == m.content[0].text
    )
    tiny = create(client, max_tokens=2)
    assert tiny.stop_reason == "max_tokens" and tiny.usage.output_tokens == 2
    with client.messages.stream(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 2


# -- 7. input forms ---------------------------------------------------------------------------
def test_07_input_forms(client):
    as_string = create(client, "Say hello.", system="You are terse.")
    as_blocks = client.messages.create(
        model=MODEL,
        max_tokens=12,
        system=[{"type": "text", "text": "You are terse."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
        extra_body=GREEDY,
    )
    assert as_string.content[0].text == as_blocks.content[0].text
    merged = client.messages.create(
        model=MODEL,
        max_tokens=12,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Say"}, {"role": "user", "content": "hello."}],
    )
    assert merged.stop_reason is not None  # same-role turns are merged, not rejected
    prefill = client.messages.create(
        model=MODEL,
        max_tokens=8,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "The answer is"}],
    )
    assert not prefill.content[0].text.startswith("The answer is")  # only the continuation
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [image]}])
    assert "image" in str(info.value)


# -- 8. validation errors -----------------------------------------------------------------------
def test_08_validation_errors(server, client):
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=5, messages=[])
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}]
        )
    with pytest.raises(anthropic.BadRequestError) as info:
        create(client, extra_body={"frobnicate": 1})
    assert "Extra inputs are not permitted" in str(info.value)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(
        server.base_url + "/v1/messages",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers=headers(),
    )
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens: Field required"


# -- 11. mid-stream failure is an error event ----------------------------------------------------
# (tests/system/api/test_serving.py kills the worker mid-stream)


# -- 12. disconnect, pings -------------------------------------------------------------------
def test_12_disconnect_frees_the_engine(server):
    body = {
        "model": MODEL,
        "max_tokens": 300,
        "stream": True,
        "messages": [{"role": "user", "content": "Tell a long story."}],
    }
    deltas = 0
    outputs = metric(server.base_url, "sluice_output_tokens_total")
    with (
        httpx.Client(timeout=30) as c,
        connect_sse(c, "POST", server.base_url + "/v1/messages", json=body, headers=headers()) as es,
    ):
        for sse in es.iter_sse():
            if sse.event == "content_block_delta":
                deltas += 1
                if deltas == 3:
                    assert metric(server.base_url, "sluice_engine_running_requests") == 1
                    break
    wait_engine_idle(server.base_url, outputs, 150)  # stopped, not run to its 300 tokens
    assert metric(server.base_url, "sluice_engine_kv_blocks_used") == 0


def test_12_pings_at_cadence():
    # 50 ms per engine step (the worker's step_delay_s fault): 40 greedy tokens take at least
    # 2 s however fast the machine is, so the stream provably spans four ping intervals
    proc = start_server(
        ["--ping-interval", "0.5"], env={"SLUICE_API_KEY": KEY, "SLUICE_FAULT_INJECTION": "step_delay_s=0.05"}
    )
    try:
        body = {
            "model": MODEL,
            "max_tokens": 40,
            "stream": True,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Describe the ocean in detail."}],
        }
        names: list[str] = []
        output_tokens = 0
        with (
            httpx.Client(timeout=60) as c,
            connect_sse(c, "POST", proc.base_url + "/v1/messages", json=body, headers=headers()) as es,
        ):
            for sse in es.iter_sse():
                names.append(sse.event)
                if sse.event == "message_delta":
                    output_tokens = json.loads(sse.data)["usage"]["output_tokens"]
    finally:
        assert proc.stop() == 0
    assert names[0] == "ping"  # one at once, before queueing and prefill
    assert output_tokens == 40  # greedy: the same every run, so the stream lasts >= 40 steps
    first_text = names.index("content_block_delta")
    pings_while_generating = names[first_text:].count("ping")
    # >= 2 s of generation at one ping per 0.5 s: 4 due; a busy machine may delay some, not most
    assert pings_while_generating >= 2, names


# -- 13. token counting and models ---------------------------------------------------------------
def test_13_count_tokens_and_models(client):
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    counted = client.messages.count_tokens(model=MODEL, messages=messages, system="Be brief.")
    m = client.messages.create(model=MODEL, max_tokens=3, messages=messages, system="Be brief.", extra_body=GREEDY)
    u = m.usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    ids = [model.id for model in client.models.list(limit=1)]  # auto-paginates past limit
    assert ids == [MODEL, "smollm2", "smollm2-latest"]
    assert client.models.retrieve("smollm2").id == "smollm2"
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("nope")


# -- 15. prompt-cache accounting ------------------------------------------------------------------
def test_15_prompt_cache_accounting(client):
    long_doc = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(60))
    system = [{"type": "text", "text": long_doc, "cache_control": {"type": "ephemeral"}}]

    def ask(question: str, stream: bool):
        msgs = [{"role": "user", "content": question}]
        if stream:
            with client.messages.stream(
                model=MODEL, max_tokens=4, system=system, messages=msgs, extra_body=GREEDY
            ) as s:
                start_usage = None
                for event in s:
                    if event.type == "message_start":
                        start_usage = event.message.usage
                return s.get_final_message().usage, start_usage
        return client.messages.create(
            model=MODEL, max_tokens=4, system=system, messages=msgs, extra_body=GREEDY
        ).usage, None

    counted = client.messages.count_tokens(
        model=MODEL, system=system, messages=[{"role": "user", "content": "What is 7 squared?"}]
    )
    first, _ = ask("What is 7 squared?", stream=False)
    second, start = ask("What is 8 squared?", stream=True)
    assert first.cache_creation_input_tokens > 400 and first.cache_read_input_tokens == 0
    assert (
        first.input_tokens + first.cache_creation_input_tokens + first.cache_read_input_tokens == counted.input_tokens
    )
    assert second.cache_read_input_tokens >= first.cache_creation_input_tokens - 16
    assert second.cache_creation_input_tokens == 0
    assert start.cache_read_input_tokens == second.cache_read_input_tokens  # also in message_start


def test_15b_the_cache_survives_the_engine_giving_its_memory_back(client, server):
    """After 1 s idle the worker gives back every KV page (its resident KV goes to 0) and keeps
    the cache in its spill file; the next request with the same prefix reads it back, and the
    answer is the same (engine/kv_spill.py)."""
    notes = " ".join(f"Note {i}: box {i} holds {['apples', 'keys', 'maps'][i % 3]}." for i in range(60))
    system = [{"type": "text", "text": notes, "cache_control": {"type": "ephemeral"}}]
    ask = {
        "model": MODEL,
        "max_tokens": 8,
        "system": system,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "What does box 7 hold?"}],
    }
    first = client.messages.create(**ask)
    deadline = time.monotonic() + SETTLE_S  # the rest comes 1 s after the last step; a busy machine delays it
    while not (
        metric(server.base_url, "sluice_engine_kv_resident_bytes") == 0
        and metric(server.base_url, "sluice_engine_kv_spilled_blocks") > 0
    ):
        assert time.monotonic() < deadline, "the engine never gave its KV memory back"
        time.sleep(0.05)
    restored = metric(server.base_url, "sluice_engine_kv_spill_restored_blocks_total")
    second = client.messages.create(**ask)
    assert second.content[0].text == first.content[0].text
    cached = second.usage.cache_read_input_tokens
    assert cached >= first.usage.cache_creation_input_tokens - 16 and cached > 400
    # read back from the file, not recomputed: 8-token blocks
    assert metric(server.base_url, "sluice_engine_kv_spill_restored_blocks_total") - restored >= cached // 8


# -- limits, context, robustness ------------------------------------------------------------------
def test_bad_input_matrix(server):
    url = server.base_url + "/v1/messages"
    ok = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        (b"{not json", 400, "invalid_request_error"),
        (json.dumps({**ok, "max_tokens": "three"}).encode(), 400, "invalid_request_error"),
        (json.dumps({**ok, "messages": [{"role": "robot", "content": "hi"}]}).encode(), 400, "invalid_request_error"),
        (json.dumps({**ok, "messages": "hi"}).encode(), 400, "invalid_request_error"),
        (json.dumps({**ok, "max_tokens": -1}).encode(), 400, "invalid_request_error"),
        (json.dumps({**ok, "temperature": 3}).encode(), 400, "invalid_request_error"),
        (json.dumps({**ok, "stop_sequences": [""]}).encode(), 400, "invalid_request_error"),
        (json.dumps({**ok, "model": "gpt-nothing"}).encode(), 404, "not_found_error"),
        (
            json.dumps({**ok, "messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]}).encode(),
            413,
            "request_too_large",
        ),
        (
            json.dumps({**ok, "messages": [{"role": "user", "content": "hello " * 9000}]}).encode(),
            400,
            "invalid_request_error",
        ),
        (json.dumps({**ok, "max_tokens": 10**6}).encode(), 400, "invalid_request_error"),
    ]
    for raw, status, kind in cases:
        r = httpx.post(url, content=raw, headers={**headers(), "content-type": "application/json"}, timeout=60)
        assert r.status_code == status, (raw[:80], r.text)
        body = r.json()
        assert (
            body["type"] == "error" and body["error"]["type"] == kind and body["request_id"] == r.headers["request-id"]
        )
        assert "Traceback" not in r.text
        if status < 500:
            assert r.headers.get("x-should-retry") == "false"
    too_long = httpx.post(
        url, json={**ok, "messages": [{"role": "user", "content": "hello " * 9000}]}, headers=headers()
    )
    assert "prompt is too long" in too_long.json()["error"]["message"]
    assert httpx.post(url, json=ok, headers=headers()).status_code == 200  # still answering
    r = httpx.get(server.base_url + "/v1/nothing-here", headers=headers())
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_health_ready_metrics(server):
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.base_url + "/ready").json()["status"] == "ready"
    text = httpx.get(server.base_url + "/metrics").text
    for name in (
        "sluice_http_requests_total",
        "sluice_time_to_first_token_seconds",
        "sluice_inter_token_latency_seconds",
        "sluice_request_duration_seconds",
        "sluice_queue_time_seconds",
        "sluice_engine_running_requests",
        "sluice_engine_waiting_requests",
        "sluice_engine_kv_usage_ratio",
        "sluice_engine_prefix_cache_hit_rate",
        "sluice_engine_preemptions_total",
        "sluice_engine_batch_tokens",
        "sluice_engine_batch_fill_ratio",
    ):
        assert name in text, name
    assert metric(server.base_url, "sluice_queue_time_seconds_count") > 0  # fed by the engine's first event
    assert metric(server.base_url, "sluice_output_tokens_total") > 0
