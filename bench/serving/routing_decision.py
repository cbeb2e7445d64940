#!/usr/bin/env python3
"""Cost of one routing decision in process (the library part of the router's overhead).

The fleet: one model, two versions (90/10), two warm workers each; prompts of --prompt-tokens
(default 320) whose first 300 tokens are one of 8 tenants' shared system prompt. Per request:

  version    choose_version (weighted rendezvous over the versions)
  affinity   affinity_key (sha256 chain over the leading 4 KV blocks, tenant-salted)
  pick       WorkerPicker.pick over the version's workers
  route      FleetRouter plan + dispatch, then finish_dispatch + settle, no quota store
             (the three above + pool accounting)
  route+mem  the same with a memory quota store (a quota on the tier)
  route+redis  the same with the Redis quota store (a real redis-server started here, two
             Lua round trips per request: acquire + settle)

Variants are interleaved: every round runs --n calls of each, in rotating order, so machine
noise lands on all of them; p50/p99 are over every call of all rounds. "CPU share" is process
CPU time over wall time during that variant (< 1.0: other work took the core, or the variant
waited on Redis). Ends with one JSON line of the figures.

    .venv/bin/python bench/serving/routing_decision.py [--n 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import pct
from sluice.routing.dispatch.circuit_breaker import Outcome
from sluice.routing.dispatch.router import FleetRouter
from sluice.routing.dispatch.version_router import choose_version, sticky_key
from sluice.routing.dispatch.worker_picker import WorkerPicker, affinity_key
from sluice.routing.dispatch.worker_pool import WorkerPool, WorkerStatus
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.quota.memory_store import MemoryQuotaStore
from sluice.routing.quota.redis_store import RedisQuotaStore
from tests.redis_server import RedisServer
from tests.routing_calls import RouteRequest, finish, route

FLEET = """\
[models.m.tiers."*"]
quota = { tokens = 1000000000000, period = "month", mode = "soft" }
[models.m.versions.stable]
weights = "bundled"
traffic = 90
workers = ["h:1", "h:2"]
[models.m.versions.canary]
weights = "bundled"
traffic = 10
workers = ["h:3", "h:4"]
"""


def requests(n: int, prompt_tokens: int, seed: int) -> list[RouteRequest]:
    rng = random.Random(seed)
    systems = [[rng.randrange(50_000) for _ in range(300)] for _ in range(8)]
    out = []
    for i in range(n):
        t = i % 8
        prompt = systems[t] + [rng.randrange(50_000) for _ in range(prompt_tokens - 300)]
        out.append(
            RouteRequest(
                "m",
                f"tenant{t}",
                "standard",
                sticky_key(f"tenant{t}", user_id=f"u{i}") or "",
                prompt,
                prompt_tokens + 256,
            )
        )
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="calls per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=320)
    args = ap.parse_args()

    redis = RedisServer()
    registry = Registry(parse_fleet(FLEET))
    pool = WorkerPool()
    for name, version in registry.fleet.models["m"].versions.items():
        for addr in version.workers:
            pool.add(addr, "m", name, addr, status=WorkerStatus.WARM)
    routers = {
        "route": FleetRouter(registry, pool, None),
        "route+mem": FleetRouter(registry, pool, MemoryQuotaStore()),
        "route+redis": FleetRouter(registry, pool, RedisQuotaStore(redis.url, prefix="bench")),
    }
    picker = WorkerPicker()
    weights = {"stable": 90.0, "canary": 10.0}
    cands = pool.candidates("m", "stable")

    async def run(variant: str, reqs: list[RouteRequest]) -> list[float]:
        times = []
        for r in reqs:
            t0 = time.perf_counter()
            if variant == "version":
                choose_version("m", weights, r.key)
            elif variant == "affinity":
                affinity_key(r.prompt_token_ids, 8, 4, r.tenant)
            elif variant == "pick":
                picker.pick(cands, affinity_key(r.prompt_token_ids, 8, 4, r.tenant))
            else:
                router = routers[variant]
                d = await route(router, r)
                await finish(router, d, Outcome.SUCCESS, r.cost_tokens // 2)
            times.append(time.perf_counter() - t0)
        return times

    variants = ["version", "affinity", "pick", "route", "route+mem", "route+redis"]
    samples: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, float] = {v: 0.0 for v in variants}
    wall: dict[str, float] = {v: 0.0 for v in variants}
    try:
        for rnd in range(args.rounds):
            reqs = requests(args.n, args.prompt_tokens, rnd)
            order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
            for v in order:
                c0, w0 = time.process_time(), time.perf_counter()
                samples[v] += await run(v, reqs)
                cpu[v] += time.process_time() - c0
                wall[v] += time.perf_counter() - w0
    finally:
        quota = routers["route+redis"].quota
        if quota is not None:
            await quota.close()
        redis.stop()

    result: dict[str, Any] = {}
    print(f"{'variant':<12} {'p50 µs':>8} {'p99 µs':>8} {'CPU share':>9}", file=sys.stderr)
    for v in variants:
        p50, p99 = pct(samples[v], 0.5) * 1e6, pct(samples[v], 0.99) * 1e6
        share = cpu[v] / wall[v] if wall[v] else 0.0
        result[v] = {"p50_us": round(p50, 1), "p99_us": round(p99, 1), "cpu_share": round(share, 2)}
        print(f"{v:<12} {p50:8.1f} {p99:8.1f} {share:9.2f}", file=sys.stderr)
    result["route_p50_over_goal_1ms"] = round(result["route"]["p50_us"] / 1000, 3)
    print(json.dumps({"n": args.n, "rounds": args.rounds, "prompt_tokens": args.prompt_tokens, **result}))


if __name__ == "__main__":
    asyncio.run(main())
