"""Local replicas: `sluice search shard` child processes the router starts, watches and restarts.

Each local replica gets a fixed port (picked free at start) and a data folder
`<data_dir>/<shard>/replica-<i>`, both kept across restarts, so a restarted replica comes back
at the same URL with its log and index and catches up on what it missed. A replica that exits
is restarted after a back-off that doubles with each exit within 30 s of the ones before
(0.5 s … 10 s) and never gives up: the restart policy of serving's workers (common/backoff.py),
without its bound, since a router without a shard's replicas serves nothing of that shard.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sluice.common.backoff import RestartBackoff
from sluice.common.ports import free_port
from sluice.parent_death import tied_to_this_process
from sluice.search.index.schema import Schema

log = logging.getLogger("sluice.search.router")


@dataclasses.dataclass(slots=True)
class LocalReplica:
    name: str
    port: int
    data_dir: Path
    proc: subprocess.Popen | None = None
    backoff: RestartBackoff = dataclasses.field(
        default_factory=lambda: RestartBackoff(max_restarts=None, window_s=30.0, base_s=0.5, max_s=10.0)
    )
    next_start: float = 0.0  # when an exited replica restarts (0.0: not waiting to)
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Supervisor:
    def __init__(
        self, data_dir: Path, schema: Schema, log_dir: Path | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.data_dir = data_dir
        self.clock = clock
        self.schema = schema
        self.log_dir = log_dir or data_dir / "logs"
        self.replicas: list[LocalReplica] = []

    def add(self, shard: str, index: int) -> LocalReplica:
        r = LocalReplica(f"{shard}/{index}", free_port(), self.data_dir / shard / f"replica-{index}")
        self.replicas.append(r)
        return r

    def start_added(self, shard: str) -> LocalReplica:
        """A new replica for `shard` (hot-shard policy): a fresh data folder, started now; it
        catches up from a peer's log before it serves (replication/health_poller.py)."""
        index = 1 + max((int(r.name.split("/")[1]) for r in self.replicas if r.name.split("/")[0] == shard), default=-1)
        r = self.add(shard, index)
        if r.data_dir.exists():
            shutil.rmtree(r.data_dir)  # a leftover of an earlier run's added replica
        self._spawn(r)
        return r

    def remove(self, url: str) -> None:
        """Stop a replica for good and delete its data (an added replica, no longer needed)."""
        r = next(x for x in self.replicas if x.url == url)
        self.replicas.remove(r)
        if r.proc is not None and r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
            try:
                r.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
        shutil.rmtree(r.data_dir, ignore_errors=True)

    def _spawn(self, r: LocalReplica) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_dir / f"{r.name.replace('/', '-')}.log", "ab")
        cmd = [
            sys.executable,
            "-m",
            "sluice.cli",
            "search",
            "shard",
            "--listen",
            f"127.0.0.1:{r.port}",
            "--data",
            str(r.data_dir),
            "--schema",
            json.dumps(self.schema.to_json()),
        ]
        r.proc = subprocess.Popen(
            tied_to_this_process() + cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()

    def start_all(self) -> None:
        """Call from the thread that will live as long as the router (PR_SET_PDEATHSIG follows
        the spawning thread)."""
        for r in self.replicas:
            self._spawn(r)

    def check(self) -> list[LocalReplica]:
        """Restart replicas that exited (respecting their back-off); returns those restarted."""
        now = self.clock()
        restarted = []
        for r in self.replicas:
            if r.proc is None or r.proc.poll() is None:
                continue
            if r.next_start == 0.0:
                delay = r.backoff.on_exit(now) or 0.0  # never None: no bound
                r.next_start = now + delay
                log.warning("local replica %s exited with %s; restarting it in %.1fs", r.name, r.proc.returncode, delay)
            if now >= r.next_start:
                r.next_start = 0.0
                r.restarts += 1
                self._spawn(r)
                restarted.append(r)
        return restarted

    def pids(self) -> dict[str, int]:
        return {r.name: r.proc.pid for r in self.replicas if r.proc is not None and r.proc.poll() is None}

    def stop_all(self, timeout_s: float = 10.0) -> None:
        for r in self.replicas:
            if r.proc is not None and r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + timeout_s
        for r in self.replicas:
            if r.proc is None:
                continue
            try:
                r.proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
