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

    PYTHONPATH=src .venv/bin/python bench/decode_threads.py --threads 2 --streams 1 8 16 32 64 --steps 24
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
    from sluice.types import GenerationRequest, SamplingParams

    ops = kernel_ops()
    if ops is None:
        raise SystemExit("the CPU kernels are unavailable here")
    default = tuple(ops.split_cut())
    cuts = {"serial": (65, default[1]), "pool": (args.min_rows, 1 << 20)}
    loaded = load_model(progress=False)
    engine = LLMEngine(loaded, EngineConfig())
    tok = loaded.tokenizer
    result, n = {"threads": args.threads, "default_cut": list(default)}, 0
    print(f"{'streams':>7} {'serial wall':>11} {'pool wall':>9} {'serial CPU':>10} {'pool CPU':>8} {'pool/serial wall (paired)':>26}")
    for k in args.streams:
        engine.kv.reset_prefix_cache()
        params = SamplingParams(max_tokens=2 * args.steps + 16, temperature=0.0, ignore_eos=True)
        for i in range(k):
            n += 1
            ids = tok.encode(f"Tell me about topic number {i} and why it matters to people, with examples.")
            engine.add_request(GenerationRequest(f"r{n}", ids, params))
        for _ in range(4):  # the prefill and a few decodes on the default cut, dropped
            engine.step()
        wall: dict[str, list[float]] = {c: [] for c in cuts}
        cpu: dict[str, list[float]] = {c: [] for c in cuts}
        for s in range(args.steps):
            for name in cuts if s % 2 == 0 else list(cuts)[::-1]:
                ops.set_split_cut(*cuts[name])
                c0, w0 = time.process_time(), time.perf_counter()
                engine.step()
                wall[name].append(1000 * (time.perf_counter() - w0))
                cpu[name].append(1000 * (time.process_time() - c0))
        ops.set_split_cut(*default)
        for request_id in list(engine.requests):  # done measuring: free the batch
            engine.abort_request(request_id)
        while engine.has_unfinished():
            engine.step()
        med = {f"{name}_{what}": statistics.median(v[name]) for what, v in (("wall_ms", wall), ("cpu_ms", cpu)) for name in cuts}
        med["ratio_wall"] = statistics.median(a / b for a, b in zip(wall["pool"], wall["serial"]))
        result[f"x{k}"] = med
        print(f"{k:>7} {med['serial_wall_ms']:11.2f} {med['pool_wall_ms']:9.2f} {med['serial_cpu_ms']:10.2f} "
              f"{med['pool_cpu_ms']:8.2f} {med['ratio_wall']:26.3f}", flush=True)
    result["load"] = os.getloadavg()
    print(f"load average {result['load']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
