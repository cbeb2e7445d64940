"""`sluice train run | export`: fine-tune a model on torch.distributed and export it for serving."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluice.cli.setting_flags import SettingFlag, add_setting_flags, setting_values
from sluice.train.settings import TrainSettings  # pydantic only: no torch is imported to print --help

# every flag sets the setting of its name and defaults to None, so the file (or the default) decides
RUN_FLAGS = (
    SettingFlag("data", "FILE"),
    SettingFlag("out", "DIR"),
    SettingFlag("model", "MODEL"),
    SettingFlag("tokenizer", "MODEL"),
    SettingFlag("nproc", "N"),
    SettingFlag("max_steps", "N"),
    SettingFlag("checkpoint_every", "N"),
    SettingFlag("keep_checkpoints", "K"),
    SettingFlag("seq_len", "N"),
    SettingFlag("batch_size", "N"),
    SettingFlag("micro_batch_size", "N"),
    SettingFlag("lr", "LR"),
    SettingFlag("lr_schedule"),
    SettingFlag("warmup_steps", "N"),
    SettingFlag("parallel"),
    SettingFlag("tp_size", "N"),
    SettingFlag("pp_schedule"),
    SettingFlag("compression"),
    SettingFlag("seed"),
    SettingFlag("nonfinite"),
    SettingFlag("max_restarts", "N"),
    SettingFlag("threads", "N"),
    SettingFlag("skip_bad_lines", switch=True),
    SettingFlag("async_checkpoint", flag="--sync-checkpoint", switch=False),
    # mixture of experts, elastic launch, object storage
    SettingFlag("moe_experts", "E"),
    SettingFlag("moe_top_k", "K"),
    SettingFlag("moe_aux_loss", "C"),
    SettingFlag("nnodes", "N|MIN:MAX"),
    SettingFlag("rdzv_endpoint", "HOST:PORT"),
    SettingFlag("checkpoint_store", "s3://BUCKET/PREFIX"),
    SettingFlag("s3_endpoint", "URL"),
    SettingFlag("lease_timeout", "SECONDS"),
    # observability, memory
    SettingFlag("prometheus_textfile", "PATH"),
    SettingFlag("tensorboard", switch=True),
    SettingFlag("peak_flops", "FLOPS"),
    SettingFlag("progress_interval", "SECONDS"),
    SettingFlag("activation_checkpointing", switch=True),
    # LoRA (train/model/lora.py): PEFT's adapters train, the base stays frozen
    SettingFlag("lora_rank", "R"),
    SettingFlag("lora_alpha", "A"),
    SettingFlag("lora_dropout", "P"),
    SettingFlag("lora_targets", "q,k,v,o,gate,up,down", parse=lambda v: [t.strip() for t in v.split(",")]),
    # per-step fault tolerance (torchft), hangs, stragglers
    SettingFlag("replica_groups", "G"),
    SettingFlag("lighthouse", "http://HOST:PORT"),
    SettingFlag("replica_sync"),
    SettingFlag("sync_every", "N"),
    SettingFlag("hang_timeout", "SECONDS"),
    SettingFlag("straggler_factor", "X"),
)


def settings_from_args(args: argparse.Namespace) -> TrainSettings:
    """The run's TrainSettings: --config's file with the flags given on top."""
    from sluice.train.settings import load_settings

    return load_settings(args.config, setting_values(args, RUN_FLAGS))


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
    add_setting_flags(run, TrainSettings, RUN_FLAGS)
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
