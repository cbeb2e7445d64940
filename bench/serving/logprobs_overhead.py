"""What logprobs cost the engine (bundled model, engine in-process).

1. Decode: steps of a batch of N rows where no row asks, every row asks `logprobs=0` (the chosen
   token's), or every row asks `logprobs=5` (and five alternatives): one engine per variant,
   stepped in turn (interleaved step by step: the machine is shared and noisy; only the ratios
   within a run mean anything). Median step time per variant and its ratio to "none".
2. Prompt scoring (echo + logprobs, how harnesses score): a P-token prompt prefilled with
   `prompt_logprobs=1` vs plainly (the LM head runs over every prompt row instead of one), in turn.

A readable table goes to stderr; the last stdout line is one JSON object with every figure.
Usage: python bench/serving/logprobs_overhead.py [--rows 8] [--steps 24] [--prompt 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import load_model
from sluice.types import GenerationRequest, SamplingParams

VARIANTS = {"none": None, "logprobs=0": 0, "logprobs=5": 5}


def _engine(model) -> LLMEngine:
    return LLMEngine(model, EngineConfig(kv_cache_gib=0.25, enable_prefix_caching=False))


def decode(model, rows: int, steps: int) -> dict[str, float]:
    prompt = model.tokenizer.encode("Tell me a long story about a lighthouse keeper and the sea.")
    engines = {}
    for name, n in VARIANTS.items():
        eng = _engine(model)
        for i in range(rows):
            eng.add_request(
                GenerationRequest(
                    f"{name}-{i}",
                    prompt,
                    SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True, logprobs=n),
                )
            )
        eng.step()  # the prefill
        engines[name] = eng
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(steps):
        for name, eng in engines.items():
            t = time.perf_counter()
            eng.step()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def scoring(model, prompt_len: int, rounds: int) -> dict[str, float]:
    base = model.tokenizer.encode("The lighthouse keeper watched the sea every night. " * 64)[:prompt_len]
    eng = _engine(model)
    times: dict[str, list[float]] = {"plain": [], "prompt_logprobs=1": []}
    for r in range(rounds):
        for name, n in (("plain", None), ("prompt_logprobs=1", 1)):
            t = time.perf_counter()
            eng.generate(
                [
                    GenerationRequest(
                        f"{name}-{r}",
                        base,
                        SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=n, logprobs=n),
                    )
                ]
            )
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    model = load_model(progress=False)
    dec = decode(model, args.rows, args.steps)
    sc = scoring(model, args.prompt, args.rounds)
    out = {
        "decode_step_s": dec,
        "decode_ratio": {k: v / dec["none"] for k, v in dec.items()},
        "scoring_s": sc,
        "scoring_ratio": sc["prompt_logprobs=1"] / sc["plain"],
        "rows": args.rows,
        "prompt_tokens": args.prompt,
    }
    for name, v in dec.items():
        print(f"decode, {args.rows} rows, {name:11s}: {v * 1000:7.2f} ms/step  x{v / dec['none']:.3f}", file=sys.stderr)
    for name, v in sc.items():
        print(f"score a {args.prompt}-token prompt, {name:17s}: {v * 1000:7.1f} ms", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
