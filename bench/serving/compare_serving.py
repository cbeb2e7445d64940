#!/usr/bin/env python3
"""Serving before vs after a change, side by side in one run: two `sluice serve` processes —
one from another checkout of the repository (`--before DIR`, e.g. a `git worktree` of the
commit to compare against), one from this one — under the same load, level by level,
alternating which goes first in each round, so machine noise hits both alike.

Per level (closed loop: 1, 8 and 32 concurrent streams, greedy, fixed prompts): TTFT p50,
inter-token p50, output tok/s, and the CPU time per output token of the gateway process and of
its worker (psutil; what each side costs regardless of how busy the machine is); the ratios
after / before are the figures to quote. Both servers run with safety on (the default); a
second run with `--env-before SLUICE_SAFETY=false --env-after SLUICE_SAFETY=false` gives the
pair without it, so the safety overhead before and after is the ratio of the two runs.

    git worktree add /tmp/sluice-before b6b409b
    .venv/bin/python bench/serving/compare_serving.py --before /tmp/sluice-before --env-after SLUICE_KERNELS=torch

Ends with one JSON line of every figure.
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

import httpx
import psutil
from httpx_sse import aconnect_sse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import PROMPT_TOPICS
from tests.server_process import MODEL, free_port

TOPICS = PROMPT_TOPICS


class Server:
    def __init__(self, name: str, src: Path, env: dict[str, str]):
        self.name, self.port = name, free_port()
        self.log = Path(tempfile.mkdtemp(prefix=f"cmp-{name}-")) / "out.log"
        full = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        full.update(env)
        full["PYTHONPATH"] = str(src / "src")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "serve", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full,
                cwd=src,
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready")

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far (user + system) of the gateway process and of its workers: what a
        request costs each side, independent of how long other processes held the cores."""
        gateway = psutil.Process(self.proc.pid)
        t = gateway.cpu_times()
        workers = 0.0
        for child in gateway.children(recursive=True):
            try:
                c = child.cpu_times()
                workers += c.user + c.system
            except psutil.NoSuchProcess:
                pass
        return t.user + t.system, workers

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def one_stream(client: httpx.AsyncClient, url: str, i: int, max_tokens: int) -> tuple[float, list[float], int]:
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} ({i})."}],
    }
    t0 = time.perf_counter()
    ttft, tokens = float("nan"), 0
    stamps: list[float] = []
    async with aconnect_sse(client, "POST", url + "/v1/messages", json=body) as es:
        async for sse in es.aiter_sse():
            if sse.event == "content_block_delta":
                now = time.perf_counter()
                if not stamps:
                    ttft = now - t0
                stamps.append(now)
            elif sse.event == "message_delta":
                tokens = json.loads(sse.data)["usage"]["output_tokens"]
    itl = [(b - a) for a, b in zip(stamps, stamps[1:])]
    return ttft, itl, tokens


async def level(url: str, streams: int, requests: int, max_tokens: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=streams + 4)) as client:
        sem = asyncio.Semaphore(streams)

        async def bounded(i: int):
            async with sem:
                return await one_stream(client, url, i, max_tokens)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(bounded(i) for i in range(requests)))
        wall = time.perf_counter() - t0
    ttfts = [r[0] for r in results]
    itls = [x for r in results for x in r[1]]
    return {
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "itl_p50_ms": 1000 * statistics.median(itls) if itls else float("nan"),
        "tok_s": sum(r[2] for r in results) / wall,
        "tokens": sum(r[2] for r in results),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="a checkout of the commit to compare against")
    p.add_argument("--env-after", action="append", default=[], metavar="K=V", help="extra env for the after server")
    p.add_argument("--env-before", action="append", default=[], metavar="K=V", help="extra env for the before server")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--levels", default="1,8,32")
    args = p.parse_args()

    def env(pairs: list[str]) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in pairs)

    servers = {
        "before": Server("before", args.before.resolve(), env(args.env_before)),
        "after": Server("after", ROOT, env(args.env_after)),
    }
    try:
        for s in servers.values():
            s.wait_ready()
        levels = [int(x) for x in args.levels.split(",")]
        figures: dict[str, dict[int, list[dict[str, float]]]] = {n: {lv: [] for lv in levels} for n in servers}
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for lv in levels:
                for name in order:
                    g0, w0 = servers[name].cpu_s()
                    res = asyncio.run(level(servers[name].url, lv, max(lv * 2, 6), args.max_tokens))
                    g1, w1 = servers[name].cpu_s()
                    res["gateway_cpu_ms_per_token"] = 1000 * (g1 - g0) / max(1, res["tokens"])
                    res["worker_cpu_ms_per_token"] = 1000 * (w1 - w0) / max(1, res["tokens"])
                    figures[name][lv].append(res)
                    print(
                        f"round {r + 1} {name:6s} x{lv:<3d} ttft {res['ttft_p50_ms']:7.1f} ms  "
                        f"itl {res['itl_p50_ms']:6.1f} ms  "
                        f"{res['tok_s']:6.1f} tok/s  cpu/token gateway {res['gateway_cpu_ms_per_token']:5.2f} "
                        f"worker {res['worker_cpu_ms_per_token']:5.2f} ms",
                        file=sys.stderr,
                    )
        out: dict[str, object] = {}
        print(f"\n{'level':>6} {'metric':>24} {'before':>9} {'after':>9} {'after/before':>13}", file=sys.stderr)
        for lv in levels:
            for metric in ("ttft_p50_ms", "itl_p50_ms", "tok_s", "gateway_cpu_ms_per_token", "worker_cpu_ms_per_token"):
                b = statistics.median(x[metric] for x in figures["before"][lv])
                a = statistics.median(x[metric] for x in figures["after"][lv])
                out[f"x{lv}_{metric}"] = {"before": b, "after": a, "ratio": a / b if b else float("nan")}
                print(f"{'x' + str(lv):>6} {metric:>24} {b:9.2f} {a:9.2f} {a / b:13.3f}", file=sys.stderr)
        print(json.dumps(out))
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    main()
