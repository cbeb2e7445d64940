"""Where rank 0 sends each step's metrics besides metrics.jsonl: TensorBoard event files and a
Prometheus textfile, each when the settings ask for it.

- TensorBoard (`tensorboard = true`): `RUN_DIR/tensorboard/`, one scalar per numeric field
  under `train/`, at the step. A resumed run writes the steps after its checkpoint again and
  tells TensorBoard to purge the older values of those steps (`purge_step`), as metrics.jsonl
  drops its lines. Needs the `tensorboard` package.
- Prometheus (`prometheus_textfile = PATH`): gauges in the text exposition format, rewritten
  atomically (a temporary file renamed over it) after every step, for node-exporter's textfile
  collector: no server in the training process and nothing to push to. A training job is
  short-lived and often behind no Service; node-exporter already runs on every node.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from sluice.train.errors import TrainConfigError
from sluice.train.metrics import MetricSink, StepMetrics
from sluice.train.observe import step_split

PREFIX = "sluice_train_"
# (metric name, StepMetrics field, help); the step-time split is one metric with a `part` label
GAUGES = [
    ("step", "step", "The last optimizer step finished."),
    ("loss", "loss", "Mean cross-entropy over the global batch's trained tokens at the last step."),
    ("learning_rate", "lr", "Learning rate of the last step."),
    ("grad_norm", "grad_norm", "Global gradient norm before clipping at the last step."),
    ("tokens_per_second", "tokens_per_s", "Tokens of the global batch per second of the last step."),
    ("mfu", "mfu", "Model FLOPs utilisation of the last step (6*N*tokens over the ranks' peak)."),
    ("step_seconds", "step_time", "Wall time of the last step."),
    ("comm_bytes", "comm_bytes", "Bytes rank 0 handed to gradient collectives in the last step."),
    ("world_size", "world_size", "Ranks in the process group."),
]
PARTS = list(step_split.COLUMNS.items())  # (part label, StepMetrics field)


def render_textfile(m: StepMetrics, run: str) -> str:
    """The Prometheus text exposition of one step's metrics, labelled with the run's name."""
    values = asdict(m)
    label = run.replace("\\", "\\\\").replace('"', '\\"')
    lines: list[str] = []
    for name, field, help_text in GAUGES:
        value = values[field]
        if value is None:
            continue
        lines += [
            f"# HELP {PREFIX}{name} {help_text}",
            f"# TYPE {PREFIX}{name} gauge",
            f'{PREFIX}{name}{{run="{label}"}} {float(value)!r}',
        ]
    lines += [
        f"# HELP {PREFIX}step_part_seconds The last step's wall time by part (they add up to the step).",
        f"# TYPE {PREFIX}step_part_seconds gauge",
    ]
    lines += [
        f'{PREFIX}step_part_seconds{{run="{label}",part="{part}"}} {float(values[field])!r}' for part, field in PARTS
    ]
    return "\n".join(lines) + "\n"


class PrometheusTextfile:
    def __init__(self, path: Path, run: str):
        self.path, self.run = path, run
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, m: StepMetrics) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(render_textfile(m, self.run))
        os.replace(tmp, self.path)  # the collector never reads a half-written file

    def close(self) -> None:
        pass


class TensorBoardSink:
    def __init__(self, log_dir: Path, resume_step: int = 0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch's writer needs the tensorboard package
            raise TrainConfigError(
                ["tensorboard = true needs the tensorboard package: pip install 'sluice[train]'"]
            ) from None
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=resume_step + 1 if resume_step else None)

    def write(self, m: StepMetrics) -> None:
        for field, value in asdict(m).items():
            if field != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(f"train/{field}", value, m.step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def open_sinks(
    tensorboard: bool, prometheus_textfile: str | None, run_dir: Path, resume_step: int = 0
) -> list[MetricSink]:
    """The sinks the settings ask for (rank 0 only: one writer per run)."""
    sinks: list[MetricSink] = []
    if tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard", resume_step))
    if prometheus_textfile:
        sinks.append(PrometheusTextfile(Path(prometheus_textfile), run_dir.resolve().name))
    return sinks
