#!/usr/bin/env python3
"""Decode steps with the kernels' one-call decoder stack vs the per-layer Python loop, step by
step in one process (csrc/decoder_stack.h, models/kernels/fused_forward.py).

One engine (bundled model, CPU kernels, default EngineConfig, --threads torch threads: the
helper pool splits decode calls as a served worker's does) runs K greedy requests (EOS ignored)
per level; once every request decodes, its steps alternate between `model.stack` set (every
layer in one extension call) and None (fused_forward's loop: ~9 calls per layer), the lead
swapping every step so that a burst of other work on the shared machine lands on both alike.
Per level: the median wall and process-CPU time of a step under each, and the median over paired
steps of (stack / loop) wall time, the figure to quote. The last stdout line is one JSON object.

    PYTHONPATH=src .venv/bin/python bench/kernels/decoder_stack.py --streams 1 8 32 --steps 40
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
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32], help="decode batch sizes")
    p.add_argument("--steps", type=int, default=40, help="paired decode steps per level (default 40)")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model

    loaded = load_model(progress=False)
    stack = loaded.model.stack
    if stack is None:
        raise SystemExit("the kernels' decoder stack is not in use here (no kernels, or weights not Q4_1/Q8_0)")
    engine = LLMEngine(loaded, EngineConfig(speculative_tokens=0))
    tok = loaded.tokenizer
    sides = {
        "stack": lambda: setattr(loaded.model, "stack", stack),
        "loop": lambda: setattr(loaded.model, "stack", None),
    }
    result: dict = {"threads": args.threads}
    result.update(compare_levels(engine, tok, args.streams, args.steps, sides, "stack", "loop", restore=sides["stack"]))
    result["load"] = os.getloadavg()
    print(f"load average {result['load']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
