"""The run's lease (train/checkpoint/lease.py) on a real file, with an injected clock: a live
holder is refused by name, a holder that stopped renewing is taken over after the timeout, a
holder on this host whose process is gone at once, and a holder that lost its lease learns it."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from sluice.train.checkpoint.lease import FileLeaseRecords, Holder, Lease, this_process
from sluice.train.errors import TrainHaltError

TIMEOUT = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.on_sleep = lambda: None  # what the rest of the world does while a leader waits

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.on_sleep()


def _lease(path: Path, clock: Clock, host: str | None = None) -> Lease:
    me = this_process()
    if host is not None:  # a leader on another machine
        me = Holder(host, me.pid, me.started, me.token)
    return Lease(FileLeaseRecords(path), TIMEOUT, me=me, clock=clock, sleep=clock.sleep)


def test_a_live_holder_is_refused_by_name(tmp_path: Path):
    clock = Clock()
    first = _lease(tmp_path / "lease.json", clock, host="node-a")
    first.acquire(print)

    def beat() -> None:  # the holder renews every third of the timeout
        if clock.now % (TIMEOUT / 3) < 1.0:
            first.renew()

    clock.on_sleep = beat
    with pytest.raises(TrainHaltError, match="held by another group \\(its leader: host node-a, pid "):
        _lease(tmp_path / "lease.json", clock).acquire(print)
    assert clock.now <= TIMEOUT / 3 + 1.0, "refused as soon as the holder renewed"
    assert first.held()


def test_a_holder_that_stopped_renewing_is_taken_over_after_the_timeout(tmp_path: Path):
    clock = Clock()
    said: list[str] = []
    first = _lease(tmp_path / "lease.json", clock, host="node-a")
    first.acquire(print)
    second = _lease(tmp_path / "lease.json", clock)
    second.acquire(said.append)
    assert TIMEOUT <= clock.now <= TIMEOUT + 1.0
    assert said and "from host node-a" in said[0] and "not renewed for 30 s" in said[0]
    assert not first.renew() and first.lost is not None and f"host {socket.gethostname()}" in first.lost
    assert not first.held() and second.held()
    first.release()  # not its own any more: left alone
    assert second.held()


def test_a_holder_on_this_host_whose_process_is_gone_is_taken_over_at_once(tmp_path: Path):
    clock = Clock()
    records = FileLeaseRecords(tmp_path / "lease.json")
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert records.write(Holder(socket.gethostname(), dead.pid, "gone", "old-token", 7, time.time()), None)
    said: list[str] = []
    _lease(tmp_path / "lease.json", clock).acquire(said.append)
    assert clock.now == 0.0 and "that process no longer runs" in said[0]


def test_release_frees_it_and_a_swap_has_one_winner(tmp_path: Path):
    clock = Clock()
    path = tmp_path / "lease.json"
    lease = _lease(path, clock)
    lease.acquire(print)
    lease.release()
    assert not path.exists()
    records = FileLeaseRecords(path)
    holder, version = records.read()
    assert holder is None and version is None
    assert records.write(this_process(), version)
    assert not records.write(this_process(), version), "the second writer saw a stale version"
