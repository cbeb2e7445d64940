"""Every setting of one training run, typed and strict: `train.toml`, flags, and the resolved copy.

One pydantic model serves three places: the `--config` file (validated like the fleet file, each
problem as `FILE:LINE: field: problem`), the command-line flags (which override the file), and
`resolved_config.json` in the run folder, which the worker processes read and which records
what the run really used. Strict mode with `extra="forbid"`: a misspelt key or a string where a
number belongs is an error, never a silent default.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from sluice.toml_config import dotted_path, parse_toml, pydantic_problems, read_text
from sluice.toml_lines import line_of
from sluice.train.errors import TrainConfigError
from sluice.train.model import lora_spec
from sluice.train.model.lora_spec import LoraTarget

# the parallel modes' vocabularies live with the degrees they imply (parallel/dims.py)
from sluice.train.parallel.dims import DEFAULT_TP_SIZE, MODEL_PARALLEL, Parallel, ParallelDims, PipelineSchedule

BUNDLED = "bundled"
RANDOM_PREFIX = "random:"


class LrSchedule(str, enum.Enum):
    CONSTANT = "constant"  # after warmup
    COSINE = "cosine"  # after warmup, down to 10 % of lr at max_steps


class NonFinite(str, enum.Enum):
    """What a step whose loss or gradient norm is NaN or infinite does (train/trainer.py)."""

    STOP = "stop"  # stop the run before the update, saving nothing: the newest checkpoint is the last good one
    SKIP = "skip"  # drop the step's update (the weights stay as they were) and go on with the next step


class Compression(str, enum.Enum):
    """DDP communication hooks (train/parallel/compression.py); FSDP ignores them."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    TOPK = "topk"


class ReplicaSync(str, enum.Enum):
    """What replica groups exchange (train/replica/sync.py)."""

    STEP = "step"  # every step's gradients (fault-tolerant DDP / HSDP)
    LOCAL_SGD = "local_sgd"  # every sync_every steps, the parameters averaged
    DILOCO = "diloco"  # every sync_every steps, an outer Nesterov step on the averaged parameter change


