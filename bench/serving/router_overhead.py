#!/usr/bin/env python3
"""Router overhead: added time to first token through the fleet router with two workers, against
`sluice serve --worker ADDR` on one worker, side by side in one run.

Two `sluice worker`s (the bundled model) on 127.0.0.1; gateway R = `sluice serve --fleet` with
both as one version's workers (the router plans, picks a worker by prefix affinity under the
load bound, counts load, holds breakers); gateway D = `sluice serve --worker W1` (the fleet of
one: the same pipeline with a single worker, so the difference is what routing over a pool
adds). A third variant sends the same prompt straight to W1 over gRPC (no HTTP, no gateway), to
show the whole gateway's share. One streamed request at a time, variants interleaved request by
request in rotating order; prompts differ per variant and request (no prefix or response cache
shared between variants). TTFT = first content delta at the client.

    .venv/bin/python bench/serving/router_overhead.py [--n 200] [--max-tokens 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import pct
from bench.serving.fleet_common import ADMIN, MODEL, cpu_seconds, load_average, stream, wait_warm
from tests.server_process import free_port, start_server, start_worker

WORKER_ARGS = ["--kv-cache-gib", "0.25", "--max-num-seqs", "8"]


def prompt(variant: str, i: int) -> str:
    return f"{variant} request {i}: name one colour of the sea."


async def grpc_ttft(client, tokenizer, text: str, max_tokens: int) -> float:
    from sluice.serving.prompt import Conversation, Role, Turn, build_prompt
    from sluice.types import GenerationRequest, SamplingParams

    ids = build_prompt(Conversation([Turn(Role.USER, [text])]), tokenizer).token_ids
    req = GenerationRequest(f"bench-{time.monotonic_ns()}", ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    t0 = time.perf_counter()
    first = None
    async with aclosing(client.generate(req)) as events:
        async for event in events:
            if event.token_ids and first is None:
                first = time.perf_counter()
            if event.finished:
                break
    assert first is not None
    return first - t0


async def measure(urls: dict[str, str], w1: str, n: int, max_tokens: int, pids: dict[str, int]) -> dict:
    from sluice.models.tokenizer_loader import load_tokenizer
    from sluice.worker.grpc_client import GrpcEngineClient

    tokenizer = load_tokenizer(None)[0]
    grpc = GrpcEngineClient(w1)
    variants = [*urls, "grpc_direct"]
    ttft: dict[str, list[float]] = {v: [] for v in variants}
    cpu0 = {v: cpu_seconds(pid) for v, pid in pids.items()}
    load0 = load_average()
    async with httpx.AsyncClient(timeout=300) as client:
        for warm in range(5):  # connections, caches of the chat template's shared prefix
            for v, url in urls.items():
                await stream(client, url, body(prompt(f"warm-{v}", warm), max_tokens))
            await grpc_ttft(grpc, tokenizer, prompt("warm-grpc", warm), max_tokens)
        for i in range(n):
            order = variants[i % len(variants) :] + variants[: i % len(variants)]
            for v in order:
                if v == "grpc_direct":
                    ttft[v].append(await grpc_ttft(grpc, tokenizer, prompt(v, i), max_tokens))
                else:
                    r = await stream(client, urls[v], body(prompt(v, i), max_tokens))
                    assert r.ok, r.events
                    ttft[v].append(r.ttft)
    await grpc.close()
    out: dict[str, Any] = {
        v: {"ttft_p50_ms": 1000 * pct(t, 0.5), "ttft_p99_ms": 1000 * pct(t, 0.99)} for v, t in ttft.items()
    }
    for v, pid in pids.items():
        out[v]["gateway_cpu_ms_per_request"] = 1000 * (cpu_seconds(pid) - cpu0[v]) / n
    routed, direct = out["router_2_workers"], out["direct_1_worker"]
    out["added_by_router_p50_ms"] = routed["ttft_p50_ms"] - direct["ttft_p50_ms"]
    out["added_by_router_p99_ms"] = routed["ttft_p99_ms"] - direct["ttft_p99_ms"]
    out["ratio_p50"] = routed["ttft_p50_ms"] / direct["ttft_p50_ms"]
    out["load_average"] = [round(load0, 1), round(load_average(), 1)]
    return out


def body(text: str, max_tokens: int) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": [{"role": "user", "content": text}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="requests per variant (default 200)")
    ap.add_argument("--max-tokens", type=int, default=4)
    args = ap.parse_args()
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    procs = []
    try:
        procs += [start_worker(a, WORKER_ARGS) for a in addrs]
        path = Path(tempfile.mkdtemp(prefix="sluice-bench-")) / "fleet.toml"
        path.write_text(
            f'[models."{MODEL}".versions.v1]\nweights = "bundled"\ntraffic = 100\n'
            f'workers = ["{addrs[0]}", "{addrs[1]}"]\n'
        )
        routed = start_server(["--fleet", str(path)], env={"SLUICE_ADMIN_KEY": ADMIN})
        direct = start_server(["--worker", addrs[0]], env={"SLUICE_ADMIN_KEY": ADMIN})
        procs += [routed, direct]
        wait_warm(routed.base_url, 2)
        wait_warm(direct.base_url, 1)
        urls = {"router_2_workers": routed.base_url, "direct_1_worker": direct.base_url}
        pids = {"router_2_workers": routed.process.pid, "direct_1_worker": direct.process.pid}
        result = asyncio.run(measure(urls, addrs[0], args.n, args.max_tokens, pids))
        print(json.dumps(result))
    finally:
        for p in procs:
            p.stop()


if __name__ == "__main__":
    main()
