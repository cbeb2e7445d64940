"""One group at a time on a run: a lease on its checkpoints, held by the group's leader (rank 0).

Two torchrun groups on one run folder (a joining agent that formed a group of its own while the
rendezvous host was stalled) deleted each other's checkpoints in flight. Now rank 0 takes a lease
before anything in the run is read or written, renews it every third of `lease_timeout` from a
background thread, checks it before publishing a checkpoint, and releases it at exit. The record
(`lease.json` beside the checkpoints, or in the bucket) names the holder: host, pid, the process's
start time, a random token, and a heartbeat counter. It changes only by compare-and-swap: under
an flock for a folder, by S3's conditional writes (If-Match / If-None-Match) for a bucket.

Whether a holder is alive is judged without comparing clocks across machines: a leader that
finds the lease held watches it; if the record changes (the holder renewed), the holder is alive
and this group halts naming it; if it stays unchanged for `lease_timeout` by this process's own
clock, the holder is gone and the lease is taken over. A holder on this very host whose process
no longer runs is gone at once, so a group restarted after a crash (by torchrun, or by running the
command again after kill -9) does not wait. A holder that finds its lease taken (it was stalled
longer than the timeout) stops at the next step without writing (train/trainer.py).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from sluice.train.errors import TrainHaltError

log = logging.getLogger("sluice.train.lease")
LEASE = "lease.json"


@dataclass(frozen=True, slots=True)
class Holder:
    host: str
    pid: int
    started: str | None  # the process's start time (Linux /proc), to tell a reused pid apart
    token: str  # this holding's own id
    beat: int = 0  # bumped at every renewal: a record that changes has a live holder
    since: float = 0.0  # wall-clock time it was taken (for messages only)

    def describe(self) -> str:
        return (
            f"host {self.host}, pid {self.pid}, since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.since))}"
        )

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "host": self.host,
                "pid": self.pid,
                "started": self.started,
                "token": self.token,
                "beat": self.beat,
                "since": self.since,
            }
        ).encode()


def parse_holder(raw: bytes | None) -> Holder | None:
    """The holder a record names (None: released, or unreadable)."""
    try:
        body = json.loads(raw or b"null")
        return (
            Holder(
                str(body["host"]),
                int(body["pid"]),
                body["started"],
                str(body["token"]),
                int(body["beat"]),
                float(body["since"]),
            )
            if isinstance(body, dict) and "token" in body
            else None
        )
    except (ValueError, KeyError, TypeError):
        return None


class LeaseRecords(Protocol):
    """Where a lease record lives, changed only by compare-and-swap."""

    def where(self) -> str: ...

    def read(self) -> tuple[Holder | None, Any]:
        """The holder and the record's version (None: no record)."""

    def write(self, holder: Holder | None, expected: Any) -> bool:
        """Replace the record if its version is still `expected` (None: none may exist); False if
        another wrote since. `holder` None releases it."""


class FileLeaseRecords:
    """The record as a file; the swap is made under an flock (local and NFS file systems)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = path.with_name(f".{path.name}.lock")

    def where(self) -> str:
        return str(self.path)

    def _raw(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def read(self) -> tuple[Holder | None, Any]:
        raw = self._raw()
        return parse_holder(raw), raw

    def write(self, holder: Holder | None, expected: Any) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if self._raw() != expected:
                return False
            if holder is None:
                self.path.unlink(missing_ok=True)
                return True
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(holder.to_json())
            tmp.replace(self.path)  # readers never see half a record
            return True


def _process_start(pid: int) -> tuple[str, str] | None:
    """(start time, state) of a process from /proc (None: no such process, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    after_name = stat.rpartition(")")[2].split()
    return after_name[19], after_name[0]  # fields 22 (starttime) and 3 (state)


def _gone(holder: Holder) -> bool:
    """The holder's process ran on this host and runs no more."""
    if holder.host != socket.gethostname():
        return False
    if not Path("/proc/self/stat").exists():  # no /proc: only the pid can tell
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    found = _process_start(holder.pid)
    return found is None or found[0] != holder.started or found[1] == "Z"


def this_process() -> Holder:
    found = _process_start(os.getpid())
    return Holder(socket.gethostname(), os.getpid(), found[0] if found else None, uuid.uuid4().hex, 0, time.time())


class Lease:
    def __init__(
        self,
        records: LeaseRecords,
        timeout: float,
        me: Holder | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.records, self.timeout = records, timeout
        self.me = me or this_process()
        self.clock, self.sleep = clock, sleep
        self.lost: str | None = None  # who holds it now, once this holder lost it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, say: Callable[[str], None]) -> None:
        """Take the lease, waiting at most `timeout` for a holder that is gone; TrainHaltError
        naming a live holder."""
        seen: tuple[Any, float] | None = None  # the record as first found, and when
        while True:
            holder, version = self.records.read()
            if holder is None or holder.token == self.me.token or _gone(holder):
                if self._take(version):
                    if holder is not None and holder.token != self.me.token:
                        say(
                            f"took over the lease of {self.records.where()} from {holder.describe()}: "
                            "that process no longer runs"
                        )
                    return
                continue  # another took it between our read and write: look again
            if seen is None:
                seen = (version, self.clock())
            elif seen[0] != version:
                raise TrainHaltError(
                    f"{self.records.where()} is held by another group (its leader: {holder.describe()}), which "
                    "renewed it while this group waited: a run admits one group at a time; stop that group "
                    "first, or give this one another --out"
                )
            elif self.clock() - seen[1] >= self.timeout:
                if self._take(version):
                    say(
                        f"took over the lease of {self.records.where()} from {holder.describe()}: "
                        f"not renewed for {self.timeout:g} s"
                    )
                    return
                seen = None
            self.sleep(min(1.0, self.timeout / 10))

    def _take(self, version: Any) -> bool:
        mine = replace(self.me, beat=0, since=time.time())
        if not self.records.write(mine, version):
            return False
        self.me = mine
        return True

    def renew(self) -> bool:
        """Bump the heartbeat if the lease is still ours; False (and `lost` set) if it is not."""
        holder, version = self.records.read()
        if holder is None or holder.token != self.me.token:
            self.lost = holder.describe() if holder else "nobody (it was released)"
            return False
        mine = replace(self.me, beat=self.me.beat + 1)
        if not self.records.write(mine, version):
            return self.renew()  # written in between: look at who wrote
        self.me = mine
        return True

    def held(self) -> bool:
        """Still ours? (read once, before a checkpoint is published)"""
        holder, _ = self.records.read()
        if holder is not None and holder.token == self.me.token:
            return True
        self.lost = holder.describe() if holder else "nobody (it was released)"
        return False

    def start(self) -> None:
        """Renew every third of the timeout from a background thread until released or lost."""
        self._thread = threading.Thread(target=self._beat, name="sluice-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.timeout / 3):
            try:
                if not self.renew():
                    log.warning("lease on %s lost to %s", self.records.where(), self.lost)
                    return
            except Exception as exc:  # a storage hiccup: try again at the next beat
                log.warning("lease on %s not renewed: %s", self.records.where(), exc)

    def release(self) -> None:
        """Best effort (it runs while a run ends, maybe on an error of the same store): a lease
        not released lapses after the timeout, or at once for a restart on this host."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            holder, version = self.records.read()
            if holder is not None and holder.token == self.me.token:
                self.records.write(None, version)
        except Exception as exc:
            log.info("lease on %s not released: %s", self.records.where(), exc)
