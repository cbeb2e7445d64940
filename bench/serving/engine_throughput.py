#!/usr/bin/env python3
"""Engine throughput on the bundled model: sluice vs Hugging Face transformers, side by side.

Every phase runs on the bundled SmolLM2-135M-Instruct, fp32 on the CPU (--dtype / --device choose
others; both sides run there), torch threads = --threads (2), --out-tokens (128) output tokens per
request with EOS ignored (so lengths are exact), on ~100-token chat prompts that share only the
chat template's first KV block:

  hf x1         transformers `generate`, one request at a time (greedy, min/max_new_tokens = 128);
                TTFT from a separate max_new_tokens=1 call on the same prompt, per-token decode time
                = (generate time - TTFT) / 127; alternates request by request with sluice x1
  hf batch N    transformers static batch of N (left padding, pad token = EOS)
  sluice xK     LLMEngine, K requests submitted at once, step() until done, for K in 1, 8, 32, 256, N
                (those up to N):
                TTFT = submit -> first token event; per-stream decode tok/s =
                (output tokens - 1) / (last token - first token); KV waste = mean of
                stats().kv_waste over the steps where all N run and none waits
  cache on/off  N concurrent requests whose prompts open with a unique nonce (0 % prefix hits) on
                two engines, prefix caching on and off, stepped alternately (one step() each in
                turn); each engine's tok/s is over its own busy time, so machine noise hits both;
                the overhead target uses the median over steps of (step time on / step time off),
                which is robust to bursts of other work that land on one engine's step only

The sluice engines (default EngineConfig unless --set) are built once and reused by every run, as
in a long-running server; the prefix cache is reset between phases. "CPU share" is this process's
CPU time over wall time x threads during a phase: well under 1.0 means other work on the machine
took cores from the phase and its absolute figures are pessimistic.

Each run (--runs) does every phase once; ratios are taken within a run (the machine is shared and
noisy, so phases far apart in time are not compared) and summarized by their median. The table
on stderr shows the median and min over runs; the last stdout line is one JSON object with every
figure, the per-run values and the targets met / not met.

    .venv/bin/python bench/serving/engine_throughput.py             # full: 3 runs, ~10-15 min on 2 cores
    .venv/bin/python bench/serving/engine_throughput.py --quick     # smoke: 1 run, batch 8, 32 tokens
    .venv/bin/python bench/serving/engine_throughput.py --skip-hf --only x32 --set max_num_batched_tokens=1024
    # kernels vs torch path (bench/serving/engine_paths.py):
    .venv/bin/python bench/serving/engine_throughput.py --paths --quick
    .venv/bin/python bench/serving/engine_throughput.py --device cuda --batch 256 --skip-cache \
        --set max_num_seqs=256 --set max_num_batched_tokens=8192 --set kv_cache_gib=16   # a GPU: 1/8/32/256
    .venv/bin/python bench/serving/engine_throughput.py --random-init tiny --quick --skip-cache   # no checkpoint

--random-init SHAPE runs a random-initialised model instead (models/random_init.py: `small` has
the bundled model's shapes, `1b` a Llama-3.2-1B's, `tiny` is for smoke checks), weights drawn from
--seed on the device, the same state dict for sluice and transformers; prompts are synthetic ids
of the same lengths (~100 tokens, a shared 16-token head, then distinct), as no real tokenizer is
needed for throughput. That is how the GPU figures are taken where no checkpoint can travel
(bench/serving/gpu_session.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sluice.openmp_wait import sleep_when_idle

sleep_when_idle()  # torch's OpenMP as in a worker: set before torch loads (sluice/openmp_wait.py)

import torch
from tqdm import tqdm

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import LoadedModel, default_model_path, load_model
from sluice.models.random_init import SHAPES, hf_model, load_random_model, random_state_dict
from sluice.types import GenerationRequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common
from bench.common import log

SUBJECTS = [
    "Rivers",
    "Glaciers",
    "The printing press",
    "Honeybees",
    "Volcanoes",
    "Chess openings",
    "Sourdough",
    "Lighthouses",
    "The Roman roads",
    "Coral reefs",
    "Jazz",
    "Windmills",
    "Comets",
    "Silk",
    "Paper maps",
    "Owls",
    "Tides",
    "Clocks",
    "Salt",
    "Deserts",
    "Violins",
    "Bridges",
    "Tea",
    "Copper",
    "Maple trees",
    "Sailing ships",
    "Caves",
    "Trains",
    "The moon",
    "Gardens",
    "Libraries",
    "Kites",
    "Penguins",
    "Earthquakes",
    "Bread ovens",
    "Telescopes",
    "Rainforests",
    "Canals",
    "Mushrooms",
    "Typewriters",
]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# (name, comparison, threshold): what docs/BENCHMARKS.md states as the engine's targets
TARGETS = [
    ("sluice_xN_vs_hf_one_at_a_time", ">=", 10.0),
    ("sluice_xN_vs_hf_static_batch", ">=", 1.5),
    ("sluice_x1_decode_time_vs_hf", "<=", 1.2),
    ("sluice_x1_ttft_ms", "<", 250.0),
    ("kv_waste_xN", "<", 0.04),
    ("prefix_cache_overhead", "<", 0.01),
]


# -- prompts ------------------------------------------------------------------------------------
def prompt_messages(i: int, nonce: bool = False) -> list[dict]:
    """~100 tokens. The subject opens the user turn, so two prompts share only the template header
    (the first 16-token block). With `nonce`, a unique tag opens the system line: no block shared."""
    s = SUBJECTS[i % len(SUBJECTS)]
    if i >= len(SUBJECTS):  # 256 streams: a numbered subject, so prompts still share only the header
        s = f"{s} {i // len(SUBJECTS)}"
    lower = s[0].lower() + s[1:]
    user = (
        f"{s}: I am preparing a short lecture for curious students on this topic. Please explain what "
        f"{lower} are or were, where they can be found, why they matter to people, and one surprising fact "
        f"about {lower} that most people do not know. Keep it friendly, accurate and concrete, and finish "
        f"with a question the students could discuss afterwards."
    )
    system = f"[{i:04d}] {SYSTEM}" if nonce else SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def prompts(tokenizer, n: int, nonce: bool = False) -> list[list[int]]:
    return [tokenizer.encode_chat(prompt_messages(i, nonce)) for i in range(n)]


def synthetic_prompts(vocab: int, n: int, nonce: bool = False, length: int = 100) -> list[list[int]]:
    """Token ids for a random-init model: a 16-token head every prompt shares (the chat template's
    first blocks), then ids distinct per prompt; with `nonce`, a unique first id (no block shared)."""
    head = [1 + (j * 7919) % (vocab - 1) for j in range(16)]
    out = []
    for i in range(n):
        body = [1 + (i * 104729 + j * 7907 + 13) % (vocab - 1) for j in range(length - 16 - i % 7)]
        p = head + body
        if nonce:
            p[0] = 1 + (i * 31) % (vocab - 1)
        out.append(p)
    return out


# -- sluice -------------------------------------------------------------------------------------
class Meter:
    """Wall time and this process's CPU share over a phase: cpu_share well under 1.0 means other
    work on the machine took cores from us during the phase (its figures are pessimistic)."""

    def __init__(self, threads: int):
        self.threads = threads
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def cpu_share(self) -> float:
        wall = time.perf_counter() - self.wall0
        return (time.process_time() - self.cpu0) / (wall * self.threads) if wall > 0 else 0.0


_ids = itertools.count()


def submit(engine: LLMEngine, ids: list[list[int]], out_tokens: int) -> list[str]:
    # Engines are reused across phases like a long-running server; forget cached prefixes so
    # that a phase never hits blocks left by an earlier one (the prompts repeat across runs).
    engine.kv.reset_prefix_cache()
    params = SamplingParams(max_tokens=out_tokens, temperature=0.0, ignore_eos=True)
    rids = [f"r{next(_ids)}" for _ in ids]
    for rid, p in zip(rids, ids):
        engine.add_request(GenerationRequest(rid, p, params))
    return rids


def run_sluice(engine: LLMEngine, ids: list[list[int]], out_tokens: int, threads: int, bar: tqdm | None = None) -> dict:
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    waste: list[float] = []
    tokens = 0
    meter = Meter(threads)
    t0 = time.perf_counter()
    hits0 = engine.stats().prefix_cache_hits
    rids = submit(engine, ids, out_tokens)
    while engine.has_unfinished():
        events = engine.step()
        now = time.perf_counter()
        for ev in events:
            if ev.token_ids:
                first.setdefault(ev.request_id, now)
                last[ev.request_id] = now
                tokens += len(ev.token_ids)
        s = engine.stats()
        if s.num_waiting == 0 and s.num_running == len(ids):  # steady decode of the whole batch
            waste.append(s.kv_waste)
        if bar is not None:
            bar.update(sum(len(ev.token_ids) for ev in events))
    wall = time.perf_counter() - t0
    if tokens != len(ids) * out_tokens:
        raise RuntimeError(f"expected {len(ids) * out_tokens} output tokens, got {tokens}")
    ttft = [first[r] - t0 for r in rids]
    per_stream = [(out_tokens - 1) / (last[k] - first[k]) for k in first if last[k] > first[k]]
    return {
        "tok_s": tokens / wall,
        "wall_s": wall,
        "ttft_ms": 1000 * statistics.median(ttft),
        "ttft_max_ms": 1000 * max(ttft),
        "per_stream_tok_s": statistics.median(per_stream) if per_stream else None,
        "decode_ms_per_token": 1000 / statistics.median(per_stream) if per_stream else None,
        "kv_waste": statistics.mean(waste) if waste else None,
        "prefix_cache_hit_tokens": engine.stats().prefix_cache_hits - hits0,
        "cpu_share": meter.cpu_share(),
    }


def run_interleaved(
    engines: dict[str, LLMEngine], ids: list[list[int]], out_tokens: int, threads: int, bar: tqdm | None = None
) -> dict[str, dict]:
    """The same workload on several engines at once, one step() of each in turn (the lead swaps
    every round), each engine's throughput taken over its own busy time. A slow second on a
    shared machine then lands on every engine alike: differences of 1 % stay measurable."""
    names = list(engines)
    busy = {k: 0.0 for k in names}
    steps: dict[str, list[float]] = {k: [] for k in names}
    tokens = {k: 0 for k in names}
    hits0 = {k: e.stats().prefix_cache_hits for k, e in engines.items()}
    meter = Meter(threads)
    for k in names:
        t = time.perf_counter()
        submit(engines[k], ids, out_tokens)
        busy[k] += time.perf_counter() - t
    rnd = 0
    while any(e.has_unfinished() for e in engines.values()):
        order = names if rnd % 2 == 0 else names[::-1]
        rnd += 1
        for k in order:
            e = engines[k]
            if not e.has_unfinished():
                continue
            t = time.perf_counter()
            events = e.step()
            dt = time.perf_counter() - t
            busy[k] += dt
            steps[k].append(dt)
            n = sum(len(ev.token_ids) for ev in events)
            tokens[k] += n
            if bar is not None:
                bar.update(n)
    share = meter.cpu_share()
    # The engines run the same workload, so their k-th steps carry the same tokens: the median of
    # the per-step time ratios ignores the bursts of other work that land on one side only.
    base = steps[names[-1]]

    def paired(k: str) -> float | None:
        return statistics.median(a / b for a, b in zip(steps[k], base)) if len(steps[k]) == len(base) else None

    return {
        k: {
            "tok_s": tokens[k] / busy[k],
            "busy_s": busy[k],
            "cpu_share": share,
            "steps": len(steps[k]),
            "step_time_vs_last": paired(k),
            "prefix_cache_hit_tokens": engines[k].stats().prefix_cache_hits - hits0[k],
        }
        for k in names
    }


# -- transformers -------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    """Wait for queued GPU work before reading a host clock (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_one_at_a_time(model, ids: list[list[int]], out_tokens: int, threads: int, bar: tqdm | None = None) -> dict:
    ttfts, decode, gen = [], [], []
    meter = Meter(threads)
    for p in ids:
        x = torch.tensor([p], device=model.device)
        mask = torch.ones_like(x)
        s = time.perf_counter()
        model.generate(x, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        _sync(model.device)
        ttfts.append(time.perf_counter() - s)
        s = time.perf_counter()
        out = model.generate(
            x, attention_mask=mask, max_new_tokens=out_tokens, min_new_tokens=out_tokens, do_sample=False
        )
        _sync(model.device)
        gen.append(time.perf_counter() - s)
        assert out.shape[1] - len(p) == out_tokens
        # decode time per token: the full generation minus its prefill (the TTFT probe's time)
        decode.append((gen[-1] - ttfts[-1]) / (out_tokens - 1))
        if bar is not None:
            bar.update(out_tokens)
    return {
        "tok_s": len(ids) * out_tokens / sum(gen),  # the TTFT probes are not counted
        "wall_s": sum(gen),
        "ttft_ms": 1000 * statistics.median(ttfts),
        "per_stream_tok_s": 1 / statistics.median(decode),
        "decode_ms_per_token": 1000 * statistics.median(decode),
        "cpu_share": meter.cpu_share(),
    }


def x1_paired(
    engine: LLMEngine,
    hf,
    ids: list[list[int]],
    out_tokens: int,
    threads: int,
    bar: tqdm | None = None,
) -> tuple[dict, dict | None, list[float]]:
    """One request at a time, each prompt through transformers then straight away through sluice,
    so the per-token decode ratio compares requests seconds apart. Returns (sluice, hf, ratios)."""
    ours, theirs, ratios = [], [], []
    for p in ids:
        if hf is not None:
            theirs.append(hf_one_at_a_time(hf, [p], out_tokens, threads, bar))
        ours.append(run_sluice(engine, [p], out_tokens, threads, bar))
        if hf is not None:
            ratios.append(ours[-1]["decode_ms_per_token"] / theirs[-1]["decode_ms_per_token"])
    return merge_single(ours), merge_single(theirs) if theirs else None, ratios


def merge_single(results: list[dict]) -> dict:
    """Requests run one after another: tok/s over their total time, the rest as medians."""
    merged = {k: statistics.median(r[k] for r in results) for k in results[0] if results[0][k] is not None}
    merged["wall_s"] = sum(r["wall_s"] for r in results)
    merged["tok_s"] = sum(r["tok_s"] * r["wall_s"] for r in results) / merged["wall_s"]
    return merged


def hf_static_batch(
    model, pad: int, ids: list[list[int]], out_tokens: int, threads: int, bar: tqdm | None = None
) -> dict:
    width = max(len(p) for p in ids)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in ids], device=model.device)  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids], device=model.device)
    meter = Meter(threads)
    t0 = time.perf_counter()
    out = model.generate(
        input_ids,
        attention_mask=mask,
        max_new_tokens=out_tokens,
        min_new_tokens=out_tokens,
        do_sample=False,
        pad_token_id=pad,
    )
    _sync(model.device)
    wall = time.perf_counter() - t0
    assert out.shape[1] - width == out_tokens
    if bar is not None:
        bar.update(len(ids) * out_tokens)
    return {
        "tok_s": len(ids) * out_tokens / wall,
        "wall_s": wall,
        "per_stream_tok_s": out_tokens / wall,
        "cpu_share": meter.cpu_share(),
    }


