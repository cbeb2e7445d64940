"""Deterministic faults for the fault-tolerance tests, never for production.

SLUICE_TRAIN_FAULT holds comma-separated faults:
- `kill:RANK:STEP[:GROUP]`: rank RANK (of replica group GROUP, default 0) kills itself with
  SIGKILL at the start of step STEP, in the group's first attempt only (torchrun's restart count
  0), after any checkpoint in flight is on disk: a crash at a known point, so the test's
  expectations are exact, not a race with a timer.
- `await_group:GROUP:STEP`: the other replica groups wait at the start of step STEP (before its
  quorum; at most 300 s) until group GROUP, restarted by its torchrun, is waiting for its first
  quorum (or past it, if it restarted fast enough to rejoin earlier): the rejoin happens at STEP
  at the latest.
- `delay:SECONDS`: every step takes at least this long, so a test can signal a run mid-way.
- `hold:WORLD:STEP`: while the group has WORLD ranks, wait at the start of step STEP (after any
  checkpoint in flight is written) until the group is told to stop (SIGTERM: the agent restarts
  it because a machine joined) or a peer is gone (the waiting all-reduce fails): a membership
  change at a known step, for the elastic test.
- `nan_loss:STEP`: at step STEP the loss and every gradient are NaN (as a forward that produced
  NaN leaves them), after the backward pass.
- `inf_grad:STEP`: at step STEP one gradient element is +inf (an overflow in the backward pass),
  the loss finite.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

ENV = "SLUICE_TRAIN_FAULT"


class FaultPoint(str, enum.Enum):
    """Where in a step the trainer offers the faults a chance to act (train/trainer.py)."""

    STEP_START = "step_start"  # before the step's rows are read (and its quorum): kill, delay, hold, await_group
    AFTER_BACKWARD = "after_backward"  # the step's loss and gradients are there: nan_loss, inf_grad


@dataclass(slots=True)
class FaultSite:
    """What a fault may act on at a point."""

    rank: int
    world: int
    step: int
    group: int  # the replica group (0 without)
    run_dir: Any  # the run folder (Path)
    stopping: Callable[[], bool]  # has the group been told to stop?
    settle: Callable[[], None]  # finish the checkpoint in flight (before a kill or a hold)
    loss_sum: Any = None  # AFTER_BACKWARD: the step's summed loss (a float64 tensor)
    params: Iterable = ()  # AFTER_BACKWARD: the parameters whose gradients are set


@dataclass(frozen=True, slots=True)
class Faults:
    kill: tuple[int, int, int] | None = None  # (rank, step, replica group)
    delay_s: float = 0.0
    holds: tuple[tuple[int, int], ...] = ()  # (world size, step)
    nan_loss: int | None = None  # step
    inf_grad: int | None = None  # step
    await_group: tuple[int, int] | None = None  # (replica group, step)


def parse(spec: str | None) -> Faults:
    kill, delay, holds, steps, await_group = None, 0.0, [], {}, None
    for item in filter(None, (spec or "").split(",")):
        kind, *args = item.split(":")
        if kind == "kill" and len(args) in (2, 3):
            kill = (int(args[0]), int(args[1]), int(args[2]) if len(args) == 3 else 0)
        elif kind == "await_group" and len(args) == 2:
            await_group = (int(args[0]), int(args[1]))
        elif kind == "delay" and len(args) == 1:
            delay = float(args[0])
        elif kind == "hold" and len(args) == 2:
            holds.append((int(args[0]), int(args[1])))
        elif kind in ("nan_loss", "inf_grad") and len(args) == 1:
            steps[kind] = int(args[0])
        else:
            raise ValueError(f"{ENV}: unknown fault {item!r} "
                             "(kill:RANK:STEP[:GROUP], await_group:GROUP:STEP, delay:SECONDS, hold:WORLD:STEP, "
                             "nan_loss:STEP, inf_grad:STEP)")
    return Faults(kill, delay, tuple(holds), **steps, await_group=await_group)


def at_step_start(site: FaultSite) -> None:
    faults = parse(os.environ.get(ENV))
    if faults.delay_s:
        time.sleep(faults.delay_s)
    if faults.kill == (site.rank, site.step, site.group) and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
        site.settle()
        os.kill(os.getpid(), signal.SIGKILL)
    if faults.await_group is not None and faults.await_group[1] == site.step and faults.await_group[0] != site.group:
        _await_rejoin(site.run_dir, faults.await_group[0])


def _await_rejoin(run_dir, group: int) -> None:
    import json

    from sluice.train.observe.heartbeat import heartbeat_path

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            record = json.loads(heartbeat_path(run_dir, group, 0).read_text())
            if record["restart"] >= 1 and record["phase"] in ("join", "quorum", "step"):
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)


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


def after_backward(step: int, loss_sum, params) -> None:
    """Make the step's loss (a float64 tensor, changed in place) or gradients non-finite."""
    faults = parse(os.environ.get(ENV))
    if step not in (faults.nan_loss, faults.inf_grad):
        return
    grads = [p.grad for p in params if p.grad is not None]
    if step == faults.nan_loss:
        loss_sum.fill_(float("nan"))
        for g in grads:
            g.fill_(float("nan"))
    elif grads:
        g = grads[0].to_local() if hasattr(grads[0], "to_local") else grads[0]
        g.view(-1)[0] = float("inf")


def fire(point: FaultPoint, site: FaultSite) -> None:
    """Run the faults SLUICE_TRAIN_FAULT names for `point`."""
    if point is FaultPoint.STEP_START:
        at_step_start(site)
        hold(site.step, site.world, site.stopping, site.settle)
    elif point is FaultPoint.AFTER_BACKWARD:
        after_backward(site.step, site.loss_sum, site.params)
