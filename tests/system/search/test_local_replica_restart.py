"""A local replica that exits is restarted on the shared back-off (common/backoff.py): 0.5 s after
its first exit, twice that after a second exit within 30 s, then at its old URL with its data.
Real `sluice search shard` children; the supervisor's clock is the test's, so the back-off is
checked without waiting for it."""

from __future__ import annotations

import os
import signal
import time

import httpx

from sluice.search.index.schema import Schema
from sluice.search.router.replication.supervisor import Supervisor
from tests.clock import FakeClock

WAIT_S = 60.0


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _kill_and_wait(replica) -> None:
    os.kill(replica.proc.pid, signal.SIGKILL)
    replica.proc.wait(WAIT_S)


def _serves(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_exited_replica_restarts_after_a_doubling_back_off(tmp_path):
    clock = FakeClock(1000.0)
    sup = Supervisor(tmp_path, Schema(default_fields=("title", "body")), clock=clock)
    replica = sup.add("a", 0)
    sup.start_all()
    try:
        _wait(lambda: _serves(replica.url), "the replica to serve")
        for delay in (0.5, 1.0):  # the second exit is within 30 s of the first: twice the wait
            _kill_and_wait(replica)
            assert sup.check() == []  # exited: its restart is due `delay` from now
            clock.t += delay / 2  # (halves: exact in binary)
            assert sup.check() == []
            clock.t += delay / 2
            assert sup.check() == [replica] and replica.restarts == (1 if delay == 0.5 else 2)
            _wait(lambda: _serves(replica.url), "the restarted replica to serve at its old URL")
        clock.t += 31  # a quiet spell: back to the base delay
        _kill_and_wait(replica)
        assert sup.check() == []
        clock.t += 0.5
        assert sup.check() == [replica]
    finally:
        sup.stop_all()