# -- summary ------------------------------------------------------------------------------------
def summarize(runs: list[dict]) -> dict:
    out = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
        if vals:
            out[k] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
    return out


def per_run_ratios(results: dict[str, list[dict]], n: int, runs: int) -> dict[str, list[float]]:
    """Each ratio from phases of the same run, so slow minutes on a shared machine hit both sides."""
    big = f"sluice x{n}"
    out: dict[str, list[float]] = {}

    def add(name: str, f) -> None:
        try:
            out[name] = [f(i) for i in range(runs)]
        except (KeyError, IndexError, TypeError):
            pass

    r = results
    add("sluice_xN_vs_hf_one_at_a_time", lambda i: r[big][i]["tok_s"] / r["hf x1"][i]["tok_s"])
    add("sluice_xN_vs_hf_static_batch", lambda i: r[big][i]["tok_s"] / r[f"hf batch {n}"][i]["tok_s"])
    add("sluice_x1_decode_time_vs_hf", lambda i: statistics.median(r["x1 pairs"][i]))
    add("prefix_cache_on_vs_off_throughput", lambda i: r["cache on"][i]["tok_s"] / r["cache off"][i]["tok_s"])
    add("prefix_cache_on_vs_off_step_time", lambda i: r["cache on"][i]["step_time_vs_last"])
    return out


