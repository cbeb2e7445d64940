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
time, the figure to quote. Then the head alone on the rows those steps fed it (each level's
last step): the best of --reps calls of the full head and of the greedy head, and how many
candidates the greedy head kept per row over all the steps. The last stdout line is one JSON
object.

    PYTHONPATH=src .venv/bin/python bench/kernels/greedy_head.py --streams 1 8 32 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from unittest.mock import patch

from paired_steps import compare_levels


def head_alone(ops, head, fed: dict, streams: list[int], reps: int) -> dict[str, dict[str, float]]:
    """Best wall time of the full and the greedy head on each level's recorded rows, the helper
    pool hot as inside a decode step."""
    import torch

    out = {}
    ops.set_pool_hot(True)
    try:
        for k in streams:
            x = fed.get(k)
            if x is None:
                continue
            rows = torch.arange(k)
            best = {}
            for name, fn in (("full", partial(head, x)), ("greedy", partial(head.argmax_logits, x, rows))):
                fn()
                times = []
                for _ in range(reps):
                    t = time.perf_counter()
                    fn()
                    times.append(1000 * (time.perf_counter() - t))
                best[name] = min(times)
            out[f"x{k}"] = best
            print(
                f"head alone, {k:>2} rows: full {best['full']:.2f} ms, greedy {best['greedy']:.2f} ms "
                f"({best['greedy'] / best['full']:.3f}x)"
            )
    finally:
        ops.set_pool_hot(False)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32], help="decode batch sizes")
    p.add_argument("--steps", type=int, default=40, help="paired decode steps per level (default 40)")
    p.add_argument("--reps", type=int, default=20, help="calls per figure of the head alone (default 20)")
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
    sides = {
        "greedy": lambda: setattr(runner, "_argmax_only", argmax_only),
        "full": lambda: setattr(runner, "_argmax_only", lambda sampling: None),
    }
    head = loaded.model.lm_head
    fed: list[torch.Tensor] = []  # every input the greedy head got (a copy: ~10 us a step)
    argmax_logits = type(head).argmax_logits

    def recording(self, x, rows):
        fed.append(x.clone())
        return argmax_logits(self, x, rows)

    result: dict = {"threads": args.threads}
    with patch.object(type(head), "argmax_logits", recording):
        result.update(
            compare_levels(engine, tok, args.streams, args.steps, sides, "greedy", "full", restore=sides["greedy"])
        )
    last = {x.shape[0]: x for x in fed}  # each batch size's last step
    result["head_alone_ms"] = head_alone(loaded.model.ops, head, last, args.streams, args.reps)
    kept = sorted(
        n for x in fed for n in torch.isfinite(head.argmax_logits(x, torch.arange(x.shape[0]))).sum(dim=1).tolist()
    )
    result["candidates_per_row"] = {
        "rows": len(kept),
        "median": kept[len(kept) // 2],
        "p90": kept[int(0.9 * (len(kept) - 1))],
        "max": kept[-1],
    }
    print(f"candidates per row: {result['candidates_per_row']}")
    result["load"] = os.getloadavg()
    print(f"load average {result['load']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
