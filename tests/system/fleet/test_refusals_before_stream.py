"""A refusal is a real HTTP status, never a stream that opens and then fails (real processes).

- The last worker able to serve the model is killed (kill -9) and streams are sent at once,
  several times over: each gets 529 `overloaded_error` with `retry-after` — which the SDKs
  retry — or a whole answer; never HTTP 200 followed by an `error` event. A failed call marks
  the worker down at once, and a stream opens only once the engine has answered.
- The Redis limits store hangs (SIGSTOP of a test-started redis-server) under
  `on_store_error = "closed"`: streams wait for the store's verdict instead of opening after
  `stream_open_wait_s`, and get 529 with `retry-after` like plain requests. SIGCONT after.

Nothing here depends on speed: the kill and the hang come before the requests are sent, and
every wait is bounded generously."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.redis_server import RedisServer
from tests.server_process import MODEL, Proc, start_server, start_worker

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Say one word."}]
ROUNDS = 3  # kill, send, restart — repeated
STREAMS = 4  # sent together right after each kill


def send_stream(base_url: str, key: str | None = None) -> dict:
    """One streamed Messages call: its status, headers, event names and any error event."""
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "stream": True, "messages": ASK}
    headers = {"sluice-cache": "bypass", **({"x-api-key": key} if key else {})}
    with httpx.stream("POST", base_url + "/v1/messages", json=body, headers=headers, timeout=120) as r:
        if r.status_code != 200:
            r.read()
            return {"status": r.status_code, "headers": dict(r.headers), "body": r.json(), "events": []}
        events, error, name = [], None, None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
                events.append(name)
            elif line.startswith("data: ") and name == "error":
                error = json.loads(line[len("data: ") :])
    return {"status": 200, "headers": dict(r.headers), "events": events, "error": error}


def assert_refused_or_whole(reply: dict) -> bool:
    """529 with retry-after (True), or a whole answer (False); anything else fails."""
    if reply["status"] == 200:
        assert "error" not in reply["events"], f"a refusal sent as an in-stream error: {reply['error']}"
        assert reply["events"][-1] == "message_stop", reply["events"]
        return False
    assert reply["status"] == 529, reply
    assert reply["body"]["error"]["type"] == "overloaded_error", reply["body"]
    assert int(reply["headers"]["retry-after"]) >= 1, reply["headers"]
    return True


def wait_ready(server: Proc, status: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(server.base_url + "/ready", timeout=30).status_code != status:
        assert time.monotonic() < deadline, f"/ready never became {status}"
        time.sleep(0.05)


def test_streams_sent_right_after_the_last_worker_dies_are_refused_with_529_never_an_error_event():
    address = f"unix:{Path(tempfile.mkdtemp(prefix='sluice-refuse-')) / 'w.sock'}"
    worker = start_worker(address)
    server = start_server(["--worker", address])
    refused = 0
    try:
        for _ in range(ROUNDS):
            assert send_stream(server.base_url)["events"][-1] == "message_stop"  # the worker serves
            worker.process.send_signal(signal.SIGKILL)
            worker.process.wait(30)
            with ThreadPoolExecutor(STREAMS) as pool:
                replies = list(pool.map(lambda _: send_stream(server.base_url), range(STREAMS)))
            refused += sum(assert_refused_or_whole(r) for r in replies)
            wait_ready(server, 503)  # no engine can serve
            assert assert_refused_or_whole(send_stream(server.base_url))
            worker = start_worker(address)
            wait_ready(server, 200)
        assert refused >= ROUNDS * STREAMS  # the worker was dead before they were sent: none could be served
    finally:
        server.stop()
        worker.stop()


def make_key(data_dir: Path) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice.cli",
            "keys",
            "create",
            "--tenant",
            "acme",
            "--tier",
            "standard",
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_streams_get_529_with_retry_after_while_the_limits_store_hangs(tmp_path):
    redis = RedisServer()  # this test's own: it is frozen below
    address = f"unix:{Path(tempfile.mkdtemp(prefix='sluice-refuse-')) / 'w.sock'}"
    worker = start_worker(address)
    key = make_key(tmp_path)
    server = start_server(
        ["--worker", address],
        env={
            "SLUICE_DATA_DIR": str(tmp_path),
            "SLUICE_LIMITS_STORE": "redis",
            "SLUICE_REDIS_URL": redis.url,
            "SLUICE_ON_STORE_ERROR": "closed",
        },
    )
    stopped = False
    try:
        assert send_stream(server.base_url, key)["events"][-1] == "message_stop"  # limits enforced, served
        os.kill(redis.process.pid, signal.SIGSTOP)
        stopped = True
        with ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(lambda _: send_stream(server.base_url, key), range(3)))
        for reply in replies:
            assert assert_refused_or_whole(reply), reply  # refused: the store cannot say yes
        os.kill(redis.process.pid, signal.SIGCONT)
        stopped = False
        deadline = time.monotonic() + 60
        while (reply := send_stream(server.base_url, key))["status"] != 200:  # back once the store answers
            assert time.monotonic() < deadline, reply
            time.sleep(0.2)
        assert reply["events"][-1] == "message_stop"
    finally:
        if stopped:
            os.kill(redis.process.pid, signal.SIGCONT)
        server.stop()
        worker.stop()
        redis.stop()
