"""Every setting of one training run, typed and strict: `train.toml`, flags, and the resolved copy.

One pydantic model serves three places: the `--config` file (validated like the fleet file, each
problem as `FILE:LINE: field: problem`), the command-line flags (which override the file), and
`resolved_config.json` in the run folder, which the worker processes read and which records
what the run really used. Strict mode with `extra="forbid"`: a misspelt key or a string where a
number belongs is an error, never a silent default.
"""

from __future__ import annotations

import enum
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sluice.toml_lines import key_lines, line_of
from sluice.train.errors import TrainConfigError

BUNDLED = "bundled"
RANDOM_PREFIX = "random:"


class Parallel(str, enum.Enum):
    DDP = "ddp"  # DistributedDataParallel: replicated parameters, gradients all-reduced
    FSDP = "fsdp"  # FSDP2 fully_shard: parameters, gradients and optimizer state sharded


class LrSchedule(str, enum.Enum):
    CONSTANT = "constant"  # after warmup
    COSINE = "cosine"  # after warmup, down to 10 % of lr at max_steps


class Compression(str, enum.Enum):
    """DDP communication hooks (train/parallel/compression.py); FSDP ignores them."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    TOPK = "topk"


class TrainSettings(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, use_enum_values=False)

    data: str = Field(min_length=1)  # a JSONL file: {"messages": [...]} or {"text": ...} per line
    out: str = Field(min_length=1)  # the run folder: checkpoints, metrics.jsonl, resolved config
    # "bundled" (SmolLM2 GGUF, dequantized), a .gguf file or HF folder, or "random:<preset>"
    model: str = BUNDLED
    # the tokenizer of a random:<preset> model (a model path or "bundled"); others use their own
    tokenizer: str = BUNDLED
    nproc: int = Field(1, ge=1, le=64)  # processes on this machine (torchrun --nproc-per-node)
    max_steps: int = Field(ge=1)
    checkpoint_every: int = Field(0, ge=0)  # 0: only the final checkpoint
    keep_checkpoints: int = Field(2, ge=1)
    async_checkpoint: bool = True  # write in the background; the next checkpoint waits for it
    seq_len: int = Field(512, ge=8, le=131072)
    batch_size: int = Field(4, ge=1)  # sequences per optimizer step, over all ranks (global batch)
    micro_batch_size: int = Field(0, ge=0)  # sequences per forward on a rank; 0 = batch / ranks
    lr: float = Field(2e-5, gt=0)
    lr_schedule: LrSchedule = Field(LrSchedule.CONSTANT, strict=False)
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0)  # max global gradient norm; 0 = off
    parallel: Parallel = Field(Parallel.DDP, strict=False)
    compression: Compression = Field(Compression.NONE, strict=False)
    seed: int = 0
    max_restarts: int = Field(3, ge=0)  # torchrun restarts the group this often after a crash
    skip_bad_lines: bool = False  # report bad data lines and go on, instead of stopping
    threads: int = Field(0, ge=0)  # torch threads per rank; 0 = the machine's cores / nproc
    dtype: str = Field("float32", pattern="^(float32|bfloat16)$")  # bfloat16: CUDA only
    device: str = Field("cpu", pattern="^(cpu|cuda)$")
    # -- observability (train/observe/): sinks besides metrics.jsonl, and the MFU's peak --
    tensorboard: bool = False  # event files in RUN_DIR/tensorboard (needs the tensorboard package)
    prometheus_textfile: str | None = None  # a node-exporter textfile, rewritten after every step
    peak_flops: float = Field(0.0, ge=0)  # per rank, FLOP/s, for the MFU; 0 = measured at start

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v.startswith(RANDOM_PREFIX):
            from sluice.train.model.presets import PRESETS

            name = v.removeprefix(RANDOM_PREFIX)
            if name not in PRESETS:
                raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        return v

    @model_validator(mode="after")
    def _batch(self) -> TrainSettings:
        if self.batch_size % self.nproc:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of nproc ({self.nproc})")
        if self.micro_batch_size and (self.batch_size // self.nproc) % self.micro_batch_size:
            raise ValueError(
                f"batch_size / nproc ({self.batch_size // self.nproc}) must be a multiple of "
                f"micro_batch_size ({self.micro_batch_size})"
            )
        if self.dtype == "bfloat16" and self.device != "cuda":
            raise ValueError("dtype bfloat16 trains on CUDA only; on the CPU use float32")
        return self

    def micro_batch(self, world_size: int) -> int:
        """Sequences per forward on one rank of `world_size` (the global batch stays fixed)."""
        per_rank = self.batch_size // world_size
        return self.micro_batch_size if self.micro_batch_size and per_rank % self.micro_batch_size == 0 else per_rank

    @property
    def is_random(self) -> bool:
        return self.model.startswith(RANDOM_PREFIX)

    @property
    def run_dir(self) -> Path:
        return Path(self.out)


FIELDS = tuple(TrainSettings.model_fields)
PATH_FIELDS = ("data", "out", "model", "tokenizer", "prometheus_textfile")


def _resolve_paths(values: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative paths in a settings file are relative to the file, as its reader expects."""
    out = dict(values)
    for key in PATH_FIELDS:
        v = out.get(key)
        if isinstance(v, str) and v != BUNDLED and not v.startswith(RANDOM_PREFIX) and not Path(v).is_absolute():
            out[key] = str(base / v)
    return out


def _problems(exc: ValidationError) -> list[tuple[tuple[str | int, ...], str]]:
    found = []
    for err in exc.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden":
            msg = f"unknown field (fields: {', '.join(FIELDS)})"
        found.append((tuple(err["loc"]), msg))
    return found


def load_settings(path: str | Path | None, overrides: dict[str, Any]) -> TrainSettings:
    """The settings of `path` (a train.toml, optional) with `overrides` (flags given) on top.

    Raises TrainConfigError naming every problem: `FILE:LINE: field: problem` for the file's
    fields, `--flag: problem` for a flag's."""
    values: dict[str, Any] = {}
    lines: dict = {}
    source = "command line"
    if path is not None:
        p = Path(path).expanduser()
        try:
            text = p.read_text()
        except OSError as exc:
            raise TrainConfigError([f"{p}: cannot read the settings file ({exc.strerror or exc})"]) from None
        try:
            values = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TrainConfigError([f"{p}: not valid TOML: {exc}"]) from None
        values = _resolve_paths(values, p.parent)
        lines = key_lines(text)
        source = str(p)
    given = {k: v for k, v in overrides.items() if v is not None}
    merged = {**values, **given}
    try:
        return TrainSettings.model_validate(merged)
    except ValidationError as exc:
        problems = []
        for loc, msg in _problems(exc):
            field = ".".join(str(x) for x in loc) or "(top level)"
            if loc and loc[0] in given:
                problems.append(f"--{str(loc[0]).replace('_', '-')}: {msg}")
            elif path is not None and (line := line_of(lines, loc)) is not None:
                problems.append(f"{source}:{line}: {field}: {msg}")
            elif path is not None:
                problems.append(f"{source}: {field}: {msg}")
            else:
                problems.append(f"{field}: {msg}")
        raise TrainConfigError(problems) from None


def write_resolved(settings: TrainSettings, path: Path) -> None:
    path.write_text(settings.model_dump_json(indent=2) + "\n")


def read_resolved(path: Path) -> TrainSettings:
    """The worker's copy: written by the launcher from validated settings, read back the same."""
    try:
        return TrainSettings.model_validate_json(path.read_text(), strict=False)
    except (OSError, ValidationError) as exc:
        raise TrainConfigError([f"{path}: {exc}"]) from None
