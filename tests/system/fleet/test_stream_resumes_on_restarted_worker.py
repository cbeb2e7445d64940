"""A stream whose only worker dies continues on that worker once it is back at the same
address (real processes: `sluice serve --fleet` with one remote `sluice worker`, kill -9, and a
new `sluice worker` started on the same address).

The restarted worker is a new incarnation (the gateway took the lost one down at once and saw
the new one come up and warm): the stream continues on it as soon as it is warm, not after half
of `migration_wait_s`. The wait is set to 600 s here, so a continuation that came from the old
half-wait timer would come 300 s after the kill: the test bounds the resumption well below that
(a generous bound, whatever this machine's speed: a worker restart takes seconds) and checks the
mechanism, not a speed. The whole reply equals an uninterrupted greedy run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from tests.fleet_process import ADMIN, remote_version, status, wait_until
from tests.server_process import MODEL, Proc, free_port, start_server, start_worker

pytestmark = pytest.mark.slow
MIGRATION_WAIT_S = 600.0
HALF_WAIT_S = MIGRATION_WAIT_S / 2
MAX_TOKENS = 60
# 40 ms per engine step: the stream provably still runs when the test has read its first deltas
WORKER_ARGS = ["--kv-cache-gib", "0.1", "--max-num-seqs", "8", "--fault-injection", "step_delay_s=0.04"]
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and the sea."}]


def stream(proc: Proc, on_delta=None) -> tuple[list[str], str, dict, list[float]]:
    """(event names, text, final message_delta, arrival time of each delta)."""
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": STORY, "temperature": 0, "stream": True}
    names, text, final, times = [], [], {}, []
    with (
        httpx.Client(timeout=HALF_WAIT_S) as c,
        connect_sse(c, "POST", proc.base_url + "/v1/messages", json=body) as es,
    ):
        for sse in es.iter_sse():
            names.append(sse.event)
            data = json.loads(sse.data)
            if sse.event == "content_block_delta":
                text.append(data["delta"]["text"])
                times.append(time.monotonic())
                if on_delta is not None:
                    on_delta(len(text))
            elif sse.event in ("message_delta", "error"):
                final = data
    return names, "".join(text), final, times


def test_a_stream_continues_on_its_worker_restarted_at_the_same_address(tmp_path: Path):
    address = f"127.0.0.1:{free_port()}"
    workers = [start_worker(address, WORKER_ARGS)]
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        f"[routing]\nmigration_wait_s = {MIGRATION_WAIT_S:g}\n" + remote_version(MODEL, "v1", 100, address)
    )
    server = start_server(["--fleet", str(fleet)], env={"SLUICE_ADMIN_KEY": ADMIN})
    restarted = threading.Event()
    killed_at: list[float] = []

    def restart() -> None:  # a new process on the same address, as an operator or a supervisor would
        workers.append(start_worker(address, WORKER_ARGS))
        restarted.set()

    def kill_after_five(n: int) -> None:
        if n == 5 and not killed_at:
            os.kill(workers[0].process.pid, signal.SIGKILL)
            killed_at.append(time.monotonic())
            threading.Thread(target=restart, daemon=True).start()

    try:
        wait_until(
            lambda: [w for w in status(server)["workers"] if w["status"] == "warm"], "the worker to warm up", 300
        )
        reference_names, reference, ref_final, _ = stream(server)
        assert reference_names[-1] == "message_stop" and ref_final["usage"]["output_tokens"] == MAX_TOKENS

        names, text, final, times = stream(server, kill_after_five)
        assert killed_at and restarted.is_set()
        assert "error" not in names, final
        assert names[-1] == "message_stop" and final["usage"]["output_tokens"] == MAX_TOKENS
        assert text == reference  # greedy: token for token what an uninterrupted run says
        # the continuation came from the worker's return, not from the half-wait timer
        resumed = [t for a, t in zip(times, times[1:]) if t - a == max(b - a for a, b in zip(times, times[1:]))][0]
        assert resumed - killed_at[0] < HALF_WAIT_S / 2, f"resumed {resumed - killed_at[0]:.1f} s after the kill"
        log = server.log()
        assert "lost after" in log and "migrating" in log
        workers[0].process.wait(10)
        assert workers[0].process.returncode == -signal.SIGKILL
    finally:
        server.stop()
        for w in workers:
            w.stop()
