#!/usr/bin/env python3
"""sluice against llama.cpp on the same GGUF, side by side in one run (a benchmark, not a test;
llama.cpp is not a dependency of sluice).

Starts `sluice serve` (its defaults, or what --sluice-arg adds) and a llama.cpp server on the
same GGUF file (default: the bundled SmolLM2-135M-Instruct), then sends both the same streaming
chat load (OpenAI `/v1/chat/completions`, greedy, `ignore_eos`, --max-tokens new tokens) at each
level of concurrent streams (closed loop, 2 x streams requests per level), alternating which
server goes first in every round. The llama.cpp side is either its own C++ server
(`--llama-server PATH`: `llama-server -m GGUF -t T -tb T -c 8192 -np 32 -cb`, continuous batching
over 32 slots) or, when only the Python bindings are installed, llama-cpp-python's server
(`--llama-python PY`: `PY -m llama_cpp.server`, which runs one request at a time, so its 32-stream
figures are not llama.cpp's batching; the report says which side ran).

Per side and level: TTFT p50, per-stream decode tok/s (median over requests of (chunks - 1) /
(last chunk - first chunk)), aggregate tok/s (output tokens / wall time of the level), and the
ratios sluice / llama.cpp of the medians; then each round's aggregate ratio per level, with their
median. Ends with one JSON line.

    PYTHONPATH=src .venv/bin/python bench/serving/vs_llamacpp.py --llama-server /path/to/llama-server [--rounds 3]
    PYTHONPATH=src .venv/bin/python bench/serving/vs_llamacpp.py --llama-python /path/to/venv/bin/python
    PYTHONPATH=src .venv/bin/python bench/serving/vs_llamacpp.py --llama-server PATH --levels 1 \
        --workload quote --max-tokens 80
    PYTHONPATH=src .venv/bin/python bench/serving/vs_llamacpp.py --llama-server PATH --sluice-env SLUICE_KERNEL_ISA=avx2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from workloads import WORKLOADS

from bench.common import PROMPT_TOPICS
from tests.server_process import MODEL, free_port, start_server

SUBJECTS = PROMPT_TOPICS


class LlamaCpp:
    """A llama.cpp server on a free port, stopped by its PID."""

    def __init__(self, gguf: Path, threads: int, server: str | None, python: str | None, slots: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkdtemp(prefix="llamacpp-")) / "out.log"
        if server:
            self.kind = "llama-server (C++, continuous batching)"
            cmd = [
                server,
                "-m",
                str(gguf),
                "-t",
                str(threads),
                "-tb",
                str(threads),
                "-c",
                "8192",
                "-np",
                str(slots),
                "-cb",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ]
        else:
            assert python is not None
            self.kind = "llama-cpp-python server (one request at a time)"
            cmd = [
                python,
                "-m",
                "llama_cpp.server",
                "--model",
                str(gguf),
                "--n_threads",
                str(threads),
                "--n_threads_batch",
                str(threads),
                "--n_ctx",
                "8192",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("llama.cpp was not ready after 300 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# --context: a text put before the request (one sentence is ~33 tokens of the bundled tokenizer;
# the prompt's real length is reported from `usage`)
SENTENCE = (
    "The keeper climbed the steps each evening, trimmed the wick, wound the clockwork and wrote the weather "
    "in a leather book while ships passed in the night. "
)
CONTEXT = {"text": "", "workload": ""}


async def one_stream(c: httpx.AsyncClient, url: str, model: str, i: int, max_tokens: int) -> dict[str, float]:
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {
                "role": "user",
                "content": CONTEXT["text"]
                + (CONTEXT["workload"] or f"Write a long story about {SUBJECTS[i % len(SUBJECTS)]} ({i})."),
            }
        ],
    }
    t0 = time.perf_counter()
    first = last = None
    usage_tokens = None
    prompt_tokens = float("nan")
    async with aconnect_sse(c, "POST", url + "/v1/chat/completions", json=body) as es:
        async for sse in es.aiter_sse():
            if sse.data == "[DONE]":
                break
            chunk = json.loads(sse.data)
            if chunk.get("usage"):
                usage_tokens = chunk["usage"].get("completion_tokens")
                prompt_tokens = chunk["usage"].get("prompt_tokens", prompt_tokens)
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                if delta.get("content") is not None or choice.get("finish_reason"):
                    last = time.perf_counter()  # any output, even a token whose text is empty
                    if first is None and delta.get("content"):
                        first = last
    tokens = usage_tokens or max_tokens
    # per-stream decode: the tokens after the first over the time from the first text to the
    # last output chunk (tokens from `usage`, so chunks of several tokens count right)
    decode = (tokens - 1) / (last - first) if first is not None and last is not None and last > first else float("nan")
    return {
        "ttft": first - t0 if first is not None else float("nan"),
        "decode": decode,
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
    }


async def level(url: str, model: str, streams: int, max_tokens: int, offset: int) -> dict[str, float]:
    requests = 2 * streams
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=streams + 4)) as c:
        sem = asyncio.Semaphore(streams)

        async def bounded(i: int) -> dict[str, float]:
            async with sem:
                return await one_stream(c, url, model, offset + i, max_tokens)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(bounded(i) for i in range(requests)))
        wall = time.perf_counter() - t0
    return {
        "ttft_p50_ms": 1000 * statistics.median(r["ttft"] for r in results),
        "per_stream_tok_s": statistics.median(r["decode"] for r in results),
        "aggregate_tok_s": sum(r["tokens"] for r in results) / wall,
        "prompt_tokens": statistics.median(r["prompt_tokens"] for r in results),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    side = p.add_mutually_exclusive_group(required=True)
    side.add_argument("--llama-server", metavar="PATH", help="llama.cpp's llama-server binary")
    side.add_argument("--llama-python", metavar="PY", help="a Python with llama-cpp-python[server] installed")
    p.add_argument("--gguf", type=Path, default=None, help="the GGUF both serve (default: the bundled model's)")
    p.add_argument("--levels", default="1,32", help="concurrent streams per level (default: 1,32)")
    p.add_argument("--rounds", type=int, default=2, help="rounds; the lead alternates (default: 2)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per request (default: 128)")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default: 2, the cores here)")
    p.add_argument(
        "--context",
        type=int,
        default=0,
        metavar="TOKENS",
        help="put ~TOKENS tokens of text before each request (decode at long context; default: 0)",
    )
    p.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default=None,
        help="one prompt of bench/serving/workloads.py for every request (repetitive work: quote, edit, code, json; "
        "default: a different story per request)",
    )
    p.add_argument("--sluice-arg", action="append", default=[], help="extra `sluice serve` argument (repeatable)")
    p.add_argument(
        "--sluice-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for `sluice serve` and its worker (repeatable), e.g. SLUICE_KERNEL_ISA=avx2 to "
        "run the AVX2 kernels on an AVX-512 machine",
    )
    return p.parse_args()


def compare(figures: dict[str, dict[int, list[dict[str, float]]]], levels: list[int], out: dict[str, Any]) -> None:
    """Per level and metric: each side's median over the rounds and their ratio, into `out`,
    printed as a table on the way, then each level's ratio per round."""
    print(f"{'level':>6} {'metric':>18} {'sluice':>9} {'llama.cpp':>10} {'ratio':>7}", file=sys.stderr)
    for lv in levels:
        for metric in ("ttft_p50_ms", "per_stream_tok_s", "aggregate_tok_s", "prompt_tokens"):
            a = statistics.median(x[metric] for x in figures["sluice"][lv])
            b = statistics.median(x[metric] for x in figures["llama.cpp"][lv])
            per_round = [x[metric] / y[metric] for x, y in zip(figures["sluice"][lv], figures["llama.cpp"][lv])]
            out[f"x{lv}_{metric}"] = {"sluice": a, "llama_cpp": b, "ratio": a / b, "ratio_per_round": per_round}
            print(f"{'x' + str(lv):>6} {metric:>18} {a:9.1f} {b:10.1f} {a / b:7.2f}", file=sys.stderr)
    # the rounds' spread: on a shared machine one round's ratio can sit far from the median's
    for lv in levels:
        rounds = out[f"x{lv}_aggregate_tok_s"]["ratio_per_round"]
        print(
            f"x{lv} aggregate ratio per round: {' '.join(f'{x:.2f}' for x in rounds)} "
            f"(median {statistics.median(rounds):.2f})",
            file=sys.stderr,
        )


