"""Deterministic faults for the fault-tolerance tests, never for production.

SLUICE_TRAIN_FAULT="kill:RANK:STEP" makes rank RANK kill itself with SIGKILL at the start of
step STEP, in the group's first attempt only (torchrun's restart count 0), after any
checkpoint in flight is on disk: a crash at a known point, so the test's expectations are
exact rather than a race with a timer.
"""

from __future__ import annotations

import os
import signal

ENV = "SLUICE_TRAIN_FAULT"


def parse(spec: str | None) -> tuple[int, int] | None:
    if not spec:
        return None
    kind, rank, step = spec.split(":")
    if kind != "kill":
        raise ValueError(f"{ENV}: unknown fault {kind!r} (kill:RANK:STEP)")
    return int(rank), int(step)


def maybe_kill(rank: int, step: int, before_kill) -> None:
    fault = parse(os.environ.get(ENV))
    if fault is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != 0:
        return
    if fault == (rank, step):
        before_kill()
        os.kill(os.getpid(), signal.SIGKILL)
