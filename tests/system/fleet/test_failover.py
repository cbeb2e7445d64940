"""The fleet's failure handling end to end: real `sluice serve` with a fleet file, real local
workers (the bundled model, small KV pools), real kill -9 and SIGSTOP.

- a worker killed mid-stream: the stream continues on the other replica with no gap, no repeat
  and no error, and the whole reply equals an uninterrupted greedy run; the other requests that
  were on the dead worker (running or queued) complete too;
- a worker that hangs (SIGSTOP) is found by the health deadline and its request moves on; after
  SIGCONT it rejoins;
- a fault in one request of a batch fails that request only."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from tests.server_process import MODEL, Proc, start_server

pytestmark = pytest.mark.slow
ADMIN = "admin-test-key-0123456789"
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and the sea."}]


def fleet_file(tmp: Path, versions: str, routing: str = "") -> Path:
    path = tmp / "fleet.toml"
    path.write_text(f'[routing]\n{routing}\n[models."{MODEL}"]\n{versions}')
    return path


REPLICAS_2 = """
[models."smollm2-135m-instruct".versions.v1]
weights = "bundled"
traffic = 100
replicas = 2
[models."smollm2-135m-instruct".versions.v1.engine]
kv_cache_gib = 0.1
max_num_seqs = 16
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    # 50 ms per engine step (the workers' step_delay_s fault): a stream provably still runs on
    # its worker when the test has read its first deltas and strikes, however busy the machine
    slow = REPLICAS_2.replace("replicas = 2", 'replicas = 2\nfault_injection = "step_delay_s=0.05"')
    path = fleet_file(tmp_path_factory.mktemp("fleet"), slow)
    proc = start_server(["--fleet", str(path)], env={"SLUICE_ADMIN_KEY": ADMIN})
    wait_warm(proc, 2)
    yield proc
    proc.stop()


def status(proc: Proc) -> dict:
    r = httpx.get(proc.base_url + "/admin/fleet", headers={"authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    return r.json()


def wait_warm(proc: Proc, n: int, timeout: float = 300) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        workers = [w for w in status(proc)["workers"] if w["status"] == "warm"]
        if len(workers) >= n:
            return workers
        assert time.monotonic() < deadline, f"not {n} warm workers: {status(proc)['workers']}"
        time.sleep(0.2)


def serving_worker(proc: Proc, timeout: float = 60) -> dict:
    """The worker that has a request in flight."""
    deadline = time.monotonic() + timeout
    while True:
        busy = [w for w in status(proc)["workers"] if w["inflight"] > 0]
        if busy:
            return busy[0]
        assert time.monotonic() < deadline, "no worker has the request"
        time.sleep(0.05)


def body(max_tokens: int, text: str | None = None, **extra) -> dict:
    messages = STORY if text is None else [{"role": "user", "content": text}]
    return {"model": MODEL, "max_tokens": max_tokens, "messages": messages, "temperature": 0, "stream": True, **extra}


def failed_stream(proc: Proc, payload: dict) -> str:
    """The error type of a stream that fails: an `error` event when the failure came after the
    stream opened, or the same error as the response itself when it came before (a stream opens
    at its first output or after `stream_open_wait_s`: docs/API.md)."""
    with httpx.Client(timeout=300) as c:
        with c.stream("POST", proc.base_url + "/v1/messages", json=payload) as r:
            if not r.headers.get("content-type", "").startswith("text/event-stream"):
                r.read()
                assert r.status_code >= 500, r.text
                return r.json()["error"]["type"]
            events = [line for line in r.iter_lines() if line.startswith(("event:", "data:"))]
    assert events[-2] == "event: error", events[-4:]
    return json.loads(events[-1].removeprefix("data:"))["error"]["type"]


def stream(proc: Proc, payload: dict, on_delta=None) -> tuple[list[str], str, dict]:
    """(event names, text, final message_delta) of one streamed reply."""
    names, text, final = [], [], {}
    with httpx.Client(timeout=300) as c, connect_sse(c, "POST", proc.base_url + "/v1/messages", json=payload) as es:
        for sse in es.iter_sse():
            names.append(sse.event)
            data = json.loads(sse.data)
            if sse.event == "content_block_delta":
                text.append(data["delta"]["text"])
                if on_delta is not None:
                    on_delta(len(text))
            elif sse.event == "message_delta":
                final = data
    return names, "".join(text), final


def test_a_worker_killed_mid_stream_is_invisible_to_its_clients(fleet) -> None:
    reference_names, reference, ref_final = stream(fleet, body(60))
    assert reference_names[-1] == "message_stop" and ref_final["usage"]["output_tokens"] == 60
    killed: list[int] = []

    def kill_after_five(n: int) -> None:
        if n == 5 and not killed:
            victim = serving_worker(fleet)
            os.kill(victim["pid"], signal.SIGKILL)
            killed.append(victim["pid"])

    with ThreadPoolExecutor(4) as pool:  # other requests share the workers, running and queued
        others = [pool.submit(stream, fleet, body(40, f"Count slowly from {i} to {i + 30}.")) for i in range(3)]
        names, text, final = stream(fleet, body(60), kill_after_five)
        for f in others:
            other_names, other_text, _ = f.result()
            assert other_names[-1] == "message_stop" and "error" not in other_names and other_text
    assert killed, "the kill never happened"
    assert "error" not in names and names[-1] == "message_stop"
    assert text == reference, "the migrated stream differs from an uninterrupted run"
    assert final["usage"]["output_tokens"] == 60 and final["delta"]["stop_reason"] == "max_tokens"
    assert "migrating" in fleet.log()
    wait_warm(fleet, 2)  # the supervisor restarted the killed worker, and it is warm again


def test_a_hung_worker_is_found_by_its_health_deadline_and_rejoins(fleet) -> None:
    wait_warm(fleet, 2)
    reference = stream(fleet, body(40, "Describe a quiet harbour at dawn."))[1]
    stopped: list[int] = []

    def stop_after_three(n: int) -> None:
        if n == 3 and not stopped:
            victim = serving_worker(fleet)
            os.kill(victim["pid"], signal.SIGSTOP)
            stopped.append(victim["pid"])

    try:
        names, text, _ = stream(fleet, body(40, "Describe a quiet harbour at dawn."), stop_after_three)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert stopped and names[-1] == "message_stop" and "error" not in names, fleet.log()[-6000:]
    assert text == reference
    assert "missed" in fleet.log()  # given up by the health deadline, not by a broken connection
    wait_warm(fleet, 2)  # SIGCONT: it answers again and takes traffic


def test_a_fault_in_one_request_fails_only_that_request(tmp_path):
    versions = REPLICAS_2.replace("replicas = 2", 'replicas = 1\nfault_injection = "fail_seed=13"')
    proc = start_server(["--fleet", str(fleet_file(tmp_path, versions))], env={"SLUICE_ADMIN_KEY": ADMIN})
    try:
        wait_warm(proc, 1)
        with ThreadPoolExecutor(3) as pool:
            ok = [
                pool.submit(stream, proc, body(30, f"Name {n} fruits.", temperature=0.7, seed=s))
                for n, s in ((3, 5), (4, 7))
            ]
            bad = pool.submit(failed_stream, proc, body(30, "Name five fruits.", temperature=0.7, seed=13))
            for f in ok:
                names, text, _ = f.result()
                assert names[-1] == "message_stop" and text
            assert bad.result() == "api_error"
        assert "failing it alone" in proc.log()
    finally:
        proc.stop()
