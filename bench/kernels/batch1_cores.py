#!/usr/bin/env python3
"""One stream on one core or two: decode steps with and without the kernels' helper pool.

One engine (the bundled model, CPU kernels, exact numerics unless NUMERICS=fast is in the
environment, speculation off), one greedy
request per context length, stepped with torch at --threads threads while the split rules are
switched between steps (process-wide kernel settings), so every mode sees the same moments of
the shared machine:

  serial     every decode call on the engine's thread (decode_split_rows = 0)
  attention  decode attention split over the helper pool by work (set_attn_split_work, at the
             threshold decode_split_rows turns on), the linears serial
  all        that, and the linears of a 1-row step too (decode_split_rows = 1, the default)

Per context and mode: the median step's wall time and process CPU time (every thread's), the
tok/s the wall time gives, and the wall ratio to `serial` over paired steps. Ends with one JSON
line. A free second core is what the wall ratios show; the CPU ratios are what it costs.

    PYTHONPATH=src .venv/bin/python bench/kernels/batch1_cores.py [--contexts 70,1368] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from sluice.openmp_wait import sleep_when_idle

sleep_when_idle()  # torch's OpenMP as in a worker: set before torch loads (sluice/openmp_wait.py)

import torch

SENTENCE = (
    "The keeper climbed the steps each evening, trimmed the wick, wound the clockwork and wrote the weather "
    "in a leather book while ships passed in the night. "
)
NEVER = 1 << 62


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="70,1368", help="prompt lengths in tokens (default: 70,1368)")
    p.add_argument("--steps", type=int, default=60, help="decode steps per mode and context (default: 60)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.kernels import ATTN_SPLIT_MIN_WORK, DECODE_SPLIT_MIN_WORK, kernel_ops
    from sluice.models.loader import load_model
    from sluice.types import GenerationRequest, SamplingParams

    ops = kernel_ops()
    loaded = load_model(progress=False)
    if ops is None or not loaded.model.uses_kernels:
        raise SystemExit("the CPU kernels are unavailable here")
    engine = LLMEngine(loaded, EngineConfig(speculative_tokens=0, numerics=os.environ.get("NUMERICS", "exact")))
    default_attn, default_cut = ops.attn_split_work(), ops.split_cut()
    serial_cut = [ops.DECODE_MAX_ROWS + 1, DECODE_SPLIT_MIN_WORK]  # above every decode-sized call
    modes = {
        "serial": (NEVER, serial_cut),
        "attention": (ATTN_SPLIT_MIN_WORK, serial_cut),
        "all": (ATTN_SPLIT_MIN_WORK, [1, DECODE_SPLIT_MIN_WORK]),
    }
    text = loaded.tokenizer.encode(SENTENCE * 200)
    result: dict = {"threads": args.threads, "steps": args.steps}
    print(
        f"{'context':>7} {'mode':>9} {'wall ms':>8} {'CPU ms':>7} {'tok/s':>6} "
        f"{'wall/serial':>11} {'helper chunks':>13}",
        file=sys.stderr,
    )
    try:
        for ctx in (int(c) for c in args.contexts.split(",")):
            rid = f"c{ctx}"
            engine.kv.reset_prefix_cache()
            params = SamplingParams(max_tokens=len(modes) * args.steps + 4, temperature=0.0, ignore_eos=True)
            engine.add_request(GenerationRequest(rid, text[:ctx], params))
            while engine.stats().num_running == 0 or engine.requests[rid].num_output_tokens < 2:
                engine.step()  # the prefill and a first decode, not timed
            wall: dict[str, list[float]] = {m: [] for m in modes}
            cpu: dict[str, list[float]] = {m: [] for m in modes}
            helped: dict[str, int] = {m: 0 for m in modes}
            names = list(modes)
            for i in range(args.steps * len(modes)):
                mode = names[(i + i // len(modes)) % len(modes)]  # the order rotates every round
                attn, cut = modes[mode]
                ops.set_attn_split_work(attn)
                ops.set_split_cut(*cut)
                h0, w0, c0 = ops.helper_chunks(), time.perf_counter(), time.process_time()
                engine.step()
                helped[mode] += ops.helper_chunks() - h0
                wall[mode].append(time.perf_counter() - w0)
                cpu[mode].append(time.process_time() - c0)
            engine.abort_request(rid)
            while engine.has_unfinished():
                engine.step()
            for mode in modes:
                w, c = statistics.median(wall[mode]) * 1e3, statistics.median(cpu[mode]) * 1e3
                ratio = statistics.median(a / b for a, b in zip(wall[mode], wall["serial"]))
                hc = helped[mode] / args.steps
                result[f"{ctx}_{mode}"] = {
                    "wall_ms": w,
                    "cpu_ms": c,
                    "tok_s": 1e3 / w,
                    "wall_ratio": ratio,
                    "helper_chunks_per_step": hc,
                }
                print(f"{ctx:>7} {mode:>9} {w:8.2f} {c:7.2f} {1e3 / w:6.1f} {ratio:11.3f} {hc:13.1f}", file=sys.stderr)
    finally:
        ops.set_attn_split_work(default_attn)
        ops.set_split_cut(*default_cut)
    result["load_average"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