def check_targets(summary: dict, ratios: dict, n: int) -> dict:
    med = {k: statistics.median(v) for k, v in ratios.items()}
    values = dict(med)
    if "prefix_cache_on_vs_off_step_time" in med:  # the noise-robust estimate (see run_interleaved)
        values["prefix_cache_overhead"] = med["prefix_cache_on_vs_off_step_time"] - 1
    if "sluice x1" in summary:
        values["sluice_x1_ttft_ms"] = summary["sluice x1"]["ttft_ms"]["median"]
    if "kv_waste" in summary.get(f"sluice x{n}", {}):
        values["kv_waste_xN"] = summary[f"sluice x{n}"]["kv_waste"]["median"]
    ops = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b}
    return {
        name: {"value": values[name], "target": f"{op} {bound:g}", "met": ops[op](values[name], bound)}
        for name, op, bound in TARGETS
        if name in values
    }


def print_table(phases: list[str], summary: dict, ratios: dict, targets: dict, n: int, args) -> None:
    def cell(phase: str, key: str, fmt: str, stat: str) -> str:
        v = summary[phase].get(key, {}).get(stat)
        return format(v, fmt) if v is not None else "-"

    log()
    log(
        f"{args.out_tokens} output tokens/request, {args.dtype} on {args.device}, "
        f"{args.threads} threads, {args.runs} run(s); "
        "each cell: median (min) over runs"
    )
    head = (
        f"{'phase':<14}{'out tok/s':>18}{'TTFT ms':>16}{'stream tok/s':>16}{'ms/token':>10}{'KV waste':>10}"
        f"{'CPU share':>11}"
    )
    log(head)
    log("-" * len(head))
    for phase in phases:
        row = f"{phase:<14}"
        for key, fmt, width in (("tok_s", ".1f", 18), ("ttft_ms", ".0f", 16), ("per_stream_tok_s", ".1f", 16)):
            med, lo = cell(phase, key, fmt, "median"), cell(phase, key, fmt, "min")
            row += f"{med + ' (' + lo + ')' if med != '-' else '-':>{width}}"
        row += f"{cell(phase, 'decode_ms_per_token', '.1f', 'median'):>10}"
        kw = summary[phase].get("kv_waste", {}).get("median")
        row += f"{'-' if kw is None else f'{100 * kw:.2f} %':>10}"
        row += f"{cell(phase, 'cpu_share', '.2f', 'median'):>11}"
        log(row)
    log()
    for name, vals in ratios.items():
        log(f"{name:<36} {statistics.median(vals):7.3f}   per run: {', '.join(f'{v:.3f}' for v in vals)}")
    if targets:
        log("\ntargets" + ("" if n == 32 else f" (N = {n}; the targets are stated for N = 32)"))
        for name, t in targets.items():
            log(f"  {'met    ' if t['met'] else 'NOT met'}  {name:<36} {t['value']:10.3f}  (target {t['target']})")


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="repetitions of every phase (default: 3)")
    p.add_argument("--out-tokens", type=int, default=128, help="output tokens per request, EOS ignored (default: 128)")
    p.add_argument(
        "--batch",
        type=int,
        default=32,
        help="N: the largest sluice concurrency, the transformers static batch and the cache on/off "
        "concurrency (default: 32)",
    )
    p.add_argument(
        "--hf-requests",
        type=int,
        default=4,
        help="requests per run one at a time: transformers and sluice x1 alternate request by "
        "request on the same prompts (default: 4)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default: 2)")
    p.add_argument(
        "--device",
        default="cpu",
        help="where sluice and transformers run: cpu, cuda, cuda:N or auto (default: cpu, the documented "
        "figures); on a GPU use --batch 256 for the 1/8/32/256-stream levels (docs/BENCHMARKS.md, GPU)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="weights and KV of both sides (default: float32, the exact mode)",
    )
    p.add_argument(
        "--random-init",
        choices=sorted(SHAPES),
        default=None,
        help="a random-initialised model of these shapes instead of the bundled one (small: the "
        "bundled model's, 1b: Llama-3.2-1B's), synthetic prompt ids; for machines no checkpoint reaches",
    )
    p.add_argument("--seed", type=int, default=0, help="--random-init: the weights' seed (default: 0)")
    p.add_argument("--json-out", default=None, help="also write the final JSON record to this file")
    p.add_argument(
        "--quick", action="store_true", help="smoke check: 1 run, --batch 8, --out-tokens 32, --hf-requests 1"
    )
    p.add_argument("--skip-hf", action="store_true", help="skip the transformers phases (no ratios against it)")
    p.add_argument("--skip-cache", action="store_true", help="skip the prefix-cache on/off phases")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated sluice phases to run, e.g. 'x32' or 'x1,x32' (default: all); "
        "the transformers and cache phases still run unless skipped",
    )
    p.add_argument(
        "--paths",
        action="store_true",
        help="instead: sluice's torch path, CPU kernels (exact) and fast numerics side by side at 1, 8 "
        "and N streams, long prompts, resident memory (see bench/serving/engine_paths.py)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an EngineConfig field for every sluice phase (repeatable), e.g. "
        "--set max_num_batched_tokens=1024; for exploration: the documented figures use the defaults",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.batch, args.out_tokens, args.hf_requests = 1, 8, 32, 1
    if args.runs < 1 or args.batch < 1 or args.out_tokens < 2 or args.hf_requests < 1:
        p.error("--runs, --batch, --hf-requests must be >= 1 and --out-tokens >= 2")
    args.config = parse_overrides(p, args.set)
    return args


def parse_overrides(p: argparse.ArgumentParser, items: list[str]) -> dict:
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    cfg: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            p.error(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(fields)}")
        default = getattr(EngineConfig(), key)
        if isinstance(default, bool):
            cfg[key] = raw.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int) or key == "num_kv_blocks":
            cfg[key] = int(raw)
        elif isinstance(default, float):
            cfg[key] = float(raw)
        else:
            cfg[key] = raw
    try:
        EngineConfig(**cfg)
    except ValueError as exc:
        p.error(f"--set: {exc}")
    return cfg


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.paths:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from engine_paths import run_paths

        print(json.dumps(run_paths(args, log, prompts, submit)), flush=True)
        return
    n = args.batch
    levels, phases = _phases(args, n)
    loaded, ids, nonce_ids, hf = _load(args, n)
    tok = loaded.tokenizer
    pad = tok.eos_token_ids[0] if tok.eos_token_ids else 0

    results: dict[str, list[Any]] = {k: [] for k in phases}  # per phase its runs; "x1 pairs": per run its pairs
    with torch.inference_mode():
        # One engine per configuration, reused by every run (as in a long-running server)
        main_cfg = EngineConfig(**args.config)
        engines = {"main": LLMEngine(loaded, main_cfg)}
        if not args.skip_cache:
            for name, on in (("cache on", True), ("cache off", False)):
                cfg = dataclasses.replace(main_cfg, enable_prefix_caching=on)
                engines[name] = engines["main"] if cfg == main_cfg else LLMEngine(loaded, cfg)
        # warm-up: first calls pay for kernel selection and allocator growth
        for e in {id(e): e for e in engines.values()}.values():
            run_sluice(e, ids[:2], 8, args.threads)
        if hf is not None:
            hf.generate(
                torch.tensor([ids[0]], device=hf.device),
                attention_mask=torch.ones(1, len(ids[0]), dtype=torch.long, device=hf.device),
                max_new_tokens=4,
                do_sample=False,
            )
        per_run = {f"sluice x{k}": k for k in levels}
        if "sluice x1" in per_run:
            per_run["sluice x1"] = args.hf_requests
        if not args.skip_cache:
            per_run["cache"] = 2 * n
        if hf is not None:
            per_run["hf x1"] = args.hf_requests
            per_run[f"hf batch {n}"] = n
        total = args.runs * sum(per_run.values()) * args.out_tokens
        bar = tqdm(total=total, desc="benchmark", unit="tok", file=sys.stderr, dynamic_ncols=True)
        for run in range(args.runs):
            for phase in phases:
                bar.set_postfix_str(f"run {run + 1}/{args.runs}: {phase}")
                start = (run * args.hf_requests) % n
                x1_ids = [ids[(start + j) % n] for j in range(args.hf_requests)]
                if phase == "sluice x1":
                    ours, theirs, pairs = x1_paired(engines["main"], hf, x1_ids, args.out_tokens, args.threads, bar)
                    results[phase].append(ours)
                    if theirs is not None:
                        results["hf x1"].append(theirs)
                        results.setdefault("x1 pairs", []).append(pairs)
                elif phase.startswith("sluice x"):
                    k = int(phase.split("x")[1])
                    results[phase].append(run_sluice(engines["main"], ids[:k], args.out_tokens, args.threads, bar))
                elif phase == "cache on":
                    pair = {k: engines[k] for k in ("cache on", "cache off")}
                    for name, r in run_interleaved(pair, nonce_ids, args.out_tokens, args.threads, bar).items():
                        results[name].append(r)
                elif phase == "cache off":
                    pass  # measured together with "cache on"
                elif phase == "hf x1":
                    if "sluice x1" not in phases:  # --only without x1: transformers alone
                        results[phase].append(hf_one_at_a_time(hf, x1_ids, args.out_tokens, args.threads, bar))
                else:
                    results[phase].append(hf_static_batch(hf, pad, ids, args.out_tokens, args.threads, bar))
        bar.close()

    record = _record(args, phases, results, loaded, engines["main"], ids)
    print(json.dumps(record), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(record, f)


def _phases(args: argparse.Namespace, n: int) -> tuple[list[int], list[str]]:
    """The batch sizes measured, and the phases in the order they run."""
    levels = sorted({k for k in (1, 8, 32, 256, n) if k <= n})
    if args.only:
        wanted = {s.strip().lstrip("x") for s in args.only.split(",")}
        levels = [k for k in levels if str(k) in wanted]
    # adjacent phases are the ones compared: x1 with hf x1 (interleaved per request), xN with hf batch N
    phases = [f"sluice x{k}" for k in levels]
    if not args.skip_hf:
        phases.insert(phases.index("sluice x1") + 1 if "sluice x1" in phases else 0, "hf x1")
        phases.append(f"hf batch {n}")
    if not args.skip_cache:
        phases += ["cache on", "cache off"]
    return levels, phases


def _load(args: argparse.Namespace, n: int) -> tuple[LoadedModel, list[list[int]], list[list[int]], Any]:
    """The model, n prompts, n prompts no cache has seen, and transformers' model of the same
    weights (None with --skip-hf)."""
    state = None
    if args.random_init:
        log(f"random-init model: {args.random_init} shapes, seed {args.seed}, {args.dtype} on {args.device} ...")
        state = random_state_dict(args.random_init, args.seed, args.dtype, args.device)
        loaded = load_random_model(args.random_init, args.seed, args.dtype, args.device, state=state)
        ids = synthetic_prompts(loaded.config.vocab_size, n)
        nonce_ids = synthetic_prompts(loaded.config.vocab_size, n, nonce=True)
    else:
        log(f"loading the bundled model ({default_model_path().name}) ...")
        loaded = load_model(progress=False, device=args.device, dtype=args.dtype)
        ids = prompts(loaded.tokenizer, n)
        nonce_ids = prompts(loaded.tokenizer, n, nonce=True)
    log(
        f"prompt lengths: {min(map(len, ids))}-{max(map(len, ids))} tokens; engine config overrides: "
        f"{args.config or 'none (defaults)'}"
    )
    if args.skip_hf:
        return loaded, ids, nonce_ids, None
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    if state is not None:  # the same weights, built by transformers' own LlamaForCausalLM
        return loaded, ids, nonce_ids, hf_model(args.random_init, state, args.dtype, loaded.model.device)
    path = default_model_path()
    hf = (
        AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=getattr(torch, args.dtype))
        .to(loaded.model.device)  # type: ignore[arg-type]  # transformers types .to's wrapper as taking a model
        .eval()
    )
    return loaded, ids, nonce_ids, hf


