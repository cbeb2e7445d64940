#!/usr/bin/env python3
"""What sampling at a temperature costs a decode step, and the nucleus (top-p) against the way
it was found before (the top 1,024 by topk, then a full sort if their mass fell short).

One engine (bundled model, CPU kernels, speculation off, 2 torch threads, torch's OpenMP passive
as in a worker) runs K requests per level at temperature --temperature and top_p --top-p, EOS
ignored; its decode steps alternate between the current `sampler._nucleus` and the previous one
(kept below as the baseline), the lead swapping every step (bench/kernels/paired_steps.py). Per level:
the median step wall time under each, the paired ratio of the step times, and the median time
of the step's `sample` call under each. The last stdout line is one JSON object.

    PYTHONPATH=src .venv/bin/python bench/kernels/sampling_cost.py --streams 1 8 32 --steps 24
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.*

import torch
from paired_steps import medians, paired_decode_steps

import bench.serving.engine_throughput  # noqa: F401  (sets torch's OpenMP passive before torch loads)
import sluice.engine.runner as runner_mod
import sluice.models.sampler as sampler
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import load_model


def topk_nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The nucleus as sluice found it before: the top 1,024 by topk, a full sort if short."""
    cap = min(probs.shape[0], 1024)
    p_sorted, idx = probs.topk(cap)
    cum = p_sorted.cumsum(0)
    if cum[-1] < top_p and cap < probs.shape[0]:
        p_sorted, idx = probs.sort(descending=True)
        cum = p_sorted.cumsum(0)
    keep = (cum - p_sorted) < top_p
    keep[0] = True
    return p_sorted[keep], idx[keep]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=24, help="paired decode steps per level (default 24)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    args = p.parse_args()
    torch.set_num_threads(2)
    loaded = load_model(progress=False)
    engine = LLMEngine(loaded, EngineConfig(speculative_tokens=0))

    # each step's `sample` call, timed under the side the step runs (none while warming up)
    current = sampler._nucleus
    active: list[str | None] = [None]
    sample_ms: dict[str, list[float]] = {"current": [], "topk": []}
    real_sample = runner_mod.sample

    def timed_sample(*a, **k):
        t = time.perf_counter()
        try:
            return real_sample(*a, **k)
        finally:
            if active[0] is not None:
                sample_ms[active[0]].append(1e3 * (time.perf_counter() - t))

    def side(name: str, nucleus):
        def switch() -> None:
            active[0] = name
            sampler._nucleus = nucleus

        return switch

    runner_mod.sample = timed_sample
    sides = {"current": side("current", current), "topk": side("topk", topk_nucleus)}
    sampling = {"temperature": args.temperature, "top_p": args.top_p}
    out: dict = {"params": vars(args)}
    first_id = 0
    for k in args.streams:
        for times in sample_ms.values():
            times.clear()
        steps = paired_decode_steps(engine, loaded.tokenizer, k, args.steps, sides, first_id, sampling)
        first_id += k
        active[0] = None
        sampler._nucleus = current
        level = medians(steps, "current", "topk")
        level.update({f"{name}_sample_ms": statistics.median(v[: args.steps]) for name, v in sample_ms.items()})
        out[f"x{k}"] = level
        print(
            f"x{k:<3d} step {level['topk_wall_ms']:7.2f} -> {level['current_wall_ms']:7.2f} ms "
            f"(paired {level['ratio_wall']:.3f}); sample {level['topk_sample_ms']:6.2f} -> "
            f"{level['current_sample_ms']:6.2f} ms",
            file=sys.stderr,
            flush=True,
        )
    out["load"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
