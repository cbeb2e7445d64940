#!/usr/bin/env python3
"""What sampling at a temperature costs a decode step, and the nucleus (top-p) against the way
it was found before (the top 1,024 by topk, then a full sort if their mass fell short).

One engine (bundled model, CPU kernels, default EngineConfig, 2 torch threads, torch's OpenMP
passive as in a worker) runs K requests per level on real chat prompts, EOS ignored, at
temperature --temperature and top_p --top-p; once all K decode, its steps alternate between
the current `sampler._nucleus` and the previous one (kept below as the baseline), the lead
swapping every step. Per level: the median step wall time and the median time of the step's
`sample` call under each, and the paired ratio of the step times. The last stdout line is one
JSON object.

    PYTHONPATH=src .venv/bin/python bench/sampling_cost.py --streams 1 8 32 --steps 24
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

from engine_throughput import prompts  # noqa: E402  (sets torch's OpenMP passive before torch loads)

import torch  # noqa: E402

import sluice.engine.runner as runner_mod  # noqa: E402
import sluice.models.sampler as sampler  # noqa: E402
from sluice.engine.config import EngineConfig  # noqa: E402
from sluice.engine.engine import LLMEngine  # noqa: E402
from sluice.models.loader import load_model  # noqa: E402
from sluice.types import GenerationRequest, SamplingParams  # noqa: E402


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
    current = sampler._nucleus
    sample_s: list[float] = []
    real_sample = runner_mod.sample

    def timed_sample(*a, **k):  # noqa: ANN002, ANN003, ANN202
        t = time.perf_counter()
        try:
            return real_sample(*a, **k)
        finally:
            sample_s.append(time.perf_counter() - t)

    runner_mod.sample = timed_sample
    out: dict = {"params": vars(args)}
    serial = 0
    for n in args.streams:
        engine.kv.reset_prefix_cache()
        params = SamplingParams(max_tokens=args.steps * 2 + 8, temperature=args.temperature, top_p=args.top_p,
                                ignore_eos=True)
        for ids in prompts(loaded.tokenizer, n):
            serial += 1
            engine.add_request(GenerationRequest(f"r{serial}", ids, params))
        rows: dict[str, list[tuple[float, float]]] = {"current": [], "topk": []}
        i = 0
        while engine.has_unfinished():
            side = "current" if i % 2 == 0 else "topk"
            sampler._nucleus = current if side == "current" else topk_nucleus
            sample_s.clear()
            t = time.perf_counter()
            engine.step()
            wall = time.perf_counter() - t
            stats = engine.stats()
            if stats.last_step_tokens == stats.last_step_seqs == n and sample_s:
                rows[side].append((wall, sample_s[0]))
            i += 1
        sampler._nucleus = current
        pairs = list(zip(rows["current"], rows["topk"]))
        level = {side: {"step_ms": 1e3 * statistics.median(w for w, _ in r), "sample_ms": 1e3 * statistics.median(s for _, s in r)}
                 for side, r in rows.items()}
        level["step_ratio"] = statistics.median(c[0] / b[0] for c, b in pairs)
        out[f"x{n}"] = level
        print(f"x{n:<3d} step {level['topk']['step_ms']:7.2f} -> {level['current']['step_ms']:7.2f} ms "
              f"(paired {level['step_ratio']:.3f}); sample {level['topk']['sample_ms']:6.2f} -> "
              f"{level['current']['sample_ms']:6.2f} ms", file=sys.stderr, flush=True)
    out["load"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
