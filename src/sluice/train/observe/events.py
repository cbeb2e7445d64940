"""RUN/events.jsonl: what happened to the run besides its steps, one JSON line per event.

Every rank and group may append (a rank started, a checkpoint published, a replica group left or
recovered, a step not committed, a hang found); the launcher reads the file and prints a line per
event on its terminal (train/observe/progress.py). Each line is one os.write on a file opened
with O_APPEND, so lines from several processes never interleave, on a local or a shared volume
(the run folder is shared across machines anyway). Not for every step: metrics.jsonl has those.
"""

from __future__ import annotations

import enum
import json
import os
import socket
from pathlib import Path

EVENTS = "events.jsonl"


class Event(str, enum.Enum):
    STARTED = "started"  # a rank's process began (pid, host, group, restart)
    RESTORED = "restored"  # a group loaded a checkpoint from the store (step)
    HEALED = "healed"  # a replica group took a live peer's weights and optimizer state (step)
    GROUPS = "groups"  # the replica groups that took part changed (step, groups, before)
    RETRY = "retry"  # a step was not committed (a peer failed during it): it runs again
    CHECKPOINT = "checkpoint"  # a checkpoint was published (step)
    LEFT = "left"  # a replica group left at a step boundary (a stop signal: spot notice)
    HANG = "hang"  # the launcher's watchdog found a rank that stopped making progress
    DIGEST = "digest"  # a rank's parameters' sha256 (when groups change or one healed, and at the end)
    BASE = "base"  # a LoRA run: a rank's frozen base tensors' sha256 at the start and the end (model/lora.py)
    FINISHED = "finished"  # a group reached max_steps


class EventLog:
    def __init__(self, run_dir: Path, group: int = 0, rank: int = 0):
        self.path = run_dir / EVENTS
        self.group, self.rank = group, rank
        self.host = socket.gethostname()

    def emit(self, kind: Event, **fields: object) -> None:
        record = {"event": kind.value, "group": self.group, "rank": self.rank, "host": self.host, **fields}
        line = (json.dumps(record, allow_nan=False, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write: whole lines, whichever process appends
        finally:
            os.close(fd)


def read_events(run_dir: Path, offset: int = 0) -> tuple[list[dict], int]:
    """Events from byte `offset` on (whole lines only), and the offset after them."""
    path = run_dir / EVENTS
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out, offset + end
