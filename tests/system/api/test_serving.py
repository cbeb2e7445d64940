"""Serving behaviour end to end: batching across clients, disconnects, a worker that dies,
a remote worker, and graceful shutdown on SIGTERM — all with real processes."""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import httpx
import psutil
import pytest
from httpx_sse import connect_sse

from tests.server_process import MODEL, SETTLE_S, metric, start_server, start_worker, wait_engine_idle

pytestmark = pytest.mark.slow
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


SEND_TIMEOUT_S = 3.0  # short, so the stalled-reader test is quick; readers that read are unaffected


# The drain test's stream must provably finish within the grace on a busy machine: a 30-token
# stream takes seconds even when the cores are shared, so a grace of minutes makes the outcome
# deterministic (an idle server still exits at once: the grace only bounds open streams).
SHUTDOWN_GRACE_S = 180


@pytest.fixture(scope="module")
def server():
    # 10 ms per engine step (the worker's step_delay_s fault): a 1,500-token stream provably
    # runs for 15 s or more however fast the machine is, so the reader tests below see it still
    # running after 2.5 send timeouts (7.5 s) by construction, not by the model being slow
    proc = start_server(
        ["--shutdown-grace", str(SHUTDOWN_GRACE_S)],
        env={"SLUICE_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S), "SLUICE_FAULT_INJECTION": "step_delay_s=0.01"},
    )
    yield proc
    proc.stop()


def _stream_body(max_tokens: int) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "stream": True, "messages": STORY, "temperature": 0}


def test_the_gateway_froze_its_startup_objects_when_ready(server):
    """Start-up's objects (tokenizers, safety pipelines, the app) out of the collector's full
    passes (sluice/heap.py): without it a full pass took ~93 ms under load, every stream stalled."""
    assert metric(server.base_url, "sluice_gc_frozen_objects") > 10_000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process names through /proc are Linux's")
def test_the_gateway_and_its_worker_carry_sluice_names_for_the_system(server):
    """ps and top show "sluice-serve" and "sluice-worker", not "python" (sluice/thread_name.py)."""
    gateway = psutil.Process(server.process.pid)
    assert gateway.name() == "sluice-serve"
    assert [w.name() for w in gateway.children()] == ["sluice-worker"]


def test_16_concurrent_streams_batch(server):
    """16 concurrent streams share engine steps. Counted in engine steps, not seconds (a busy
    machine slows every step alike): one at a time they would need >= 16 × their tokens steps."""
    client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="x", max_retries=0)

    async def one(i: int) -> tuple[str, int]:
        async with client.messages.stream(
            model=MODEL,
            max_tokens=24,
            messages=[{"role": "user", "content": f"Say something about the number {i}."}],
            extra_body={"temperature": 0},
        ) as s:
            final = await s.get_final_message()
        assert final.stop_reason in ("end_turn", "max_tokens")
        return final.content[0].text, final.usage.output_tokens

    async def run() -> list:
        return await asyncio.gather(*(one(i) for i in range(16)))

    steps_before = metric(server.base_url, "sluice_engine_steps_total")
    results = asyncio.run(run())
    steps = metric(server.base_url, "sluice_engine_steps_total") - steps_before
    assert len(results) == 16 and all(text for text, _ in results)
    assert all(0 < n <= 24 for _, n in results)
    tokens = sum(n for _, n in results)
    assert steps < tokens / 2, f"{steps:.0f} engine steps for {tokens} tokens of 16 streams: no batching?"


def _open_raw_stream(server, max_tokens: int, rcvbuf: int | None = None) -> socket.socket:
    import json

    body = json.dumps(_stream_body(max_tokens)).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:  # before connect, so the advertised window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    sock.sendall(
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _histogram(base_url: str, name: str) -> dict[str, float]:
    """`{le: cumulative count}` plus `count` of an unlabelled histogram from /metrics."""
    out = {}
    for line in httpx.get(base_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "_bucket{"):
            out[line.split('le="')[1].split('"')[0]] = float(line.split()[1])
        elif line.startswith(name + "_count "):
            out["count"] = float(line.split()[1])
    return out


@pytest.mark.parametrize("how", ["rst", "half-close"])
def test_disconnect_aborts_quickly(server, how):
    """An RST'd (SO_LINGER 0) or half-closed (SHUT_WR) connection aborts its generation promptly
    after the server sees the close (sluice_disconnect_abort_seconds: within the 1 s bucket, on a
    busy machine too; ms when idle), and the request stops generating: far fewer than its 400
    tokens are produced."""
    before = _histogram(server.base_url, "sluice_disconnect_abort_seconds")
    outputs = metric(server.base_url, "sluice_output_tokens_total")
    sock = _open_raw_stream(server, 400)
    buf = b""
    while buf.count(b"content_block_delta") < 2:
        buf += sock.recv(65536)
    assert metric(server.base_url, "sluice_engine_running_requests") == 1
    if how == "rst":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    else:
        sock.shutdown(socket.SHUT_WR)  # uvicorn treats a half-close as a disconnect
    wait_engine_idle(server.base_url, outputs, 200)
    if how != "rst":
        sock.close()
    after = _histogram(server.base_url, "sluice_disconnect_abort_seconds")
    assert after["count"] == before.get("count", 0) + 1
    assert after["1.0"] == before.get("1.0", 0) + 1, f"disconnect → abort took over a second: {after}"


