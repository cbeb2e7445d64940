"""Deterministic faults for the fault-tolerance tests, never for production.

SLUICE_TRAIN_FAULT holds comma-separated faults:
- `kill:RANK:STEP`: rank RANK kills itself with SIGKILL at the start of step STEP, in the
  group's first attempt only (torchrun's restart count 0), after any checkpoint in flight is on
  disk: a crash at a known point, so the test's expectations are exact, not a race with a timer.
- `delay:SECONDS`: every step takes at least this long, so a test can signal a run mid-way.
- `hold:WORLD:STEP`: while the group has WORLD ranks, wait at the start of step STEP (after any
  checkpoint in flight is written) until the group is told to stop (SIGTERM: the agent restarts
  it because a machine joined) or a peer is gone (the waiting all-reduce fails): a membership
  change at a known step, for the elastic test.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Callable

ENV = "SLUICE_TRAIN_FAULT"


@dataclass(frozen=True, slots=True)
class Faults:
    kill: tuple[int, int] | None = None  # (rank, step)
    delay_s: float = 0.0
    holds: tuple[tuple[int, int], ...] = ()  # (world size, step)


def parse(spec: str | None) -> Faults:
    kill, delay, holds = None, 0.0, []
    for item in filter(None, (spec or "").split(",")):
        kind, *args = item.split(":")
        if kind == "kill" and len(args) == 2:
            kill = (int(args[0]), int(args[1]))
        elif kind == "delay" and len(args) == 1:
            delay = float(args[0])
        elif kind == "hold" and len(args) == 2:
            holds.append((int(args[0]), int(args[1])))
        else:
            raise ValueError(f"{ENV}: unknown fault {item!r} (kill:RANK:STEP, delay:SECONDS, hold:WORLD:STEP)")
    return Faults(kill, delay, tuple(holds))


def at_step_start(rank: int, step: int, before_kill) -> None:
    faults = parse(os.environ.get(ENV))
    if faults.delay_s:
        time.sleep(faults.delay_s)
    if faults.kill == (rank, step) and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
        before_kill()
        os.kill(os.getpid(), signal.SIGKILL)


def hold(step: int, world: int, stopping: Callable[[], bool], before: Callable[[], None]) -> None:
    if (world, step) not in parse(os.environ.get(ENV)).holds:
        return
    import torch
    import torch.distributed as dist

    before()
    while True:  # every rank polls together; a dead peer makes the all-reduce fail
        flag = torch.tensor([float(stopping())])
        dist.all_reduce(flag)
        if flag.item() > 0:
            return
        time.sleep(0.1)
