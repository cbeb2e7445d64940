#!/usr/bin/env python3
"""Decode steps with the kernels' greedy LM head vs the full exact head, step by step in one
process (csrc/greedy_head.h: rows that only need their argmax get an int7 approximation of every
logit, a bound, and exact logits for the few tokens the bound leaves).

One engine (bundled model, CPU kernels, default EngineConfig, --threads torch threads, torch's
OpenMP passive as in a worker) runs K greedy requests (EOS ignored) per level; once every request
decodes, its steps alternate between the greedy head (the engine's default) and the full head
(the runner told that no row is argmax-only), the lead swapping every step so that a burst of
other work on the shared machine lands on both alike. Per level: the median wall and
process-CPU time of a step under each, and the median over paired steps of (greedy / full) wall
time, the figure to quote. The last stdout line is one JSON object.

    PYTHONPATH=src .venv/bin/python bench/greedy_head.py --streams 1 8 32 --steps 40
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

    from sluice.openmp_wait import sleep_when_idle

    sleep_when_idle()  # before torch loads, as a worker does
    import torch

    torch.set_num_threads(args.threads)
    import sluice.engine.runner as runner
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model

    loaded = load_model(progress=False)
    if not hasattr(loaded.model.lm_head, "argmax_logits"):
        raise SystemExit("the kernels' greedy head is not in use here (no kernels, or the head is not packed)")
    engine = LLMEngine(loaded, EngineConfig(speculative_tokens=0))
    tok = loaded.tokenizer
    argmax_only = runner._argmax_only
    sides = {"greedy": lambda: setattr(runner, "_argmax_only", argmax_only),
             "full": lambda: setattr(runner, "_argmax_only", lambda sampling: None)}
    result: dict = {"threads": args.threads}
    result.update(compare_levels(engine, tok, args.streams, args.steps, sides, "greedy", "full", restore=sides["greedy"]))
    result["load"] = os.getloadavg()
    print(f"load average {result['load']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
