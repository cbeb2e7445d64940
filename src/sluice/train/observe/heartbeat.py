"""Each rank's liveness, for the launcher's watchdog (train/watchdog.py): a daemon thread rewrites
RUN/heartbeats/g{GROUP}-r{RANK}.json every tenth of `hang_timeout` with a counter that grows.

A thread, not the training loop: a rank legitimately waits in a collective for a slow peer, a
checkpoint or a quorum, and a loop heartbeat would make the waiting peers look hung along with
the culprit. A stopped process (SIGSTOP, a frozen VM, a debugger) stops every thread, so its
counter alone stalls and the watchdog names exactly that rank. The file also says the rank's
step and phase, for the report. torchrun's own monitor only sees processes that exited.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

HEARTBEATS = "heartbeats"


def beat_interval(hang_timeout: float) -> float:
    return min(5.0, max(0.2, hang_timeout / 10))


def heartbeat_path(run_dir: Path, group: int, rank: int) -> Path:
    return run_dir / HEARTBEATS / f"g{group}-r{rank}.json"


class Heartbeat:
    def __init__(self, run_dir: Path, group: int, rank: int, hang_timeout: float):
        self.path = heartbeat_path(run_dir, group, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.record = {
            "group": group,
            "rank": rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "beat": 0,
            "step": 0,
            "phase": "setup",
        }
        self.beats = 0  # the record's "beat": heartbeats written
        self.interval = beat_interval(hang_timeout)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-heartbeat", daemon=True)
        self._write()
        self._thread.start()

    def at(self, step: int, phase: str) -> None:
        """What the training loop is doing now (read by the next beat)."""
        self.record["step"], self.record["phase"] = step, phase

    def _write(self) -> None:
        self.beats += 1
        self.record["beat"] = self.beats
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.record))
        os.replace(tmp, self.path)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._write()
            except OSError:  # a full or vanished volume: the watchdog will see the silence
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.path.unlink(missing_ok=True)  # a rank that exits is not hung
