"""`sluice train run | export`: fine-tune a model on torch.distributed and export it for serving."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the closed vocabularies (pydantic only: no torch is imported to print --help)
from sluice.train.settings import Compression, LrSchedule, NonFinite, Parallel, PipelineSchedule, ReplicaSync

# flag dest -> settings field; every flag defaults to None so the file (or the default) decides
_RUN_FLAGS: list[tuple[str, dict]] = [
    (
        "--data",
        dict(
            metavar="FILE",
            help='JSONL: {"system"?, "messages": [...]} (loss on assistant turns) or {"text": ...} per line',
        ),
    ),
    (
        "--out",
        dict(
            metavar="DIR",
            help="run folder: checkpoints/, metrics.jsonl, resolved_config.json; "
            "an existing run there is resumed from its newest checkpoint",
        ),
    ),
    (
        "--model",
        dict(
            metavar="MODEL",
            help="bundled (SmolLM2-135M-Instruct, default), a .gguf file, an HF folder, "
            "or random:<preset> (tiny, smol-135m, llama-1b)",
        ),
    ),
    ("--tokenizer", dict(metavar="MODEL", help="tokenizer of a random:<preset> model (default: bundled)")),
    ("--nproc", dict(type=int, metavar="N", help="processes (ranks) on this machine (default: 1)")),
    ("--max-steps", dict(type=int, metavar="N", help="optimizer steps to train to")),
    (
        "--checkpoint-every",
        dict(type=int, metavar="N", help="checkpoint every N steps; 0 = only at the end (default: 0)"),
    ),
    ("--keep-checkpoints", dict(type=int, metavar="K", help="keep the newest K checkpoints (default: 2)")),
    ("--seq-len", dict(type=int, metavar="N", help="tokens per packed row (default: 512)")),
    ("--batch-size", dict(type=int, metavar="N", help="rows per optimizer step over all ranks (default: 4)")),
    (
        "--micro-batch-size",
        dict(
            type=int,
            metavar="N",
            help="rows per forward on a rank; 0 = batch / data-parallel ranks "
            "(pp: 0 = 1 row per micro-batch) (default: 0)",
        ),
    ),
    ("--lr", dict(type=float, metavar="LR", help="peak learning rate of AdamW (default: 2e-5)")),
    ("--lr-schedule", dict(choices=[s.value for s in LrSchedule], help="after warmup (default: constant)")),
    ("--warmup-steps", dict(type=int, metavar="N", help="linear warmup steps (default: 0)")),
    (
        "--parallel",
        dict(
            choices=[p.value for p in Parallel],
            help="ddp (all-reduce) or fsdp (FSDP2 sharding): data parallel; tp: tensor parallel over "
            "every rank; pp: pipeline, a stage of layers per rank; fsdp_tp: FSDP2 x tensor parallel; "
            "ep: a MoE model's experts sharded over ranks, the rest DDP (default: ddp)",
        ),
    ),
    ("--tp-size", dict(type=int, metavar="N", help="fsdp_tp: ranks per tensor-parallel group (default: 2)")),
    (
        "--pp-schedule",
        dict(
            choices=[p.value for p in PipelineSchedule],
            help="pp: pipeline schedule (default: gpipe); micro-batches are --micro-batch-size rows (default: 1)",
        ),
    ),
    (
        "--compression",
        dict(choices=[c.value for c in Compression], help="DDP gradient compression hook (default: none)"),
    ),
    ("--seed", dict(type=int, help="data order and random init (default: 0)")),
    (
        "--nonfinite",
        dict(
            choices=[n.value for n in NonFinite],
            help="a step whose loss or gradient norm is NaN or infinite: stop the run before its update, "
            "saving nothing, or skip its update and go on (default: stop)",
        ),
    ),
    ("--max-restarts", dict(type=int, metavar="N", help="torchrun restarts after a crash (default: 3)")),
    ("--threads", dict(type=int, metavar="N", help="torch threads per rank; 0 = cores / nproc (default: 0)")),
    # mixture of experts, elastic launch, object storage
    (
        "--moe-experts",
        dict(
            type=int,
            metavar="E",
            help="train a mixture-of-experts variant with E experts per layer "
            "(random experts, or upcycled from the dense model) (default: 0, dense)",
        ),
    ),
    ("--moe-top-k", dict(type=int, metavar="K", help="experts per token (default: 2)")),
    ("--moe-aux-loss", dict(type=float, metavar="C", help="load-balancing loss coefficient (default: 0.01)")),
    (
        "--nnodes",
        dict(
            metavar="N|MIN:MAX",
            help="machines (torchrun agents) in the job; MIN:MAX is elastic: "
            "machines may leave and join, the run resumes at each change (default: 1)",
        ),
    ),
    (
        "--rdzv-endpoint",
        dict(
            metavar="HOST:PORT",
            help="where every machine's agent meets; required with several machines (default: a free local port)",
        ),
    ),
    (
        "--checkpoint-store",
        dict(
            metavar="s3://BUCKET/PREFIX",
            help="write checkpoints to S3-compatible object storage instead of RUN/checkpoints",
        ),
    ),
    ("--s3-endpoint", dict(metavar="URL", help="the S3-compatible endpoint of --checkpoint-store (default: AWS)")),
    (
        "--lease-timeout",
        dict(
            type=float,
            metavar="SECONDS",
            help="one group at a time: a group's lease on the run "
            "lapses this long after its leader last renewed it "
            "(default: 30)",
        ),
    ),
    (
        "--prometheus-textfile",
        dict(
            metavar="PATH",
            help="also write each step's metrics there in Prometheus' text format (node-exporter's textfile collector)",
        ),
    ),
    (
        "--peak-flops",
        dict(
            type=float,
            metavar="FLOPS",
            help="per-rank peak FLOP/s for the MFU estimate; 0 = measure a matmul at start (default: 0)",
        ),
    ),
    (
        "--progress-interval",
        dict(
            type=float,
            metavar="SECONDS",
            help="a progress line on this terminal at most this often; 0 = every step (default: 10)",
        ),
    ),
    # LoRA (train/model/lora.py): PEFT's adapters train, the base stays frozen
    (
        "--lora-rank",
        dict(
            type=int,
            metavar="R",
            help="train a LoRA adapter of rank R on a frozen base (one process, "
            "ddp or fsdp); checkpoints hold the adapter; export writes a PEFT "
            "adapter folder (default: full fine-tuning)",
        ),
    ),
    ("--lora-alpha", dict(type=float, metavar="A", help="LoRA's scale is A / R (default: 2 x R)")),
    (
        "--lora-dropout",
        dict(type=float, metavar="P", help="dropout on the adapters' input while training, 0 <= P < 1 (default: 0)"),
    ),
    (
        "--lora-targets",
        dict(
            type=lambda v: [t.strip() for t in v.split(",")],
            metavar="q,k,v,o,gate,up,down",
            help="the decoder linears that get adapters (default: all seven)",
        ),
    ),
    # per-step fault tolerance (torchft), hangs, stragglers
    (
        "--replica-groups",
        dict(
            type=int,
            metavar="G",
            help="split --nproc into G replica groups, each its own torchrun, "
            "fault-tolerant data parallel across them: a group that dies "
            "drops out and rejoins from a live peer (default: 1)",
        ),
    ),
    (
        "--lighthouse",
        dict(
            metavar="http://HOST:PORT",
            help="the torchft Lighthouse the replica groups meet at (default: one started by this command)",
        ),
    ),
    (
        "--replica-sync",
        dict(
            choices=[r.value for r in ReplicaSync],
            help="across replica groups: every step's gradients, or LocalSGD / DiLoCo's "
            "parameters every --sync-every steps (default: step)",
        ),
    ),
    ("--sync-every", dict(type=int, metavar="N", help="local_sgd / diloco: steps between syncs (default: 8)")),
    (
        "--hang-timeout",
        dict(
            type=float,
            metavar="SECONDS",
            help="a rank silent this long is reported by rank and host and killed; its group restarts (default: 60)",
        ),
    ),
    (
        "--straggler-factor",
        dict(
            type=float,
            metavar="X",
            help="a rank whose compute is X times the median is named in metrics.jsonl's stragglers (default: 1.5)",
        ),
    ),
]


def settings_from_args(args: argparse.Namespace):
    """The run's TrainSettings: --config's file with the flags given on top."""
    from sluice.train.settings import load_settings

    overrides = {
        flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_")) for flag, _ in _RUN_FLAGS
    }
    overrides["skip_bad_lines"] = True if args.skip_bad_lines else None
    overrides["async_checkpoint"] = False if args.sync_checkpoint else None
    overrides["tensorboard"] = True if args.tensorboard else None
    overrides["activation_checkpointing"] = True if args.activation_checkpointing else None
    return load_settings(args.config, overrides)


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
    for flag, kw in _RUN_FLAGS:
        run.add_argument(flag, default=None, **kw)
    run.add_argument("--skip-bad-lines", action="store_true", help="report bad data lines and train on the rest")
    run.add_argument(
        "--prepare-only",
        action="store_true",
        help="check the settings, tokenize the data into --out and stop (for torchrun on a cluster)",
    )
    run.add_argument(
        "--sync-checkpoint", action="store_true", help="write checkpoints in the step, not in the background"
    )
    run.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files to OUT/tensorboard")
    run.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each decoder layer's activations in the backward pass: less memory, more compute",
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