class TrainSettings(BaseModel):
    # a field's docstring is its description, the one text `sluice train run --help` shows
    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, use_enum_values=False, use_attribute_docstrings=True
    )

    data: str = Field(min_length=1)
    """JSONL: {"system"?, "messages": [...]} (loss on assistant turns) or {"text": ...} per line"""
    out: str = Field(min_length=1)
    """run folder: checkpoints/, metrics.jsonl, resolved_config.json; an existing run there is
    resumed from its newest checkpoint"""
    model: str = BUNDLED
    """bundled (SmolLM2-135M-Instruct, its GGUF dequantized), a .gguf file, an HF folder, or
    random:<preset> (tiny, smol-135m, llama-1b)"""
    tokenizer: str = BUNDLED
    """tokenizer of a random:<preset> model (a model path or bundled); others use their own"""
    nproc: int = Field(1, ge=1, le=64)
    """processes (ranks) on this machine (torchrun --nproc-per-node)"""
    max_steps: int = Field(ge=1)
    """optimizer steps to train to"""
    checkpoint_every: int = Field(0, ge=0)
    """checkpoint every N steps; 0 = only at the end"""
    keep_checkpoints: int = Field(2, ge=1)
    """keep the newest K checkpoints"""
    async_checkpoint: bool = True
    """checkpoints written in the background; the next checkpoint waits for the last"""
    seq_len: int = Field(512, ge=8, le=131072)
    """tokens per packed row"""
    batch_size: int = Field(4, ge=1)
    """rows per optimizer step over all ranks (the global batch)"""
    micro_batch_size: int = Field(0, ge=0)
    """rows per forward on a rank; 0 = batch / data-parallel ranks (pp: 0 = 1 row per
    micro-batch)"""
    lr: float = Field(2e-5, gt=0)
    """peak learning rate of AdamW"""
    lr_schedule: LrSchedule = Field(LrSchedule.CONSTANT, strict=False)
    """after warmup"""
    warmup_steps: int = Field(0, ge=0)
    """linear warmup steps"""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW's weight decay"""
    grad_clip: float = Field(1.0, ge=0)
    """max global gradient norm; 0 = off"""
    nonfinite: NonFinite = Field(NonFinite.STOP, strict=False)
    """a step whose loss or gradient norm is NaN or infinite: stop the run before its update,
    saving nothing, or skip its update and go on"""
    parallel: Parallel = Field(Parallel.DDP, strict=False)
    """ddp (all-reduce) or fsdp (FSDP2 sharding): data parallel; tp: tensor parallel over every
    rank; pp: pipeline, a stage of layers per rank; fsdp_tp: FSDP2 x tensor parallel; ep: a MoE
    model's experts sharded over ranks, the rest DDP"""
    compression: Compression = Field(Compression.NONE, strict=False)
    """DDP gradient compression hook"""
    # -- model parallelism --
    tp_size: int = Field(0, ge=0)
    """fsdp_tp: ranks per tensor-parallel group; 0 = parallel/dims.py's DEFAULT_TP_SIZE
    (default: 2)"""
    pp_schedule: PipelineSchedule = Field(PipelineSchedule.GPIPE, strict=False)
    """pp: the schedule of the pipeline's micro-batches (micro_batch_size rows each)"""
    seed: int = 0
    """data order and random init"""
    max_restarts: int = Field(3, ge=0)
    """torchrun restarts after a crash"""
    skip_bad_lines: bool = False
    """report bad data lines and train on the rest, instead of stopping"""
    threads: int = Field(0, ge=0)
    """torch threads per rank; 0 = cores / nproc"""
    dtype: str = Field("float32", pattern="^(float32|bfloat16)$")
    """the training dtype; bfloat16: CUDA only"""
    device: str = Field("cpu", pattern="^(cpu|cuda)$")
    """where the ranks train"""
    # -- mixture of experts (train/model/moe.py), elastic launch, object storage --
    moe_experts: int = Field(0, ge=0, le=256)
    """train a mixture-of-experts variant with E experts per layer (random experts, or upcycled
    from the dense model); 0 = dense"""
    moe_top_k: int = Field(2, ge=1)
    """experts per token"""
    moe_aux_loss: float = Field(0.01, ge=0)
    """sequence-wise load-balancing loss coefficient"""
    nnodes: str = Field("1", pattern=r"^[1-9][0-9]*(:[1-9][0-9]*)?$")
    """machines (torchrun agents) in the job; MIN:MAX is elastic: machines may leave and join, the
    run resumes at each change"""
    rdzv_endpoint: str = ""
    """HOST:PORT where every machine's agent meets; required with several machines (default: a
    free local port)"""
    checkpoint_store: str = Field("", pattern=r"^(s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?)?$")
    """write checkpoints to S3-compatible object storage (s3://bucket/prefix,
    train/checkpoint/object_store.py) instead of RUN/checkpoints"""
    s3_endpoint: str = ""
    """the S3-compatible endpoint of checkpoint_store; credentials: the AWS_* variables (default:
    AWS)"""
    # rank 0 renews the lease every third of it (train/checkpoint/lease.py)
    lease_timeout: float = Field(30.0, ge=1, le=300)
    """one group at a time: a group's lease on the run lapses this long after its leader last
    renewed it"""
    # -- observability (train/observe/): sinks besides metrics.jsonl, and the MFU's peak --
    tensorboard: bool = False
    """also write TensorBoard event files to RUN/tensorboard (needs the tensorboard package)"""
    prometheus_textfile: str | None = None
    """also write each step's metrics there in Prometheus' text format (node-exporter's textfile
    collector)"""
    peak_flops: float = Field(0.0, ge=0)
    """per-rank peak FLOP/s for the MFU estimate; 0 = measure a matmul at start"""
    progress_interval: float = Field(10.0, ge=0)
    """a progress line on the launcher's terminal at most this often; 0 = every step"""
    activation_checkpointing: bool = False
    """recompute each decoder layer's activations in the backward pass: less memory, more
    compute"""
    # -- LoRA (train/model/lora.py): PEFT's adapters on these linears train, the rest stays frozen --
    lora_rank: int | None = Field(None, gt=0, le=1024)
    """train a LoRA adapter of rank R on a frozen base (one process, ddp or fsdp); checkpoints hold
    the adapter; export writes a PEFT adapter folder (default: full fine-tuning)"""
    lora_alpha: float | None = Field(None, gt=0, allow_inf_nan=False)
    """LoRA's scale is alpha / R (default: 2 x R)"""
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    """dropout on the adapters' input while training, 0 <= P < 1"""
    lora_targets: list[Annotated[LoraTarget, Strict(False)]] | None = None
    """the decoder linears that get adapters (default: all seven)"""
    # -- per-step fault tolerance (train/replica/): through torchft's quorum --
    replica_groups: int = Field(1, ge=1, le=64)
    """split nproc into G replica groups, each its own torchrun, fault-tolerant data parallel
    across them: a group that dies drops out and rejoins from a live peer"""
    lighthouse: str = Field("", pattern=r"^(https?://[^\s/]+)?$")
    """the torchft Lighthouse the replica groups meet at (default: one started by this command)"""
    replica_sync: ReplicaSync = Field(ReplicaSync.STEP, strict=False)
    """across replica groups: every step's gradients, or LocalSGD / DiLoCo's parameters every
    sync_every steps"""
    sync_every: int = Field(0, ge=0)
    """local_sgd / diloco: steps between syncs; 0 = train/replica/sync.py's DEFAULT_SYNC_EVERY
    (default: 8)"""
    hang_timeout: float = Field(60.0, gt=0, le=3600)
    """a rank whose liveness heartbeat stops this long is reported by rank and host and killed;
    its group restarts"""
    straggler_factor: float = Field(1.5, gt=1)
    """a rank whose compute is X times the median is named in metrics.jsonl's stragglers"""

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
        self._check_model_parallel()
        dp = self.dims().dp
        if self.batch_size % dp:
            ranks = f"nproc ({dp})" if dp == self.nproc else f"the data-parallel ranks (nproc / tp_size = {dp})"
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of {ranks}")
        if self.micro_batch_size and (self.group_batch // dp) % self.micro_batch_size:
            raise ValueError(
                f"batch_size / data-parallel ranks ({self.group_batch // dp}) must be a multiple of "
                f"micro_batch_size ({self.micro_batch_size})"
            )
        if self.dtype == "bfloat16" and self.device != "cuda":
            raise ValueError("dtype bfloat16 trains on CUDA only; on the CPU use float32")
        if self.moe_experts and self.moe_top_k > self.moe_experts:
            raise ValueError(f"moe_top_k ({self.moe_top_k}) must not exceed moe_experts ({self.moe_experts})")
        if self.nnodes != "1" and not self.rdzv_endpoint:
            raise ValueError(f"nnodes {self.nnodes}: every machine must meet at the same rdzv_endpoint (HOST:PORT)")
        self._check_replica_groups()
        lora_spec.check(
            self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets, self.parallel, self.moe_experts
        )
        if self.parallel is Parallel.EP and not self.moe_experts:
            raise ValueError("parallel = ep shards the experts of a MoE model: set moe_experts")
        if self.parallel is Parallel.EP and self.moe_experts % self.nproc:
            raise ValueError(
                f"moe_experts ({self.moe_experts}) must be a multiple of nproc ({self.nproc}) for parallel = ep"
            )
        return self

    def dims(self, world: int | None = None) -> ParallelDims:
        """The parallel degrees of one replica group on `world` ranks (default: this machine's
        nproc split into its replica groups)."""
        return ParallelDims.of(self.parallel, self.group_size if world is None else world, self.tp_size)

    @property
    def group_batch(self) -> int:
        """Rows of the global batch one replica group trains on per step (all without groups)."""
        return self.batch_size // self.replica_groups

    @property
    def group_size(self) -> int:
        """Ranks per replica group (all of nproc without replica groups)."""
        return self.nproc // self.replica_groups

    def _check_replica_groups(self) -> None:
        g = self.replica_groups
        if g == 1:
            if self.replica_sync is not ReplicaSync.STEP or self.sync_every:
                raise ValueError("replica_sync and sync_every apply across replica groups: set replica_groups >= 2")
            return
        if self.nproc % g:
            raise ValueError(f"nproc ({self.nproc}) must be a multiple of replica_groups ({g})")
        if self.parallel not in (Parallel.DDP, Parallel.FSDP):
            raise ValueError(
                f"replica_groups: each group trains with parallel = ddp or fsdp, not {self.parallel.value}"
            )
        if self.nnodes != "1":
            raise ValueError(
                "replica_groups replace an elastic or multi-machine torchrun: set nnodes = 1 "
                "(each group is its own torchrun; groups on other machines meet at --lighthouse)"
            )
        if self.batch_size % self.nproc:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of nproc ({self.nproc}): "
                f"every rank of every replica group trains on its share"
            )
        if self.sync_every and self.replica_sync is ReplicaSync.STEP:
            raise ValueError("sync_every applies to replica_sync = local_sgd or diloco")
        if self.replica_sync is not ReplicaSync.STEP and self.nonfinite is NonFinite.SKIP:
            # torchft's LocalSGD / DiLoCo find the sync by counting optimizer steps: a dropped
            # update would put this group's syncs out of step with the others'
            raise ValueError("nonfinite = skip drops an update; replica_sync = local_sgd or diloco need stop")

    def _check_model_parallel(self) -> None:
        """Combinations torch does not compose here, refused naming the setting (docs/TRAINING.md)."""
        p = self.parallel
        if self.compression is not Compression.NONE and p in MODEL_PARALLEL:
            raise ValueError(
                f"compression {self.compression.value} is a DDP communication hook; "
                f"parallel = {p.value} has no DDP: set compression = none or parallel = ddp"
            )
        if self.tp_size and p is not Parallel.FSDP_TP:
            raise ValueError(
                f"tp_size applies to parallel = fsdp_tp only (parallel = {p.value}"
                + (": tp uses every rank)" if p is Parallel.TP else ")")
            )
        if self.moe_experts and p in MODEL_PARALLEL:
            raise ValueError(
                f"moe_experts: a mixture-of-experts model trains with parallel = ddp, fsdp or ep, "
                f"not {p.value} (its layer plans split dense MLPs)"
            )
        if p in (Parallel.TP, Parallel.PP) and self.nproc < 2:
            raise ValueError(f"parallel = {p.value} needs nproc >= 2 (one process trains the whole model: use ddp)")
        if p is Parallel.FSDP_TP:
            tp = self.tp_size or DEFAULT_TP_SIZE
            if self.nproc % tp or self.nproc // tp < 2:
                raise ValueError(
                    f"parallel = fsdp_tp needs nproc ({self.nproc}) to be a multiple of tp_size ({tp}) "
                    f"with at least 2 groups (nproc >= {2 * tp})"
                )
        if p is not Parallel.PP and self.pp_schedule is not PipelineSchedule.GPIPE:
            raise ValueError(f"pp_schedule applies to parallel = pp only (parallel = {p.value})")

    @property
    def elastic(self) -> bool:
        """nnodes is a range: the world size may change between the group's restarts."""
        lo, _, hi = self.nnodes.partition(":")
        return bool(hi) and hi != lo

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


