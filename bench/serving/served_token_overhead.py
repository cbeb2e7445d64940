#!/usr/bin/env python3
"""Where a served stream's time per token goes at 1 stream, layer by layer, side by side.

One greedy stream of --tokens output tokens (ignore_eos, speculation off so every step makes one
token) is measured at five layers, the layers alternating round by round so that a burst of
other work on the shared machine lands on all of them alike:

  forward   the model's forward pass alone (timed inside ModelRunner.execute, in this process)
  execute   + building the step's inputs and sampling (ModelRunner.execute)
  step      + scheduling, detokenizing, stop checks, events (LLMEngine.step)
  async     + the engine thread handing events to an asyncio consumer (AsyncEngine.generate)
  grpc      a `sluice worker` process, read straight over gRPC (GrpcEngineClient)
  http      that same worker behind `sluice serve --worker ADDR`, OpenAI chat streaming over SSE

Per layer: the median time per token (wall; for the in-process layers also this process's CPU
time) and, for the two served layers, the CPU each process spent per output token (psutil: the
worker's, the gateway's, and this client's). Differences between consecutive layers are what
each layer adds. Ends with one JSON line.

    PYTHONPATH=src .venv/bin/python bench/serving/served_token_overhead.py [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from httpx_sse import aconnect_sse

from sluice.openmp_wait import sleep_when_idle

sleep_when_idle()  # the in-process layers run torch's OpenMP as the worker does (sluice/openmp_wait.py)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.server_process import MODEL, free_port, start_server, start_worker

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
LAYERS = ("forward", "execute", "step", "async", "grpc", "http")


def cpu_of(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def thread_cpu(proc: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def split_worker(before: dict[int, float], after: dict[int, float]) -> tuple[float, float]:
    """(the busiest thread's CPU: the engine's, every other thread's) between two snapshots."""
    deltas = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
    return (deltas[0], sum(deltas[1:])) if deltas else (0.0, 0.0)


class InProcess:
    """The bundled model loaded here behind an AsyncEngine, as a worker runs it: the model is
    loaded and stepped on the engine's thread (one OpenMP pool). The forward, execute and step
    layers are timed by wrappers on that thread; the async layer is what the consumer sees."""

    def __init__(self, threads: int) -> None:
        from sluice.engine.async_engine import AsyncEngine
        from sluice.models.loader import load_model

        self.times: dict[str, list[float]] = {"forward": [], "execute": [], "step": [], "step_cpu": []}
        self.prompt_ids: list[int] = []
        self.n = 0

        def factory():
            import torch

            from sluice.engine.config import EngineConfig
            from sluice.engine.engine import LLMEngine

            if threads:
                torch.set_num_threads(threads)
            loaded = load_model(progress=False)
            self.prompt_ids = loaded.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
            engine = LLMEngine(loaded, EngineConfig(speculative_tokens=0, threads=threads))
            runner = engine.runner
            runner.model.forward = self._timed(runner.model.forward, "forward")
            runner.execute = self._timed(runner.execute, "execute")
            engine.step = self._timed(engine.step, "step", cpu=True)
            return engine

        self.engine = AsyncEngine(factory=factory).start()
        asyncio.run(self.engine.wait_loaded())

    def _timed(self, fn, name: str, cpu: bool = False):
        def wrapper(*a, **k):
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.times[name].append(time.perf_counter() - t0)
                if cpu:
                    self.times["step_cpu"].append(time.thread_time() - c0)

        return wrapper

    def round(self, tokens: int) -> dict[str, list[float]]:
        """One stream: per decode step (the prefill step and the last dropped) the forward,
        execute and step times, and the consumer's inter-token intervals."""
        from sluice.types import GenerationRequest, SamplingParams

        for v in self.times.values():
            v.clear()
        self.n += 1
        req = GenerationRequest(
            f"b{self.n}", list(self.prompt_ids), SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        )
        stamps: list[float] = []

        async def consume() -> None:
            async for ev in self.engine.generate(req):
                stamps.extend([time.perf_counter()] * len(ev.token_ids))

        asyncio.run(consume())
        out = {k: v[1:] for k, v in self.times.items()}
        out["async"] = gaps(stamps)
        return out

    def close(self) -> None:
        self.engine.shutdown()


def gaps(stamps: list[float]) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:])]


async def grpc_round(address: str, prompt_ids: list[int], tokens: int, n: int) -> list[float]:
    from sluice.types import GenerationRequest, SamplingParams
    from sluice.worker.grpc_client import GrpcEngineClient

    client = GrpcEngineClient(address)
    stamps: list[float] = []
    try:
        req = GenerationRequest(
            f"g{n}", list(prompt_ids), SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        )
        async for ev in client.generate(req):
            if ev.token_ids:
                stamps.extend([time.perf_counter()] * len(ev.token_ids))
    finally:
        await client.close()
    return gaps(stamps)