def test_stalled_reader_is_cut_within_the_send_timeout(server):
    """A client with a tiny receive buffer that never reads: once its window is full, nothing
    more is acknowledged; the server cuts it `send_timeout_s` later (not after minutes of
    filling kernel buffers) and the engine drops the request."""
    cut_before = metric(server.base_url, "sluice_stalled_readers_cut_total")
    outputs = metric(server.base_url, "sluice_output_tokens_total")
    sock = _open_raw_stream(server, 1500, rcvbuf=2048)
    try:
        t0 = time.monotonic()
        while metric(server.base_url, "sluice_engine_running_requests") != 1:
            assert time.monotonic() - t0 < 30, "the request never started"
            time.sleep(0.05)
        started = time.monotonic()
        # the window fills within a few dozen events; then send_timeout_s; then one watch tick
        while metric(server.base_url, "sluice_stalled_readers_cut_total") == cut_before:
            assert time.monotonic() - started < SEND_TIMEOUT_S + SETTLE_S, "the stalled reader was never cut"
            time.sleep(0.1)
        cut_after = time.monotonic() - started
        wait_engine_idle(server.base_url, outputs, 1000)  # the cut reader's generation stopped
        assert cut_after >= SEND_TIMEOUT_S * 0.9  # not cut before the timeout
        sock.settimeout(5)
        try:
            while sock.recv(65536):  # what was buffered, then the end: the stream was dropped
                pass
        except ConnectionResetError:
            pass
    finally:
        sock.close()


def test_slow_but_steady_reader_is_not_cut(server):
    """A reader slower than the stream (tiny buffer, 512 bytes every 0.4 s) keeps acknowledging:
    it is never cut, however far behind it falls."""
    cut_before = metric(server.base_url, "sluice_stalled_readers_cut_total")
    outputs = metric(server.base_url, "sluice_output_tokens_total")
    sock = _open_raw_stream(server, 1500, rcvbuf=2048)
    try:
        got = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5 * SEND_TIMEOUT_S:
            got += len(sock.recv(512))
            time.sleep(0.4)
        assert metric(server.base_url, "sluice_stalled_readers_cut_total") == cut_before
        assert metric(server.base_url, "sluice_engine_running_requests") == 1
        assert got > 0
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    wait_engine_idle(server.base_url, outputs, 1500)


def _wait_ready(server, status: int) -> None:
    deadline = time.monotonic() + 120
    while httpx.get(server.base_url + "/ready", timeout=30).status_code != status:
        assert time.monotonic() < deadline, f"/ready never became {status}"
        time.sleep(0.05)


def test_worker_death_mid_stream_then_recovery():
    """A remote worker killed after 2 deltas → an `error` event (HTTP 200, SDK APIStatusError);
    a new worker on the same address is picked up again; SIGTERM with a short grace ends an
    open stream with an error event and the server exits 0."""
    address = f"unix:{Path(tempfile.mkdtemp(prefix='sluice-w-')) / 'w.sock'}"
    worker = start_worker(address)
    server = start_server(["--worker", address, "--shutdown-grace", "1"])
    try:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as info:
            with client.messages.stream(model=MODEL, max_tokens=300, messages=STORY) as s:
                deltas = 0
                for event in s:
                    if event.type == "content_block_delta":
                        deltas += 1
                        if deltas == 2:
                            worker.process.kill()
        assert info.value.status_code == 200
        assert info.value.body["error"]["type"] == "overloaded_error"
        with pytest.raises(anthropic.InternalServerError) as info:  # 529 before any stream starts
            client.messages.create(model=MODEL, max_tokens=3, messages=STORY)
        assert info.value.status_code == 529
        _wait_ready(server, 503)  # no engine can serve: a load balancer stops sending traffic
        stream = httpx.post(server.base_url + "/v1/messages", json=_stream_body(3), timeout=30)
        assert stream.status_code == 529 and "retry-after" in stream.headers  # refused before the stream

        worker = start_worker(address)
        _wait_ready(server, 200)  # reconnected by itself
        assert client.messages.create(model=MODEL, max_tokens=3, messages=STORY).stop_reason == "max_tokens"

        events: list[str] = []
        with (
            httpx.Client(timeout=30) as c,
            connect_sse(c, "POST", server.base_url + "/v1/messages", json=_stream_body(400)) as es,
        ):
            for sse in es.iter_sse():
                events.append(sse.event)
                if events.count("content_block_delta") == 2:
                    server.process.send_signal(signal.SIGTERM)
        assert events[-1] == "error" and "message_stop" not in events
        assert server.process.wait(15) == 0
    finally:
        server.stop()
        worker.stop()


def test_sigterm_lets_open_streams_finish(server):
    """Last in this module: SIGTERM during a short stream → it completes; the server exits 0."""
    events: list[str] = []
    with (
        httpx.Client(timeout=30) as c,
        connect_sse(c, "POST", server.base_url + "/v1/messages", json=_stream_body(30)) as es,
    ):
        for sse in es.iter_sse():
            events.append(sse.event)
            if events.count("content_block_delta") == 2:
                server.process.send_signal(signal.SIGTERM)
                time.sleep(0.3)
                with pytest.raises(httpx.HTTPError):  # no new connections while draining
                    httpx.get(server.base_url + "/health", timeout=2)
    assert events[-1] == "message_stop" and events.count("content_block_delta") >= 2
    assert server.process.wait(SHUTDOWN_GRACE_S + 30) == 0
