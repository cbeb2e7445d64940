"""Flags shared by several subcommands: the model, how it computes, and the engine's settings,
each declared once as a flag of its setting (setting_flags.py)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from sluice.cli.setting_flags import SettingFlag, add_setting_flags, setting_values
from sluice.config import Settings  # pydantic only: `sluice --help` imports no engine (nor torch)

MODEL_FLAGS = (SettingFlag("model", "PATH"), SettingFlag("dtype"))

# how the model computes: on which device, the CPU kernels or torch, exact or fast numerics
KERNEL_FLAGS = (
    SettingFlag("device", "DEVICE"),
    SettingFlag("kernels"),
    SettingFlag("numerics"),
    SettingFlag("kv_cache_dtype"),
)

# the engine settings `serve` (passed on to its worker) and `worker` take, in --help order: the
# batch, the KV cache's memory, the queue, how the model computes, batching and threads, LoRA
ENGINE_FLAGS = (
    SettingFlag("max_num_seqs", "N"),
    SettingFlag("max_num_batched_tokens", "N"),
    SettingFlag("kv_cache_gib", "GIB"),
    SettingFlag("kv_idle_gib", "GIB"),
    SettingFlag("kv_spill_gib", "GIB"),
    SettingFlag("kv_spill_dir", "DIR"),
    SettingFlag("max_model_len", "N"),
    SettingFlag("scheduling_policy"),
    SettingFlag("admission_policy"),
    SettingFlag("enable_prefix_caching", flag="--no-prefix-caching", switch=False),
    *KERNEL_FLAGS,
    SettingFlag("batching_window"),
    SettingFlag("batching_window_ms", "MS"),
    SettingFlag("threads", "N"),
    SettingFlag("decode_split_rows", "N"),
    SettingFlag("speculative_tokens", "K"),
    SettingFlag("max_loras", "N"),
    SettingFlag("max_cpu_loras", "N"),
    SettingFlag("max_lora_rank", "R"),
    SettingFlag("lora_s3_endpoint", "URL"),
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
