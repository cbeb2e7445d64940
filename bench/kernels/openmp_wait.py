#!/usr/bin/env python3
"""An engine with torch's OpenMP threads spinning after each region (libgomp's default) vs sleeping
at once (OMP_WAIT_POLICY=PASSIVE, what `sluice worker` / `serve` / `generate` set: sluice/openmp_wait.py).

Each round runs the same phases once per policy, each in a fresh process (libgomp reads the
variable when torch loads it), the policy that goes first alternating between rounds. One engine
per process (bundled model, CPU kernels, default EngineConfig, 2 torch threads):

  prefill_1368   one 1,368-token prompt, max_tokens 1: wall ms (OpenMP regions: calls over 64 rows)
  greedy_xK      K greedy requests (~100-token prompts, EOS ignored): median wall ms of the steps
                 in which all K decode
  temp_xK        the same at temperature 0.8, top_p 0.95 (torch's ops on each sampled row: regions)

and, per phase, the split calls the kernels' helper pool ran serially because its helpers missed
their chunks (`ops.pool_rested_calls`) and the chunks the helpers ran. The last stdout line is
one JSON object.

    PYTHONPATH=src .venv/bin/python bench/kernels/openmp_wait.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PHASES = ("prefill_1368", "greedy_x1", "greedy_x32", "temp_x8", "temp_x32")
POLICIES = {"default": None, "passive": "PASSIVE"}


def child() -> None:
    """One process, one policy: every phase once; prints one JSON line."""
    import time

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.*
    from bench.serving.engine_throughput import prompts
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model
    from sluice.types import GenerationRequest, SamplingParams

    torch.set_num_threads(2)
    loaded = load_model(progress=False)
    engine = LLMEngine(loaded, EngineConfig())
    ops = engine.runner.model.ops
    assert ops is not None, "the CPU kernels did not build: their helper pool is what this measures"
    serial = iter(range(1 << 30))

    def decode(n: int, steps: int, temperature: float, top_p: float = 1.0) -> float:
        engine.kv.reset_prefix_cache()
        for p in prompts(loaded.tokenizer, n):
            i = next(serial)
            params = SamplingParams(max_tokens=steps + 4, ignore_eos=True, temperature=temperature, top_p=top_p)
            engine.add_request(GenerationRequest(f"r{i}", [5 + i % 1000] + p, params))
        times = []
        while engine.has_unfinished():
            t = time.perf_counter()
            engine.step()
            stats = engine.stats()
            if stats.last_step_tokens == stats.last_step_seqs == n:
                times.append(time.perf_counter() - t)
        return 1e3 * statistics.median(times)

    def prefill(tokens: int) -> float:
        engine.kv.reset_prefix_cache()
        i = next(serial)
        ids = [100 + (7 * i + j) % 40000 for j in range(tokens)]
        engine.add_request(GenerationRequest(f"p{i}", ids, SamplingParams(max_tokens=1)))
        t = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return 1e3 * (time.perf_counter() - t)

    runs = {
        "prefill_1368": lambda: statistics.median(prefill(1368) for _ in range(3)),
        "greedy_x1": lambda: decode(1, 40, temperature=0.0),
        "greedy_x32": lambda: decode(32, 16, temperature=0.0),
        "temp_x8": lambda: decode(8, 24, temperature=0.8, top_p=0.95),
        "temp_x32": lambda: decode(32, 16, temperature=0.8, top_p=0.95),
    }
    decode(4, 4, temperature=0.0)  # warm-up
    out = {}
    for name in PHASES:
        rested, chunks = ops.pool_rested_calls(), ops.helper_chunks()
        out[name] = {
            "ms": runs[name](),
            "rested_calls": ops.pool_rested_calls() - rested,
            "helper_chunks": ops.helper_chunks() - chunks,
        }
    print(json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds; the policy that goes first alternates (default 2)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child()
    results: dict[str, list[dict]] = {k: [] for k in POLICIES}
    for r in range(args.rounds):
        order = list(POLICIES) if r % 2 == 0 else list(reversed(POLICIES))
        for policy in order:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            if wait_policy := POLICIES[policy]:
                env["OMP_WAIT_POLICY"] = wait_policy
            run = subprocess.run(
                [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True
            )
            results[policy].append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(
                f"round {r + 1} {policy:8s} " + "  ".join(f"{n} {results[policy][-1][n]['ms']:.1f} ms" for n in PHASES),
                file=sys.stderr,
                flush=True,
            )
    print(f"\n{'phase':14s} {'default ms':>11s} {'passive ms':>11s} {'ratio':>6s}   rested calls default / passive")
    summary = {}
    for n in PHASES:
        d = statistics.median(x[n]["ms"] for x in results["default"])
        s = statistics.median(x[n]["ms"] for x in results["passive"])
        rd = statistics.median(x[n]["rested_calls"] for x in results["default"])
        rs = statistics.median(x[n]["rested_calls"] for x in results["passive"])
        summary[n] = {"default_ms": d, "passive_ms": s, "ratio": s / d, "rested_default": rd, "rested_passive": rs}
        print(f"{n:14s} {d:11.1f} {s:11.1f} {s / d:6.3f}   {rd:.0f} / {rs:.0f}")
    print(json.dumps({"bench": "openmp_wait", "load": os.getloadavg(), "summary": summary, "runs": results}))


if __name__ == "__main__":
    main()