def _record(
    args: argparse.Namespace,
    phases: list[str],
    results: dict[str, list[Any]],
    loaded: LoadedModel,
    main: LLMEngine,
    ids: list[list[int]],
) -> dict[str, Any]:
    """The figures (printed as a table on the way) and what they were measured on."""
    n = args.batch
    summary = {k: summarize(v) for k, v in results.items() if k != "x1 pairs"}
    ratios = per_run_ratios(results, n, args.runs)
    targets = check_targets(summary, ratios, n)
    print_table(phases, summary, ratios, targets, n, args)
    hits = [r["prefix_cache_hit_tokens"] for r in results.get("cache on", [])]
    if hits and max(hits) > 0:
        log(f"warning: the cache-on phase hit {max(hits)} cached tokens; the overhead figure is not at 0 % hits")
    graphs = main.runner.graphs
    return {
        "bench": "engine_throughput",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpu": _cpu_name(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": str(loaded.model.device),
            "gpu": torch.cuda.get_device_name(loaded.model.device) if loaded.model.device.type == "cuda" else None,
        },
        "model": loaded.config.name,
        "weight_bytes": loaded.model.weight_bytes(),
        "graph_replays": graphs.replays if graphs is not None else None,
        "graph_failure": graphs.failure if graphs is not None else None,
        "args": {k: v for k, v in vars(args).items() if k not in ("set",)},
        "engine_config": dataclasses.asdict(EngineConfig(**args.config)),
        "prompt_tokens": {"min": min(map(len, ids)), "max": max(map(len, ids))},
        "summary": summary,
        "ratios": {k: {"median": statistics.median(v), "per_run": v} for k, v in ratios.items()},
        "targets": targets,
        "runs": results,
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
