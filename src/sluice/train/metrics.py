"""metrics.jsonl: one JSON line per optimizer step, written by rank 0.

A restarted run resumes at its last checkpoint, so the lines after that step are dropped when
the file is reopened: the file always holds one line per step, each from the run that owns it.
Every line is strict JSON: a value that is NaN or infinite (a non-finite loss, train/trainer.py)
is written as null, and so reaches the other sinks too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol, TextIO


@dataclass(slots=True)
class StepMetrics:
    step: int
    loss: float | None  # mean cross-entropy over the global batch's trained tokens (None: not finite)
    tokens: int  # trained (loss) tokens in the global batch
    tokens_seen: int  # all tokens in the global batch (including context and padding)
    lr: float
    grad_norm: float | None  # the global gradient norm before clipping (None: not finite)
    step_time: float  # seconds, the whole step
    # the step time's split (train/observe/step_split.py): the five parts add up to step_time
    data_time: float
    compute_time: float  # forward + backward + optimizer, less the communication waited for
    comm_wait_time: float  # communication the step waited for (not hidden behind compute)
    checkpoint_time: float  # seconds the step was held by a checkpoint
    other_time: float  # the rest (bookkeeping)
    comm_bytes: int  # bytes this rank handed to gradient collectives
    comm_time: float | None  # seconds until those collectives completed, overlapped (None: not measurable)
    tokens_per_s: float
    # CPU seconds rank 0's process used in the step (all its threads): well below step_time,
    # the rank waited (for a peer, the disk, or cores taken by other processes)
    cpu_time: float
    mfu: float | None  # 6·N·tokens_seen / (step_time · world_size · peak per rank) (train/observe/flops.py)
    epoch: float
    world_size: int
    skipped: bool = False  # the step's update was dropped: its loss or gradient norm was not finite
    # stragglers (train/observe/stragglers.py): each rank's forward + backward seconds, compared
    rank_compute_max: float | None = None  # the slowest rank's
    rank_compute_median: float | None = None
    stragglers: list[int] | None = None  # ranks above straggler_factor x the median (of its replica group)
    replica_groups: list[int] | None = None  # replica groups that took part in the step (None: no groups)


def finite(m: StepMetrics) -> StepMetrics:
    """`m` with every NaN or infinite value as None (JSON has neither)."""
    # the JSON line's fields are `float | None`: the dataclass's float types do not say so
    bad: dict[str, Any] = {
        f.name: None for f in fields(m) if isinstance(v := getattr(m, f.name), float) and not math.isfinite(v)
    }
    return replace(m, **bad) if bad else m


class MetricSink(Protocol):
    """Another destination for each step's metrics (train/observe/sinks.py: TensorBoard, Prometheus)."""

    def write(self, m: StepMetrics) -> None: ...
    def close(self) -> None: ...


class MetricsWriter:
    """`resume_step` None (replica groups): the writer of a step is the lowest replica group that
    took part, which changes as groups leave and come back, and a group restarted mid-run must
    not cut the lines the others wrote; so the file is cut only when this process writes its
    first line, and only of the lines from that step on (a whole-job restart's old future)."""

    def __init__(self, path: Path, enabled: bool, resume_step: int | None, sinks: Sequence[MetricSink] = ()):
        self.enabled = enabled
        self.path = path
        self.sinks = list(sinks)  # TensorBoard, a Prometheus textfile (train/observe/sinks.py)
        self._file: TextIO | None = None
        if enabled and resume_step is not None:
            self._open(resume_step)

    def _open(self, keep_upto: int) -> TextIO:
        kept: list[str] = []
        cut = False
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] <= keep_upto:
                        kept.append(line)
                        continue
                except (json.JSONDecodeError, KeyError, TypeError):
                    pass  # a line cut by a crash
                cut = True
        if cut or not self.path.exists():
            self.path.write_text("".join(k + "\n" for k in kept))
        self._file = self.path.open("a")
        return self._file

    def write(self, m: StepMetrics) -> None:
        if self.enabled:
            file = self._file if self._file is not None else self._open(m.step - 1)
            m = finite(m)
            file.write(json.dumps(asdict(m), allow_nan=False) + "\n")
            file.flush()
            for sink in self.sinks:
                sink.write(m)

    def close(self) -> None:
        if self.enabled:
            if self._file is not None:
                self._file.close()
            for sink in self.sinks:
                sink.close()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
