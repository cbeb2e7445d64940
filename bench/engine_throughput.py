#!/usr/bin/env python3
"""Engine throughput on the bundled model: sluice vs transformers, side by side in one run.

Phases (fp32, 2 torch threads, 128 output tokens per request, ~100-token chat prompts, EOS
ignored so every request makes exactly 128 tokens):
  - transformers `generate`, one request at a time;
  - transformers static batch of 32 (left padding);
  - sluice LLMEngine at 1, 8 and 32 concurrent requests (submitted together);
  - prefix-cache overhead: 32 concurrent with the cache on (0 % hits: every prompt starts with a
    unique nonce) vs off, alternated.
Reports output tok/s, TTFT, per-stream decode tok/s (min and median over --runs), KV waste at
steady load, and the ratios the targets are stated in. Ends with one JSON line on stdout.

    .venv/bin/python bench/engine_throughput.py            # full: 3 runs (~15 min on 2 cores)
    .venv/bin/python bench/engine_throughput.py --quick    # 1 run, fewer requests (~3 min)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from tqdm import tqdm

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import default_model_path, load_model
from sluice.types import GenerationRequest, SamplingParams

SUBJECTS = ["rivers", "glaciers", "the printing press", "honeybees", "volcanoes", "chess openings", "sourdough",
            "lighthouses", "the Roman roads", "coral reefs", "jazz", "windmills", "comets", "silk", "paper maps",
            "owls", "tides", "clocks", "salt", "deserts", "violins", "bridges", "tea", "copper", "maple trees",
            "sailing", "caves", "trains", "the moon", "gardens", "libraries", "kites"]


def prompt_text(i: int, nonce: bool = False) -> str:
    head = f"[{i:04d}-{time.perf_counter_ns() % 100000}] " if nonce else ""
    s = SUBJECTS[i % len(SUBJECTS)]
    return (head + f"I am preparing a short lecture for curious students about {s}. Please explain what {s} are "
            f"or were, where they can be found, why they matter to people, and one surprising fact about "
            f"{s} that most people do not know. Keep the explanation friendly, accurate and concrete, "
            f"and finish with a question the students could discuss afterwards.")


def prompts(tokenizer, n: int, nonce: bool = False) -> list[list[int]]:
    return [tokenizer.encode_chat([{"role": "user", "content": prompt_text(i, nonce)}]) for i in range(n)]


def run_sluice(loaded, ids: list[list[int]], out_tokens: int, **cfg) -> dict:
    engine = LLMEngine(loaded, EngineConfig(**cfg))
    params = SamplingParams(max_tokens=out_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    for i, p in enumerate(ids):
        engine.add_request(GenerationRequest(f"r{i}", p, params))
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    waste: list[float] = []
    tokens = 0
    while engine.has_unfinished():
        events = engine.step()
        now = time.perf_counter()
        for ev in events:
            if ev.token_ids:
                first.setdefault(ev.request_id, now)
                last[ev.request_id] = now
                tokens += len(ev.token_ids)
        s = engine.stats()
        if s.num_waiting == 0 and s.num_running == len(ids):  # steady decode of the full batch
            waste.append(s.kv_waste)
    wall = time.perf_counter() - t0
    ttft = [first[k] - t0 for k in first]
    per_stream = [(out_tokens - 1) / (last[k] - first[k]) for k in first if last[k] > first[k]]
    return {
        "tok_s": tokens / wall,
        "ttft_ms": 1000 * statistics.median(ttft),
        "ttft_max_ms": 1000 * max(ttft),
        "per_stream_tok_s": statistics.median(per_stream),
        "decode_ms_per_token": 1000 / statistics.median(per_stream),
        "kv_waste": statistics.mean(waste) if waste else None,
    }


def hf_one_at_a_time(model, ids: list[list[int]], out_tokens: int) -> dict:
    t0 = time.perf_counter()
    ttfts, decode = [], []
    for p in ids:
        x = torch.tensor([p])
        s = time.perf_counter()
        model.generate(x, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        ttfts.append(time.perf_counter() - s)
        s = time.perf_counter()
        model.generate(x, max_new_tokens=out_tokens, min_new_tokens=out_tokens, do_sample=False)
        total = time.perf_counter() - s
        decode.append((total - ttfts[-1]) / (out_tokens - 1))
    wall = time.perf_counter() - t0
    # the TTFT probe runs the prompt twice; count only the real generation's time for throughput
    gen_time = wall - sum(ttfts)
    return {
        "tok_s": len(ids) * out_tokens / gen_time,
        "ttft_ms": 1000 * statistics.median(ttfts),
        "decode_ms_per_token": 1000 * statistics.median(decode),
        "per_stream_tok_s": 1 / statistics.median(decode),
    }


def hf_static_batch(model, tokenizer_pad: int, ids: list[list[int]], out_tokens: int) -> dict:
    width = max(len(p) for p in ids)
    input_ids = torch.tensor([[tokenizer_pad] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    t0 = time.perf_counter()
    model.generate(input_ids, attention_mask=mask, max_new_tokens=out_tokens, min_new_tokens=out_tokens,
                   do_sample=False, pad_token_id=tokenizer_pad)
    wall = time.perf_counter() - t0
    return {"tok_s": len(ids) * out_tokens / wall, "wall_s": wall}


def summarize(runs: list[dict]) -> dict:
    keys = [k for k in runs[0] if isinstance(runs[0][k], (int, float))]
    out = {}
    for k in keys:
        vals = [r[k] for r in runs if r[k] is not None]
        out[k] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="repetitions of every phase (default: 3)")
    p.add_argument("--out-tokens", type=int, default=128, help="output tokens per request (default: 128)")
    p.add_argument("--hf-requests", type=int, default=4, help="requests for transformers one-at-a-time (default: 4)")
    p.add_argument("--quick", action="store_true", help="1 run, 64 output tokens, fewer requests: a smoke run")
    p.add_argument("--skip-hf", action="store_true", help="skip the transformers phases")
    args = p.parse_args()
    if args.quick:
        args.runs, args.out_tokens, args.hf_requests = 1, 64, 2
    torch.set_num_threads(2)
    loaded = load_model(progress=False)
    tok = loaded.tokenizer
    ids32 = prompts(tok, 32)
    print(f"prompt lengths: {min(map(len, ids32))}-{max(map(len, ids32))} tokens", file=sys.stderr)
    hf = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        path = default_model_path()
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    phases = ["sluice x1", "sluice x8", "sluice x32", "cache on", "cache off"] + ([] if hf is None else ["hf x1", "hf batch 32"])
    results: dict[str, list[dict]] = {k: [] for k in phases}
    bar = tqdm(total=args.runs * len(phases), desc="benchmark", file=sys.stderr)
    with torch.inference_mode():
        for _ in range(args.runs):
            for phase in phases:
                if phase.startswith("sluice x"):
                    n = int(phase.split("x")[1])
                    results[phase].append(run_sluice(loaded, ids32[:n], args.out_tokens))
                elif phase == "cache on":
                    results[phase].append(run_sluice(loaded, prompts(tok, 32, nonce=True), args.out_tokens))
                elif phase == "cache off":
                    results[phase].append(run_sluice(loaded, prompts(tok, 32, nonce=True), args.out_tokens, enable_prefix_caching=False))
                elif phase == "hf x1":
                    results[phase].append(hf_one_at_a_time(hf, ids32[: args.hf_requests], args.out_tokens))
                else:
                    pad = tok.eos_token_ids[0] if tok.eos_token_ids else 0
                    results[phase].append(hf_static_batch(hf, pad, ids32, args.out_tokens))
                bar.update()
    bar.close()
    summary = {k: summarize(v) for k, v in results.items()}
    med = lambda phase, key: summary[phase][key]["median"]  # noqa: E731
    ratios = {
        "cache_on_vs_off_throughput": statistics.median(
            on["tok_s"] / off["tok_s"] for on, off in zip(results["cache on"], results["cache off"])
        ),
    }
    targets = {
        "kv_waste_under_4pct": med("sluice x32", "kv_waste") < 0.04,
        "ttft_x1_under_250ms": med("sluice x1", "ttft_ms") < 250,
        "prefix_cache_overhead_under_1pct": ratios["cache_on_vs_off_throughput"] > 0.99,
    }
    if hf is not None:
        ratios["x32_vs_hf_one_at_a_time"] = med("sluice x32", "tok_s") / med("hf x1", "tok_s")
        ratios["x32_vs_hf_static_batch"] = med("sluice x32", "tok_s") / med("hf batch 32", "tok_s")
        ratios["x1_decode_time_vs_hf"] = med("sluice x1", "decode_ms_per_token") / med("hf x1", "decode_ms_per_token")
        targets.update({
            "x32_at_least_10x_hf_one_at_a_time": ratios["x32_vs_hf_one_at_a_time"] >= 10,
            "x32_at_least_1.5x_hf_static_batch": ratios["x32_vs_hf_static_batch"] >= 1.5,
            "x1_decode_within_1.2x_hf": ratios["x1_decode_time_vs_hf"] <= 1.2,
        })
    print(f"\n{'phase':<14}{'tok/s':>9}{'TTFT ms':>10}{'stream tok/s':>14}{'ms/token':>10}", file=sys.stderr)
    for phase in phases:
        s = summary[phase]
        get = lambda k: s[k]["median"] if k in s else float("nan")  # noqa: E731
        print(f"{phase:<14}{get('tok_s'):>9.1f}{get('ttft_ms'):>10.0f}{get('per_stream_tok_s'):>14.1f}"
              f"{get('decode_ms_per_token'):>10.1f}", file=sys.stderr)
    print(f"KV waste at steady load (x32): {100 * med('sluice x32', 'kv_waste'):.2f} %", file=sys.stderr)
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}", file=sys.stderr)
    for k, ok in targets.items():
        print(f"  {'met    ' if ok else 'NOT met'}  {k}", file=sys.stderr)
    print(json.dumps({"config": vars(args), "summary": summary, "ratios": ratios, "targets": targets}))


if __name__ == "__main__":
    main()
