"""`sluice train run | export`: fine-tune a model on torch.distributed and export it for serving."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluice.cli.setting_flags import SettingFlag, add_setting_flags, setting_values

# pydantic only: no torch is imported to print --help
from sluice.train.parallel.dims import DEFAULT_TP_SIZE
from sluice.train.settings import TrainSettings

# every flag sets the setting of its name and defaults to None, so the file (or the default) decides
_RUN_FLAGS = (
    SettingFlag(
        "data",
        'JSONL: {"system"?, "messages": [...]} (loss on assistant turns) or {"text": ...} per line',
        "FILE",
    ),
    SettingFlag(
        "out",
        "run folder: checkpoints/, metrics.jsonl, resolved_config.json; "
        "an existing run there is resumed from its newest checkpoint",
        "DIR",
    ),
    SettingFlag(
        "model",
        "bundled (SmolLM2-135M-Instruct), a .gguf file, an HF folder, or random:<preset> (tiny, smol-135m, llama-1b)",
        "MODEL",
    ),
    SettingFlag("tokenizer", "tokenizer of a random:<preset> model", "MODEL"),
    SettingFlag("nproc", "processes (ranks) on this machine", "N"),
    SettingFlag("max_steps", "optimizer steps to train to", "N"),
    SettingFlag("checkpoint_every", "checkpoint every N steps; 0 = only at the end", "N"),
    SettingFlag("keep_checkpoints", "keep the newest K checkpoints", "K"),
    SettingFlag("seq_len", "tokens per packed row", "N"),
    SettingFlag("batch_size", "rows per optimizer step over all ranks", "N"),
    SettingFlag(
        "micro_batch_size",
        "rows per forward on a rank; 0 = batch / data-parallel ranks (pp: 0 = 1 row per micro-batch)",
        "N",
    ),
    SettingFlag("lr", "peak learning rate of AdamW", "LR"),
    SettingFlag("lr_schedule", "after warmup"),
    SettingFlag("warmup_steps", "linear warmup steps", "N"),
    SettingFlag(
        "parallel",
        "ddp (all-reduce) or fsdp (FSDP2 sharding): data parallel; tp: tensor parallel over "
        "every rank; pp: pipeline, a stage of layers per rank; fsdp_tp: FSDP2 x tensor parallel; "
        "ep: a MoE model's experts sharded over ranks, the rest DDP",
    ),
    SettingFlag("tp_size", "fsdp_tp: ranks per tensor-parallel group", "N", default=str(DEFAULT_TP_SIZE)),
    SettingFlag("pp_schedule", "pp: the schedule of the pipeline's micro-batches (--micro-batch-size rows each)"),
    SettingFlag("compression", "DDP gradient compression hook"),
    SettingFlag("seed", "data order and random init"),
    SettingFlag(
        "nonfinite",
        "a step whose loss or gradient norm is NaN or infinite: stop the run before its update, "
        "saving nothing, or skip its update and go on",
    ),
    SettingFlag("max_restarts", "torchrun restarts after a crash", "N"),
    SettingFlag("threads", "torch threads per rank; 0 = cores / nproc", "N"),
    SettingFlag("skip_bad_lines", "report bad data lines and train on the rest", switch=True),
    SettingFlag(
        "async_checkpoint",
        "write checkpoints in the step, not in the background",
        flag="--sync-checkpoint",
        switch=False,
    ),
    # mixture of experts, elastic launch, object storage
    SettingFlag(
        "moe_experts",
        "train a mixture-of-experts variant with E experts per layer "
        "(random experts, or upcycled from the dense model); 0 = dense",
        "E",
    ),
    SettingFlag("moe_top_k", "experts per token", "K"),
    SettingFlag("moe_aux_loss", "load-balancing loss coefficient", "C"),
    SettingFlag(
        "nnodes",
        "machines (torchrun agents) in the job; MIN:MAX is elastic: "
        "machines may leave and join, the run resumes at each change",
        "N|MIN:MAX",
    ),
    SettingFlag(
        "rdzv_endpoint",
        "where every machine's agent meets; required with several machines",
        "HOST:PORT",
        default="a free local port",
    ),
    SettingFlag(
        "checkpoint_store",
        "write checkpoints to S3-compatible object storage instead of RUN/checkpoints",
        "s3://BUCKET/PREFIX",
    ),
    SettingFlag("s3_endpoint", "the S3-compatible endpoint of --checkpoint-store", "URL", default="AWS"),
    SettingFlag(
        "lease_timeout",
        "one group at a time: a group's lease on the run lapses this long after its leader last renewed it",
        "SECONDS",
    ),
    # observability, memory
    SettingFlag(
        "prometheus_textfile",
        "also write each step's metrics there in Prometheus' text format (node-exporter's textfile collector)",
        "PATH",
    ),
    SettingFlag("tensorboard", "also write TensorBoard event files to OUT/tensorboard", switch=True),
    SettingFlag("peak_flops", "per-rank peak FLOP/s for the MFU estimate; 0 = measure a matmul at start", "FLOPS"),
    SettingFlag("progress_interval", "a progress line on this terminal at most this often; 0 = every step", "SECONDS"),
    SettingFlag(
        "activation_checkpointing",
        "recompute each decoder layer's activations in the backward pass: less memory, more compute",
        switch=True,
    ),
    # LoRA (train/model/lora.py): PEFT's adapters train, the base stays frozen
    SettingFlag(
        "lora_rank",
        "train a LoRA adapter of rank R on a frozen base (one process, ddp or fsdp); checkpoints hold "
        "the adapter; export writes a PEFT adapter folder",
        "R",
        default="full fine-tuning",
    ),
    SettingFlag("lora_alpha", "LoRA's scale is A / R", "A", default="2 x R"),
    SettingFlag("lora_dropout", "dropout on the adapters' input while training, 0 <= P < 1", "P"),
    SettingFlag(
        "lora_targets",
        "the decoder linears that get adapters",
        "q,k,v,o,gate,up,down",
        default="all seven",
        parse=lambda v: [t.strip() for t in v.split(",")],
    ),
    # per-step fault tolerance (torchft), hangs, stragglers
    SettingFlag(
        "replica_groups",
        "split --nproc into G replica groups, each its own torchrun, fault-tolerant data parallel "
        "across them: a group that dies drops out and rejoins from a live peer",
        "G",
    ),
    SettingFlag(
        "lighthouse",
        "the torchft Lighthouse the replica groups meet at",
        "http://HOST:PORT",
        default="one started by this command",
    ),
    SettingFlag(
        "replica_sync",
        "across replica groups: every step's gradients, or LocalSGD / DiLoCo's parameters every --sync-every steps",
    ),
    # 0 in the settings: the syncer's own every 8 steps (train/replica/sync.py, torch to import)
    SettingFlag("sync_every", "local_sgd / diloco: steps between syncs", "N", default="8"),
    SettingFlag(
        "hang_timeout",
        "a rank silent this long is reported by rank and host and killed; its group restarts",
        "SECONDS",
    ),
    SettingFlag(
        "straggler_factor",
        "a rank whose compute is X times the median is named in metrics.jsonl's stragglers",
        "X",
    ),
)


def settings_from_args(args: argparse.Namespace) -> TrainSettings:
    """The run's TrainSettings: --config's file with the flags given on top."""
    from sluice.train.settings import load_settings

    return load_settings(args.config, setting_values(args, _RUN_FLAGS))


def _run(args: argparse.Namespace) -> int:
    from sluice.train.launch import prepare, run

    settings = settings_from_args(args)
    if args.prepare_only:
        meta = prepare(settings)
        print(
            f"prepared {settings.run_dir}: {meta['rows']} rows of {meta['seq_len']} tokens; start the workers with "
            f"torchrun ... -m sluice.train.worker {settings.run_dir}",
            file=sys.stderr,
        )
        return 0
    return run(settings)


def _export(args: argparse.Namespace) -> int:
    from sluice.train.export import export_run

    step, out, kind = export_run(Path(args.run), Path(args.out), args.step, merge=args.merge)
    print(f"exported step {step} of {args.run} to {out} ({kind.value})", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser(
        "train", help="fine-tune a model (torchrun: DDP, FSDP2, tensor / pipeline parallel) and export it for serving"
    )
    tsub = train.add_subparsers(dest="train_command", required=True, metavar="SUBCOMMAND")
    run = tsub.add_parser(
        "run",
        help="train, or resume the run in --out",
        description="Train on one machine with torchrun; every setting may come from --config "
        "(a TOML file with the same names, underscores for dashes); flags override it.",
    )
    run.add_argument("--config", metavar="FILE", default=None, help="train.toml with any of the settings below")
    add_setting_flags(run, TrainSettings, _RUN_FLAGS)
    run.add_argument(
        "--prepare-only",
        action="store_true",
        help="check the settings, tokenize the data into --out and stop (for torchrun on a cluster)",
    )
    run.set_defaults(func=_run)
    exp = tsub.add_parser(
        "export", help="write a run's checkpoint as an HF folder (a LoRA run: a PEFT adapter folder) that sluice serves"
    )
    exp.add_argument("run", metavar="RUN", help="the run folder (--out of `sluice train run`)")
    exp.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    exp.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    exp.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: write the base with the adapter merged "
        "in, as a whole HF model folder (needs the run's base model)",
    )
    exp.set_defaults(func=_export)
