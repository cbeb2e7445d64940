"""The log phase's line: one step's metrics (train/metrics.py) from its parts, what the step did
(outcome.py), where its time went (observe/step_split.py), how the ranks' compute times spread
(observe/stragglers.py) and its FLOPs against the ranks' peak (observe/flops.py). Each part
names its own columns; this module adds the step's counts and rates."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sluice.train.data import sampler
from sluice.train.metrics import StepMetrics
from sluice.train.observe.flops import mfu, step_flops
from sluice.train.observe.step_split import split_step
from sluice.train.observe.stragglers import spread
from sluice.train.outcome import StepOutcome
from sluice.train.settings import TrainSettings


@dataclass(frozen=True, slots=True)
class StepLine:
    """What every step's line is computed against: fixed for the run (an elastic restart builds
    a new one)."""

    settings: TrainSettings
    world: int  # ranks in this replica group's process group
    rows: int  # rows in the data set (the epoch)
    params: int  # matmul parameters, N of 6·N·D (observe/flops.py)
    peak: float  # FLOP/s per rank

    def metrics(self, o: StepOutcome, comm_bytes: int, comm_time: float | None, checkpoint_time: float) -> StepMetrics:
        s = self.settings
        elapsed = time.perf_counter() - o.started
        # with replica groups: the rows and ranks of the groups that took part
        present = len(o.groups) if o.groups else s.replica_groups
        seen, world = len(o.rows) * s.seq_len * present // s.replica_groups, self.world * present
        split = split_step(
            elapsed, data=o.data_time, train=o.train_time, comm_wait=o.comm_wait, checkpoint=checkpoint_time
        )
        # the parts' columns by name (mypy cannot match a dict's keys to the fields it fills)
        parts: dict[str, Any] = {**split.columns(), **spread(o.rank_times, s.straggler_factor).columns()}
        return StepMetrics(
            step=o.step,
            loss=o.loss,
            tokens=o.tokens,
            tokens_seen=seen,
            lr=o.lr,
            grad_norm=o.norm,
            step_time=elapsed,
            comm_bytes=comm_bytes,
            comm_time=comm_time,
            tokens_per_s=seen / elapsed,
            cpu_time=time.process_time() - o.cpu_started,
            mfu=mfu(step_flops(self.params, seen), elapsed, self.peak, world),
            epoch=sampler.epoch_of(self.rows, o.step, s.batch_size),
            world_size=world,
            skipped=o.nonfinite,
            replica_groups=o.groups,
            **parts,
        )