async def http_round(base_url: str, tokens: int) -> list[float]:
    body = {
        "model": MODEL,
        "max_tokens": tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    stamps: list[float] = []
    async with httpx.AsyncClient(timeout=300) as c:
        async with aconnect_sse(c, "POST", base_url + "/v1/chat/completions", json=body) as es:
            async for sse in es.aiter_sse():
                if sse.data != "[DONE]" and '"content":"' in sse.data:
                    stamps.append(time.perf_counter())
    return gaps(stamps)


def ms(values: list[float]) -> float:
    return 1000 * statistics.median(values) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64, help="output tokens per stream (default: 64)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each measures every layer once (default: 3)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in this process (default: torch's)")
    p.add_argument("--idle-s", type=float, default=5.0, help="idle window measuring background CPU (default: 5)")
    args = p.parse_args()

    address = f"127.0.0.1:{free_port()}"
    worker = start_worker(address, ["--speculative-tokens", "0"])
    gateway = local = None
    try:
        gateway = start_server(["--worker", address])
        wproc, gproc, me = psutil.Process(worker.process.pid), psutil.Process(gateway.process.pid), psutil.Process()
        local = InProcess(args.threads)
        samples: dict[str, list[float]] = {k: [] for k in (*LAYERS, "step_cpu")}
        cpu: dict[str, dict[str, float]] = {
            "grpc": {"worker": 0.0, "worker_engine_thread": 0.0, "worker_other_threads": 0.0, "client": 0.0},
            "http": {
                "worker": 0.0,
                "worker_engine_thread": 0.0,
                "worker_other_threads": 0.0,
                "gateway": 0.0,
                "client": 0.0,
            },
        }
        tokens_out = {"grpc": 0, "http": 0}
        # warm-up: one short stream per layer (first-call costs: prefix cache, JIT, connections)
        local.round(8)
        asyncio.run(grpc_round(address, local.prompt_ids, 8, 0))
        asyncio.run(http_round(gateway.base_url, 8))
        # background CPU (health polls, fleet ticks, metrics) per second while idle: subtracted
        # from the served layers' figures, which would otherwise grow as tokens come slower
        w0, g0, t0 = cpu_of(wproc), cpu_of(gproc), time.perf_counter()
        time.sleep(args.idle_s)
        idle_s = time.perf_counter() - t0
        idle = {"worker": (cpu_of(wproc) - w0) / idle_s, "gateway": (cpu_of(gproc) - g0) / idle_s}
        walls = {"grpc": 0.0, "http": 0.0}
        order = ["local", "grpc", "http"]
        for r in range(args.rounds):
            for layer in order if r % 2 == 0 else order[::-1]:
                if layer == "local":
                    for k, v in local.round(args.tokens).items():
                        samples[k] += v
                else:
                    w0, g0, c0, threads0 = cpu_of(wproc), cpu_of(gproc), cpu_of(me), thread_cpu(wproc)
                    began = time.perf_counter()
                    if layer == "grpc":
                        got = asyncio.run(grpc_round(address, local.prompt_ids, args.tokens, r + 1))
                    else:
                        got = asyncio.run(http_round(gateway.base_url, args.tokens))
                    samples[layer] += got
                    walls[layer] += time.perf_counter() - began
                    cpu[layer]["worker"] += cpu_of(wproc) - w0
                    engine_s, other_s = split_worker(threads0, thread_cpu(wproc))
                    cpu[layer]["worker_engine_thread"] += engine_s
                    cpu[layer]["worker_other_threads"] += other_s
                    cpu[layer]["client"] += cpu_of(me) - c0
                    if layer == "http":
                        cpu[layer]["gateway"] += cpu_of(gproc) - g0
                    tokens_out[layer] += args.tokens
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        if local is not None:
            local.close()
        if gateway is not None:
            gateway.stop()
        worker.stop()
    print(json.dumps(report(args, samples, cpu, idle, walls, tokens_out)))


def report(
    args: argparse.Namespace,
    samples: dict[str, list[float]],
    cpu: dict[str, dict[str, float]],
    idle: dict[str, float],
    walls: dict[str, float],
    tokens_out: dict[str, int],
) -> dict[str, Any]:
    """Per layer its ms per token and what it adds; per served layer the CPU per token of each
    process, less its idle background; printed as a table on the way."""
    res: dict[str, Any] = {"tokens": args.tokens, "rounds": args.rounds, "load": os.getloadavg()}
    prev = 0.0
    print(f"{'layer':8s} {'ms/token':>9s} {'adds':>7s}", file=sys.stderr)
    for layer in LAYERS:
        per_token = ms(samples[layer])
        res[f"{layer}_ms"] = per_token
        res[f"{layer}_adds_ms"] = per_token - prev if layer != "forward" else per_token
        print(f"{layer:8s} {per_token:9.2f} {res[f'{layer}_adds_ms']:7.2f}", file=sys.stderr)
        prev = per_token
    res["step_cpu_ms"] = ms(samples["step_cpu"])
    res["idle_cpu_share"] = idle
    for layer, per in cpu.items():
        for who, total in per.items():
            background = idle.get(who, idle["worker"] if who == "worker_other_threads" else 0.0) * walls[layer]
            if who in ("worker", "gateway", "worker_other_threads"):
                total = max(0.0, total - background)
            res[f"{layer}_{who}_cpu_ms_per_token"] = 1000 * total / max(1, tokens_out[layer])
    print(f"engine step CPU (thread) {res['step_cpu_ms']:.2f} ms/token", file=sys.stderr)
    for layer in cpu:
        print(
            f"{layer}: CPU per token "
            + ", ".join(f"{who} {res[f'{layer}_{who}_cpu_ms_per_token']:.2f} ms" for who in cpu[layer]),
            file=sys.stderr,
        )
    print(f"load average {res['load']}", file=sys.stderr)
    return res


if __name__ == "__main__":
    main()
