"""Where one step's wall time went: data, compute, communication, checkpoint, and the rest.

The parts are disjoint and add up to the step time, so they can be stacked in a chart:
- data: sampling the step's rows and copying them to the device;
- communication: the time the step *waited* for collectives, not their duration. DDP overlaps
  each gradient bucket's all-reduce with the rest of the backward pass; what is left exposed
  is the tail from the last bucket's issue (the backward pass's compute is over then) to the
  last completion, plus the step's closing all-reduce (loss sum and stop flag), which also
  absorbs the time a rank waits for a slower one. FSDP2's all-gathers and reduce-scatters run
  inside its forward and backward and are not separable here: for FSDP2 only the closing
  all-reduce counts, the rest shows as compute;
- compute: forward, backward and optimizer, less the communication above;
- checkpoint: what the step was held by a checkpoint (an asynchronous one: the copy to CPU
  memory and, if the previous write is still running, the wait for it);
- other: the rest (learning-rate update, bookkeeping), so that the parts add up.
"""

from __future__ import annotations

from dataclasses import dataclass

# each part's column in metrics.jsonl (train/metrics.py); its name is the `part` label of the
# Prometheus textfile's step_part_seconds (observe/sinks.py)
COLUMNS = {
    "data": "data_time",
    "compute": "compute_time",
    "comm": "comm_wait_time",
    "checkpoint": "checkpoint_time",
    "other": "other_time",
}


@dataclass(slots=True, frozen=True)
class StepSplit:
    data: float
    compute: float
    comm: float
    checkpoint: float
    other: float

    def columns(self) -> dict[str, float]:
        """The parts by their metrics.jsonl column."""
        return {column: getattr(self, part) for part, column in COLUMNS.items()}


def split_step(step_time: float, data: float, train: float, comm_wait: float, checkpoint: float) -> StepSplit:
    """`train`: seconds of forward + backward + optimizer + the closing all-reduce, measured as
    one interval; `comm_wait`: the seconds of it spent waiting for communication."""
    comm = min(max(0.0, comm_wait), train)
    other = max(0.0, step_time - data - train - checkpoint)
    return StepSplit(data=data, compute=train - comm, comm=comm, checkpoint=checkpoint, other=other)
