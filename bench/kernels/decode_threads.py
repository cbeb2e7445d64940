#!/usr/bin/env python3
"""Decode batches on one thread vs split over the kernels' helper pool, step by step in one process.

One engine (bundled model, CPU kernels, default EngineConfig, --threads torch threads) runs K
greedy requests (EOS ignored) per level; once every request decodes, its steps alternate
between two split cuts of the kernels (`ops.set_split_cut`, csrc/ops.cpp):

  serial  min_rows 65, the default: every call of at most 64 rows on the calling thread (a
          decode batch never splits)
  pool    calls of >= --min-rows rows (32) and >= 1M multiply-adds on the helper pool

Step by step, the lead swapping every step, so a burst of other work on the shared machine lands
on both alike; the contexts grow by one token per step on both. Per level: the median wall and
CPU (process) time of a decode step under each cut and the median over paired steps of
(pool / serial) wall time, the figure to quote. The last stdout line is one JSON object.

    PYTHONPATH=src .venv/bin/python bench/kernels/decode_threads.py --threads 2 --streams 1 8 16 32 64 --steps 24
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from paired_steps import compare_levels


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 16, 32, 64], help="decode batch sizes")
    p.add_argument("--steps", type=int, default=24, help="paired decode steps per level (default 24)")
    p.add_argument("--min-rows", type=int, default=32, help="the pool side's cut (default 32)")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.kernels import kernel_ops
    from sluice.models.loader import load_model

    ops = kernel_ops()
    if ops is None:
        raise SystemExit("the CPU kernels are unavailable here")
    default = tuple(ops.split_cut())
    cuts = {"serial": (65, default[1]), "pool": (args.min_rows, 1 << 20)}
    loaded = load_model(progress=False)
    engine = LLMEngine(loaded, EngineConfig())
    tok = loaded.tokenizer
    result: dict = {"threads": args.threads, "default_cut": list(default)}
    sides = {name: (lambda cut=cut: ops.set_split_cut(*cut)) for name, cut in cuts.items()}
    result.update(
        compare_levels(
            engine, tok, args.streams, args.steps, sides, "pool", "serial", restore=lambda: ops.set_split_cut(*default)
        )
    )
    result["load"] = os.getloadavg()
    print(f"load average {result['load']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
