"""The `sluice` command line: one module per subcommand, each with `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import sys

from sluice import __version__
from sluice.errors import SluiceError

# Subcommand modules under sluice.cli, in --help order. Each defines register(sub) and sets
# `func` on its parser; imports of heavy packages (torch, grpc) stay inside the handlers so
# `sluice --help` is instant.
SUBCOMMANDS = ["serve", "worker", "keys", "fleet", "generate", "train", "search"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="sluice: a self-hosted LLM inference platform")
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"sluice.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SluiceError as exc:
        print(f"sluice: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
