"""The launcher's watchdog: a rank whose heartbeat (train/observe/heartbeat.py) stops for
`hang_timeout` is reported by rank, group, host and pid, and killed; its torchrun then restarts
it. With replica groups that evicts the group (the others went on without it after the quorum's
join timeout) and it recovers from a live peer; without, the job restarts from the newest
checkpoint (torchrun's --max-restarts). Never a silent hang.

Only the launcher's own machine's ranks are watched (their pids mean something here, and each
machine's launcher watches its own), each against the launcher's clock: no clocks are compared
across machines. A heartbeat file whose process has exited is left to torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sluice.train.observe.heartbeat import HEARTBEATS


@dataclass(slots=True)
class _Seen:
    pid: int
    beat: int
    since: float  # the launcher's clock when this beat was first seen


@dataclass(frozen=True, slots=True)
class Hang:
    group: int
    rank: int
    host: str
    pid: int
    step: int
    phase: str
    silent_s: float


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descends_from(pid: int, ancestors: set[int]) -> bool:
    """Is `pid` a descendant of one of `ancestors` (Linux /proc; elsewhere assumed so)?"""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    seen = 0
    while pid > 1 and seen < 64:
        if pid in ancestors:
            return True
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            return False
        pid = int(stat.rpartition(")")[2].split()[1])  # the field after the command name: ppid
        seen += 1
    return pid in ancestors


class Watchdog:
    def __init__(
        self,
        run_dir: Path,
        hang_timeout: float,
        ancestors: Callable[[], set[int]],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.dir = run_dir / HEARTBEATS
        self.timeout = hang_timeout
        self.ancestors = ancestors  # the pids of this launcher's torchruns: only their ranks are killed
        self.clock = clock
        self.host = socket.gethostname()
        self._seen: dict[str, _Seen] = {}

    def clear(self) -> None:
        """At the start: heartbeats this machine's ranks left behind in an earlier run."""
        for path in self.dir.glob("*.json") if self.dir.is_dir() else ():
            record = _read(path)
            if record is None or record.get("host") == self.host:
                path.unlink(missing_ok=True)

    def poll(self) -> list[Hang]:
        """The ranks found hung since the last poll (each already killed)."""
        now, found = self.clock(), []
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else ():
            record = _read(path)
            if record is None or record.get("host") != self.host:
                continue
            pid, beat = int(record["pid"]), int(record["beat"])
            seen = self._seen.get(path.name)
            if seen is None or seen.pid != pid or seen.beat != beat:
                self._seen[path.name] = _Seen(pid, beat, now)
                continue
            if now - seen.since < self.timeout or not _alive(pid) or not descends_from(pid, self.ancestors()):
                continue
            found.append(
                Hang(
                    int(record["group"]),
                    int(record["rank"]),
                    self.host,
                    pid,
                    int(record["step"]),
                    str(record["phase"]),
                    now - seen.since,
                )
            )
            os.kill(pid, signal.SIGKILL)  # a stopped process dies too; its torchrun restarts the group
            path.unlink(missing_ok=True)
            del self._seen[path.name]
        return found


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # being replaced, or gone
