"""Deterministic faults for the fault-tolerance tests, never for production.

SLUICE_TRAIN_FAULT holds comma-separated faults:
- `kill:RANK:STEP[:GROUP]`: rank RANK (of replica group GROUP, default 0) kills itself with
  SIGKILL at the start of step STEP, in the group's first attempt only (torchrun's restart count
  0), after any checkpoint in flight is on disk: a crash at a known point, so the test's
  expectations are exact, not a race with a timer.
- `await_group:GROUP:STEP`: group GROUP rejoins at step STEP exactly. The other replica groups
  wait at the start of step STEP (before its quorum) until group GROUP, restarted by its
  torchrun, is at its first quorum; and the restarted group, before its torchft manager exists
  (a manager the Lighthouse knows would make every quorum wait for it), waits until every other
  group waits at STEP, however fast it restarted: a fast restart on a busy machine once rejoined
  a step early and failed a test that counts the steps. Each wait: at most 300 s.
- `delay:SECONDS`: every step takes at least this long, so a test can signal a run mid-way.
- `hold:WORLD:STEP`: while the group has WORLD ranks, wait at the start of step STEP (after any
  checkpoint in flight is written) until the group is told to stop (SIGTERM: the agent restarts
  it because a machine joined) or a peer is gone (the waiting all-reduce fails): a membership
  change at a known step, for the elastic test.
- `nan_loss:STEP`: at step STEP the loss and every gradient are NaN (as a forward that produced
  NaN leaves them), after the backward pass.
- `inf_grad:STEP`: at step STEP one gradient element is +inf (an overflow in the backward pass),
  the loss finite.

The spec is read once, when a rank's Trainer starts (`from_env`; parsed by common/fault_spec.py):
without one the trainer holds None and a step meets one `is None` per fault point — no
environment read, no parsing, nothing built.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.common.fault_spec import FaultGrammar, FaultKind

ENV = "SLUICE_TRAIN_FAULT"
GRAMMAR = FaultGrammar(
    ENV,
    ":",
    (
        FaultKind("kill", "kill:RANK:STEP[:GROUP]", (int, int, int), optional=1),
        FaultKind("await_group", "await_group:GROUP:STEP", (int, int)),
        FaultKind("delay", "delay:SECONDS", (float,)),
        FaultKind("hold", "hold:WORLD:STEP", (int, int)),
        FaultKind("nan_loss", "nan_loss:STEP", (int,)),
        FaultKind("inf_grad", "inf_grad:STEP", (int,)),
    ),
)


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
    for fault in GRAMMAR.parse(spec):
        if fault.name == "kill":
            kill = (*fault.args, 0)[:3]  # the replica group: 0 when left out
        elif fault.name == "await_group":
            await_group = fault.args
        elif fault.name == "delay":
            delay = fault.args[0]
        elif fault.name == "hold":
            holds.append(fault.args)
        else:  # nan_loss, inf_grad
            steps[fault.name] = fault.args[0]
    return Faults(kill, delay, tuple(holds), **steps, await_group=await_group)


def from_env() -> Faults | None:
    """The faults SLUICE_TRAIN_FAULT names, or None when it names none (production)."""
    faults = parse(os.environ.get(ENV))
    return faults if faults != Faults() else None


def at_step_start(faults: Faults, site: FaultSite) -> None:
    if faults.delay_s:
        time.sleep(faults.delay_s)
    if (
        faults.kill == (site.rank, site.step, site.group)
        and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    ):
        site.settle()
        os.kill(os.getpid(), signal.SIGKILL)
    if faults.await_group is not None and faults.await_group[1] == site.step and faults.await_group[0] != site.group:
        _await_rejoin(site.run_dir, faults.await_group[0])


AWAIT_S = 300.0  # each side of await_group waits at most this long


def _await_rejoin(run_dir, group: int) -> None:
    from sluice.train.observe.heartbeat import heartbeat_path

    def back() -> bool:
        record = _record(heartbeat_path(run_dir, group, 0))
        return record.get("restart", 0) >= 1 and record.get("phase") in ("join", "quorum", "step")

    _wait_until(back)


def at_rejoin(faults: Faults, run_dir: Path, group: int) -> None:
    """The restarted group of `await_group` waits, before its torchft manager exists (so that the
    Lighthouse does not wait on a group held here), until every other group (its rank 0's
    heartbeat) waits at the fault's step. Called once by a restarted group's ranks (rank_setup.py)."""
    if faults.await_group is None or faults.await_group[0] != group:
        return
    from sluice.train.observe.heartbeat import HEARTBEATS

    step = faults.await_group[1]
    others = [p for p in (run_dir / HEARTBEATS).glob("g*-r0.json") if p.name != f"g{group}-r0.json"]
    _wait_until(lambda: all(_record(p).get("step", 0) >= step for p in others))


def _record(path) -> dict:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _wait_until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + AWAIT_S
    while time.monotonic() < deadline and not done():
        time.sleep(0.1)


def hold(faults: Faults, step: int, world: int, stopping: Callable[[], bool], before: Callable[[], None]) -> None:
    if (world, step) not in faults.holds:
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


def after_backward(faults: Faults, step: int, loss_sum, params) -> None:
    """Make the step's loss (a float64 tensor, changed in place) or gradients non-finite."""
    if step not in (faults.nan_loss, faults.inf_grad):
        return
    grads = [p.grad for p in params if p.grad is not None]
    if step == faults.nan_loss:
        loss_sum.fill_(float("nan"))
        for g in grads:
            g.fill_(float("nan"))
    elif grads:
        from sluice.train.parallel.local import local_shard  # torch is loaded by now; faults.py loads without it

        local_shard(grads[0]).view(-1)[0] = float("inf")


def fire(faults: Faults, point: FaultPoint, site: FaultSite) -> None:
    """Run `faults` (what SLUICE_TRAIN_FAULT named at start-up) for `point`."""
    if point is FaultPoint.STEP_START:
        at_step_start(faults, site)
        hold(faults, site.step, site.world, site.stopping, site.settle)
    elif point is FaultPoint.AFTER_BACKWARD:
        after_backward(faults, site.step, site.loss_sum, site.params)