def main() -> None:
    args = parse_args()
    CONTEXT["text"] = SENTENCE * round(args.context / 33)
    CONTEXT["workload"] = WORKLOADS[args.workload] if args.workload else ""
    from sluice.models.loader import default_model_path

    gguf = args.gguf or default_model_path()
    levels = [int(x) for x in args.levels.split(",")]
    sluice_args = [*args.sluice_arg] + (["--model", str(gguf)] if args.gguf else [])
    sluice_env = dict(kv.split("=", 1) for kv in args.sluice_env)
    sluice = start_server(sluice_args, env=sluice_env, timeout=600)
    llama = None
    try:
        llama = LlamaCpp(gguf, args.threads, args.llama_server, args.llama_python, max(levels))
        sides = {"sluice": (sluice.base_url, MODEL), "llama.cpp": (llama.url, gguf.stem)}
        for url, model in sides.values():  # warm-up: first-request costs on both
            asyncio.run(level(url, model, 1, 8, 10_000))
        figures: dict[str, dict[int, list[dict[str, float]]]] = {s: {lv: [] for lv in levels} for s in sides}
        for r in range(args.rounds):
            for lv in levels:
                order = list(sides) if (r + lv) % 2 == 0 else list(sides)[::-1]
                for name in order:
                    res = asyncio.run(level(*sides[name], lv, args.max_tokens, 100 * r))
                    figures[name][lv].append(res)
                    print(
                        f"round {r + 1} {name:9s} x{lv:<3d} TTFT {res['ttft_p50_ms']:7.1f} ms  per stream "
                        f"{res['per_stream_tok_s']:6.1f} tok/s  aggregate {res['aggregate_tok_s']:6.1f} tok/s  "
                        f"prompt {res['prompt_tokens']:.0f} tokens",
                        file=sys.stderr,
                        flush=True,
                    )
        out: dict[str, Any] = {
            "llama_cpp": llama.kind,
            "gguf": gguf.name,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "load": os.getloadavg(),
        }
        print(f"\nllama.cpp side: {llama.kind}", file=sys.stderr)
        compare(figures, levels, out)
        print(json.dumps(out))
    finally:
        if llama is not None:
            llama.stop()
        sluice.stop()


if __name__ == "__main__":
    main()