def load_settings(path: str | Path | None, overrides: dict[str, Any]) -> TrainSettings:
    """The settings of `path` (a train.toml, optional) with `overrides` (flags given) on top.

    Raises TrainConfigError naming every problem: `FILE:LINE: field: problem` for the file's
    fields, `--flag: problem` for a flag's."""
    values: dict[str, Any] = {}
    lines: dict = {}
    source = "command line"
    if path is not None:
        text, p = read_text(path, "settings file", TrainConfigError)
        source = str(p)
        values, lines = parse_toml(text, source, TrainConfigError)
        values = _resolve_paths(values, p.parent)
    given = {k: v for k, v in overrides.items() if v is not None}
    merged = {**values, **given}
    try:
        return TrainSettings.model_validate(merged)
    except ValidationError as exc:
        problems = []
        for loc, msg in pydantic_problems(exc, unknown_field=f"unknown field (fields: {', '.join(FIELDS)})"):
            field = dotted_path(loc)
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
    # whole or not at all: another machine's launcher (an elastic job) may rewrite it while ranks read it
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(settings.model_dump_json(indent=2) + "\n")
    tmp.replace(path)


def read_resolved(path: Path) -> TrainSettings:
    """The worker's copy: written by the launcher from validated settings, read back the same."""
    try:
        return TrainSettings.model_validate_json(path.read_text(), strict=False)
    except (OSError, ValidationError) as exc:
        raise TrainConfigError([f"{path}: {exc}"]) from None
