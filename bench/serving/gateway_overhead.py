#!/usr/bin/env python3
"""Gateway overhead and coalescing benefit, side by side in one run.

1. Per-request gateway cost in-process (key-store authentication + rate limits + admission
   queue + settle), with the memory store and with a real Redis (started here), against the
   bare path (no gateway): p50 / p99 added microseconds over --n requests.
2. End to end over HTTP: the same short request (max_tokens 1) against two `sluice serve`
   processes sharing one worker — open access without limits vs keys + limits — alternated;
   added p50 / p99 latency.
3. Coalescing: 32 concurrent requests of which half duplicate the other half (temperature 0),
   coalescing on vs off: wall time and output tokens/s.
Ends by printing one JSON line of its figures.

    .venv/bin/python bench/serving/gateway_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import pct
from sluice.gateway.admission import AdmissionQueue
from sluice.gateway.authenticator import KeyStoreAuthenticator
from sluice.gateway.gateway import Gateway
from sluice.gateway.key_store import SQLiteKeyStore
from sluice.gateway.limiter import make_limiter
from sluice.gateway.limits import Limits
from sluice.types import GenerationEvent, GenerationRequest, SamplingParams
from tests.redis_server import RedisServer
from tests.server_process import MODEL, start_server, start_worker

REQUEST = GenerationRequest("bench", [0] * 100, SamplingParams(max_tokens=100))  # 100 tokens in, 100 reserved out


async def _one_event():
    yield GenerationEvent("x", finished=True)


async def micro(n: int, redis_url: str) -> dict:
    store = SQLiteKeyStore(Path(tempfile.mkdtemp()) / "keys.db")
    key, _ = store.create("acme", "standard", Limits(rpm=10**9, itpm=10**12, otpm=10**12, max_concurrent=10**6))
    auth = KeyStoreAuthenticator(store)
    out = {}
    for name in ("bare", "memory", "redis"):
        gw = None
        if name != "bare":
            gw = Gateway(AdmissionQueue(max_inflight=1000), make_limiter(name, redis_url))
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            if gw is not None:
                principal = await auth.authenticate(key)
                assert principal is not None  # the key was just created
                session = await gw.open(principal, REQUEST, _one_event)
                async for _ in session.events():
                    pass
                await session.close()
            else:
                async for _ in _one_event():
                    pass
            samples.append(time.perf_counter() - t0)
        if gw is not None and gw.limiter is not None:
            await gw.limiter.close()
        out[name] = {"p50_us": 1e6 * pct(samples, 0.5), "p99_us": 1e6 * pct(samples, 0.99)}
    for name in ("memory", "redis"):
        out[name]["added_p50_ms"] = (out[name]["p50_us"] - out["bare"]["p50_us"]) / 1000
        out[name]["added_p99_ms"] = (out[name]["p99_us"] - out["bare"]["p99_us"]) / 1000
    return out


async def e2e(bare_url: str, gw_url: str, key: str, n: int) -> dict:
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.5}
    lat: dict[str, list[float]] = {"bare": [], "gateway": []}
    async with httpx.AsyncClient(timeout=60) as c:
        for _ in range(n):
            for name, url, headers in (("bare", bare_url, {}), ("gateway", gw_url, {"x-api-key": key})):
                t0 = time.perf_counter()
                r = await c.post(url + "/v1/messages", json=body, headers=headers)
                assert r.status_code == 200, r.text
                lat[name].append(time.perf_counter() - t0)
    res: dict[str, Any] = {k: {"p50_ms": 1000 * pct(v, 0.5), "p99_ms": 1000 * pct(v, 0.99)} for k, v in lat.items()}
    res["added_p50_ms"] = res["gateway"]["p50_ms"] - res["bare"]["p50_ms"]
    res["added_p99_ms"] = res["gateway"]["p99_ms"] - res["bare"]["p99_ms"]
    return res


async def coalescing(on_url: str, off_url: str, rounds: int) -> dict:
    def body(i: int) -> dict:
        return {
            "model": MODEL,
            "max_tokens": 32,
            "temperature": 0,
            "messages": [{"role": "user", "content": f"Write a sentence about topic number {i % 16}."}],
        }

    async def wave(url: str) -> tuple[float, int]:
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as c:
            t0 = time.perf_counter()
            rs = await asyncio.gather(*(c.post(url + "/v1/messages", json=body(i)) for i in range(32)))
            wall = time.perf_counter() - t0
        return wall, sum(r.json()["usage"]["output_tokens"] for r in rs)

    res: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(rounds):
        for name, url in (("on", on_url), ("off", off_url)):
            wall, tokens = await wave(url)
            res[name].append(tokens / wall)
    on, off = statistics.median(res["on"]), statistics.median(res["off"])
    return {"on_tok_s": on, "off_tok_s": off, "speedup": on / off}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000, help="in-process requests per variant (default: 2000)")
    p.add_argument("--http-n", type=int, default=100, help="HTTP requests per server (default: 100)")
    p.add_argument("--rounds", type=int, default=3, help="coalescing rounds (default: 3)")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.n, args.http_n, args.rounds = 300, 20, 1
    redis = RedisServer()
    procs = []
    try:
        micro_res = asyncio.run(micro(args.n, redis.url))
        print(f"in-process: {micro_res}", file=sys.stderr)
        address = f"unix:{Path(tempfile.mkdtemp(prefix='sluice-bench-')) / 'w.sock'}"
        procs.append(start_worker(address))
        data = Path(tempfile.mkdtemp())
        store = SQLiteKeyStore(data / "keys.db")
        key, _ = store.create("bench", "standard", Limits(rpm=10**6, itpm=10**9, otpm=10**9, max_concurrent=10**4))
        empty = Path(tempfile.mkdtemp())
        bare = start_server(["--worker", address], env={"SLUICE_DATA_DIR": str(empty)})
        procs.append(bare)
        gated = start_server(
            ["--worker", address],
            env={"SLUICE_DATA_DIR": str(data), "SLUICE_LIMITS_STORE": "redis", "SLUICE_REDIS_URL": redis.url},
        )
        procs.append(gated)
        off = start_server(
            ["--worker", address], env={"SLUICE_DATA_DIR": str(empty), "SLUICE_ENABLE_COALESCING": "false"}
        )
        procs.append(off)
        e2e_res = asyncio.run(e2e(bare.base_url, gated.base_url, key, args.http_n))
        print(f"http: {e2e_res}", file=sys.stderr)
        co = asyncio.run(coalescing(bare.base_url, off.base_url, args.rounds))
        print(f"coalescing: {co}", file=sys.stderr)
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis.stop()
    targets = {
        "memory_added_p50_under_2ms": micro_res["memory"]["added_p50_ms"] < 2,
        "memory_added_p99_under_10ms": micro_res["memory"]["added_p99_ms"] < 10,
        "redis_added_p50_under_2ms": micro_res["redis"]["added_p50_ms"] < 2,
        "redis_added_p99_under_10ms": micro_res["redis"]["added_p99_ms"] < 10,
    }
    for k, ok in targets.items():
        print(f"  {'met    ' if ok else 'NOT met'}  {k}", file=sys.stderr)
    print(json.dumps({"in_process": micro_res, "http": e2e_res, "coalescing": co, "targets": targets}))


if __name__ == "__main__":
    main()
