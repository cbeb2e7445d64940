"""What one step did, agreed by every rank, for the trainer's checkpoint and log phases."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sluice.train.parallel.dims import ParallelDims


@dataclass(slots=True)
class StepOutcome:
    """What one step did, agreed by every rank, for the checkpoint and log phases."""

    step: int
    lr: float
    rows: list[int]  # the global batch
    tokens: int  # its trained tokens
    loss: float  # the global batch's mean loss (NaN when not finite)
    norm: float  # the global gradient norm before clipping
    stopped: bool  # a rank was told to stop: checkpoint and exit after this step
    nonfinite: bool  # a rank saw a loss or norm that is not finite: the update was dropped
    lease_lost: bool  # another group took the run: write nothing more
    retry: bool  # replica groups: the step was not committed (a peer failed): it runs again
    groups: list[int] | None  # replica groups that took part (None: no replica groups)
    rank_times: list[float]  # each rank's forward + backward seconds (stragglers)
    extra_bytes: int  # sent across replica groups
    started: float  # perf_counter at the step's start
    cpu_started: float  # process_time at the step's start
    data_time: float
    train_time: float  # forward, backward, clip, the closing all-reduce, the update
    comm_wait: float  # communication waited for


def nonfinite_message(o: StepOutcome, store) -> str:
    """The halt of a run whose step was not finite, naming its newest checkpoint."""
    what = " and ".join(
        f"the {name} is {value}"
        for name, value in (("loss", o.loss), ("gradient norm", o.norm))
        if not math.isfinite(value)
    )
    saved = store.complete_steps()
    newest = store.step_name(saved[-1]) if saved else "none"
    return (
        f"step {o.step}: {what or 'a rank saw a value that is not finite'}: the run stopped before the "
        f"step's update, saving nothing; the newest checkpoint is {newest} "
        '(nonfinite = "skip", or --nonfinite skip, drops such steps and goes on)'
    )


def agree(
    loss_sum: float, norm: float, compute: float, stop: bool, lost: bool, dims: ParallelDims, rank: int
) -> tuple[tuple[float, bool, bool, bool], float, list[float]]:
    """The step's one small all-reduce, before the update: (the global loss sum, stop, a value
    not finite, a lost lease), the seconds it took, and each rank's compute seconds (one slot
    per rank, for the stragglers)."""
    bad = not (math.isfinite(loss_sum) and math.isfinite(norm))
    flags = torch.zeros(4 + dims.world, dtype=torch.float64)
    flags[:4] = torch.tensor([loss_sum / dims.loss_copies, float(stop), float(bad), float(lost)])
    flags[4 + rank] = compute
    started = time.perf_counter()
    if dims.world > 1:  # one process has nothing to agree with (a gloo call costs ~1-5 ms)
        dist.all_reduce(flags)
    total, stopped, nonfinite, taken, *times = flags.tolist()
    return (total, stopped > 0, nonfinite > 0, taken > 0), time.perf_counter() - started, times
