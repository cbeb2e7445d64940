#!/usr/bin/env python3
"""Decode steps with the kernels' one-call decoder stack vs the per-layer Python loop, step by
step in one process (csrc/decoder_stack.h, models/kernels/fused_forward.py).

One engine (bundled model, CPU kernels, default EngineConfig, --threads torch threads: the
helper pool splits decode calls as a served worker's does) runs K greedy requests (EOS ignored)
per level; once every request decodes, its steps alternate between `model.stack` set (every
layer in one extension call) and None (fused_forward's loop: ~9 calls per layer), the lead
swapping every step so that a burst of other work on the shared machine lands on both alike.
Per level: the median wall and thread-CPU time of a step under each, and the median over paired
steps of (stack / loop) wall time, the figure to quote. The last stdout line is one JSON object.

    PYTHONPATH=src .venv/bin/python bench/decoder_stack.py --streams 1 8 32 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


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
    from sluice.types import GenerationRequest, SamplingParams

    loaded = load_model(progress=False)
    stack = loaded.model.stack
    if stack is None:
        raise SystemExit("the kernels' decoder stack is not in use here (no kernels, or weights not Q4_1/Q8_0)")
    engine = LLMEngine(loaded, EngineConfig(speculative_tokens=0))
    tok = loaded.tokenizer
    sides = {"stack": stack, "loop": None}
    result, n = {"threads": args.threads}, 0
    print(f"{'streams':>7} {'loop wall':>9} {'stack wall':>10} {'loop CPU':>8} {'stack CPU':>9} {'stack/loop wall (paired)':>25}")
    for k in args.streams:
        engine.kv.reset_prefix_cache()
        params = SamplingParams(max_tokens=2 * args.steps + 16, temperature=0.0, ignore_eos=True)
        for i in range(k):
            n += 1
            ids = tok.encode(f"Tell me about topic number {i} and why it matters to people, with examples.")
            engine.add_request(GenerationRequest(f"r{n}", ids, params))
        for _ in range(4):  # the prefill and a few decodes, dropped
            engine.step()
        wall: dict[str, list[float]] = {s: [] for s in sides}
        cpu: dict[str, list[float]] = {s: [] for s in sides}
        for s in range(args.steps):
            for name in sides if s % 2 == 0 else list(sides)[::-1]:
                loaded.model.stack = sides[name]
                c0, w0 = time.thread_time(), time.perf_counter()
                engine.step()
                wall[name].append(1000 * (time.perf_counter() - w0))
                cpu[name].append(1000 * (time.thread_time() - c0))
        loaded.model.stack = stack
        for request_id in list(engine.requests):  # done measuring: free the batch
            engine.abort_request(request_id)
        while engine.has_unfinished():
            engine.step()
        med = {f"{name}_{what}": statistics.median(v[name]) for what, v in (("wall_ms", wall), ("cpu_ms", cpu))
               for name in sides}
        med["ratio_wall"] = statistics.median(a / b for a, b in zip(wall["stack"], wall["loop"]))
        med["ratio_cpu"] = statistics.median(a / b for a, b in zip(cpu["stack"], cpu["loop"]))
        result[f"x{k}"] = med
        print(f"{k:>7} {med['loop_wall_ms']:9.2f} {med['stack_wall_ms']:10.2f} {med['loop_cpu_ms']:8.2f} "
              f"{med['stack_cpu_ms']:9.2f} {med['ratio_wall']:25.3f}", flush=True)
    result["load"] = os.getloadavg()
    print(f"load average {result['load']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
