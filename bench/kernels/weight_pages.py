#!/usr/bin/env python3
"""One stream's decode step with the packed weights on huge pages (the default) and without.

The weights' region (models/kernels/weight_region.py) is a load-time choice, so each mode runs
in its own process: --pairs pairs of child processes, the order alternating, each loading the
bundled model (CPU kernels, exact numerics, speculation off) at --threads torch threads, decoding
one greedy request (70-token prompt) and printing its median step over --steps steps. "off"
replaces gather_on_huge_pages with a no-op before the model loads, which leaves every weight in
the tensor its packing allocated (4 KiB pages). Per pair the ratio on/off; their median is the
figure to quote (the machine is shared: the pairs are what makes it comparable).

    PYTHONPATH=src .venv/bin/python bench/kernels/weight_pages.py [--threads 1] [--pairs 4] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(mode: str, threads: int, steps: int) -> None:
    import torch

    torch.set_num_threads(threads)
    if mode == "off":
        import sluice.models.kernels.weight_region as region

        region.gather_on_huge_pages = lambda linears: 0
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model
    from sluice.types import GenerationRequest, SamplingParams

    loaded = load_model(progress=False)
    engine = LLMEngine(loaded, EngineConfig(speculative_tokens=0))
    text = loaded.tokenizer.encode("The keeper climbed the steps each evening, trimmed the wick. " * 20)[:70]
    params = SamplingParams(max_tokens=steps + 10, temperature=0.0, ignore_eos=True)
    engine.add_request(GenerationRequest("r", text, params))
    for _ in range(5):
        engine.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    print(json.dumps({"mode": mode, "step_ms": statistics.median(times) * 1e3}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--pairs", type=int, default=4, help="pairs of runs, order alternating (default: 4)")
    p.add_argument("--steps", type=int, default=200, help="decode steps per run (default: 200)")
    p.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.threads, args.steps)
    ratios = []
    for i in range(args.pairs):
        ms = {}
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--threads", str(args.threads), "--steps", str(args.steps)],
                check=True,
                capture_output=True,
                text=True,
            )
            ms[mode] = json.loads(out.stdout.strip().splitlines()[-1])["step_ms"]
        ratios.append(ms["on"] / ms["off"])
        print(
            f"pair {i + 1}: huge pages {ms['on']:.2f} ms, 4 KiB pages {ms['off']:.2f} ms, ratio {ratios[-1]:.3f}",
            file=sys.stderr,
        )
    print(f"median ratio on/off: {statistics.median(ratios):.3f}", file=sys.stderr)
    print(
        json.dumps(
            {
                "threads": args.threads,
                "ratios": ratios,
                "median_ratio": statistics.median(ratios),
                "load_average": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
