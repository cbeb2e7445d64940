#!/usr/bin/env python3
"""Autoscaling timings with the bundled model: cold start, and warm promotion.

One fleet in this process (the real Fleet, admission queue, router, serving pipeline and
local autoscaler; `sluice worker` processes of the bundled model), one autoscaled version with
a warm pool of one.

- Cold start, per round: the autoscaler's start of one more worker — process spawned → model
  loaded and the gRPC server ready (`loaded`), → its one-token warm-up done and the worker in
  the warm pool (`warm`). The worker is stopped again after each round.
- Warm promotion, per round: two long requests are sent to the one serving worker; the
  dispatch that lifts the signal above scale_up_at is t0. The autoscaler's next tick promotes
  the standby worker (t1: `detect`, bounded by `[autoscaling] interval_s`), and a probe request
  (max_tokens 1) sent at that moment is served by the promoted worker: its first token is t2
  (`first_token` = t2 − t1; `total` = t2 − t0, the issue's "signal → first token served by the
  new worker"). `idle_probe_ttft`: the same probe on the idle fleet before the round, the floor
  `first_token` is compared with (the rest is the two load requests' CPU). Between rounds the
  load finishes and the promoted worker goes back to standby.

    PYTHONPATH=src .venv/bin/python bench/serving/autoscale_timing.py [--rounds 5] [--cold-rounds 3] [--interval 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")  # the fleet forks workers while gRPC runs

from sluice.config import load_settings
from sluice.gateway.principal import Principal
from sluice.routing.dispatch.worker_pool import Dispatch, WorkerStatus
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.serving.outcomes import TextDelta
from sluice.serving.output_budget import OutputBudget
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.serving.runtime import ServingRuntime

KEY = ("smollm2", "v1")


def fleet_text(interval: float, threads: int | None = None) -> str:
    threads_line = f"threads = {threads}\n" if threads is not None else ""
    # 64 blocks of 16 tokens: two requests of ~420 estimated tokens put the signal near 0.8.
    # The cool-downs are long: each round resets the policy itself
    return f"""
[routing]
load_slack_tokens = 0
[autoscaling]
interval_s = {interval}
up_cooldown_s = 3600
down_cooldown_s = 3600
max_workers = 3
[autoscaling.warm_pool]
windows = [{{ start = "00:00", size = 1 }}]
[models.smollm2.versions.v1]
weights = "bundled"
traffic = 100
replicas = 1
autoscale = true
[models.smollm2.versions.v1.engine]
block_size = 16
num_kv_blocks = 64
max_num_seqs = 8
{threads_line}"""


def request(text: str, max_tokens: int) -> ServingRequest:
    return ServingRequest(
        request_id=f"msg_{os.urandom(6).hex()}",
        route=Route.MESSAGES,
        principal=Principal(),
        model="smollm2",
        conversation=Conversation([Turn(Role.USER, [text])]),
        budget=OutputBudget(max_tokens),
    )


async def first_token(pipeline: ServingPipeline, req: ServingRequest) -> float:
    gen = await pipeline.start(req)
    try:
        async for outcome in gen.outcomes():
            if isinstance(outcome, TextDelta):
                return time.perf_counter()
        raise RuntimeError("the probe produced no text")
    finally:
        await gen.close()


async def to_the_end(pipeline: ServingPipeline, req: ServingRequest) -> None:
    """A load request: stream it whole, so its tokens count in the signal until it ends (closing
    it at its first token, as the probes do, would drop the signal before the autoscaler looked)."""
    gen = await pipeline.start(req)
    try:
        async for _ in gen.outcomes():
            pass
    finally:
        await gen.close()


UNTIL_LIMIT_S = 600.0  # generous: a bench waits for what happens within seconds, and stops if it never does


async def until(check, what: str, every: float = 0.005) -> None:
    deadline = time.monotonic() + UNTIL_LIMIT_S
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(every)


def ids(fleet: Fleet, status: WorkerStatus) -> list[str]:
    return [w.worker_id for w in fleet.pool.workers(*KEY) if w.status is status]


async def reset(fleet: Fleet) -> None:
    """After a round: its load finished, back to one serving + one standby worker, and a fresh
    policy (its up cool-down is long)."""
    await until(lambda: all(w.inflight == 0 for w in fleet.pool.workers(*KEY)), "the load to finish")
    for worker_id in ids(fleet, WorkerStatus.WARM)[1:]:
        fleet.pool.set_status(worker_id, WorkerStatus.STANDBY)
        fleet.handles[worker_id].join_status = WorkerStatus.STANDBY
    fleet.autoscaler.scalers.clear()
    await until(lambda: len(ids(fleet, WorkerStatus.WARM)) == 1 and len(fleet.pool.workers(*KEY)) >= 2, "the reset")
    for worker_id in ids(fleet, WorkerStatus.STANDBY)[1:]:  # the round's refill start
        fleet.replicas.retire(worker_id, "benchmark reset")
    await until(
        lambda: (
            len(fleet.pool.workers(*KEY)) == 2
            and not any(fleet.autoscaler.scalers.get(KEY) and fleet.autoscaler.scalers[KEY].starts for _ in [0])
        ),
        "the refill to stop",
        every=0.05,
    )


async def cold_start(fleet: Fleet) -> tuple[float, float]:
    """Start a worker from nothing: seconds until it loaded, and until it is a warm standby."""
    t0 = time.perf_counter()
    worker_id = await fleet.replicas.start_one(*KEY, join=WorkerStatus.STANDBY)
    loaded = time.perf_counter() - t0
    await until(
        lambda: (w := fleet.pool.get(worker_id)) is not None and w.status is WorkerStatus.STANDBY,
        "the cold worker to warm up",
    )
    warm = time.perf_counter() - t0
    await fleet.replicas.drop(fleet.handles[worker_id])
    return loaded, warm


def summary(xs: list[float]) -> dict:
    return (
        {
            "median_ms": round(1000 * statistics.median(xs), 1),
            "max_ms": round(1000 * max(xs), 1),
            "all_ms": [round(1000 * x, 1) for x in xs],
        }
        if xs
        else {}
    )


async def main(args: argparse.Namespace) -> dict:
    path = Path(tempfile.mkdtemp(prefix="sluice-bench-autoscale-")) / "fleet.toml"
    path.write_text(fleet_text(args.interval, args.threads))
    settings = load_settings(None, safety=False, fleet=str(path), health_check_interval_s=0.2, log_level="warning")
    fleet = Fleet.build(settings, Registry.from_file(path))
    crossings: list[float] = []
    begin = fleet.pool.begin

    def recording_begin(
        worker_id: str, cost_tokens: int, version_key: tuple[str, str] | None = None, adapter: str | None = None
    ) -> Dispatch | None:
        d = begin(worker_id, cost_tokens, version_key, adapter)
        if d is not None and rt.gateway is not None and rt.gateway.admission.scaling_signal() > 0.7 and not crossings:
            crossings.append(time.perf_counter())
        return d

    fleet.pool.begin = recording_begin  # type: ignore[method-assign]
    await fleet.start()
    rt = ServingRuntime(settings)
    rt.mark_ready(fleet, fleet.capacity()[0])
    pipeline = ServingPipeline(rt)
    cold_loaded, cold_warm, detect, ttft, total, baseline = [], [], [], [], [], []
    try:
        await until(lambda: len(ids(fleet, WorkerStatus.STANDBY)) == 1, "the warm pool")
        for _ in range(args.rounds):
            crossings.clear()
            promoted = asyncio.Event()
            stamp: list[float] = []

            def on_decision(_m, _v, d, stamp=stamp, promoted=promoted):
                if d.actions.promote and not stamp:
                    stamp.append(time.perf_counter())
                    promoted.set()

            fleet.autoscaler.on_decision.append(on_decision)
            sent = time.perf_counter()  # the same probe on the idle fleet: the TTFT floor
            baseline.append(await first_token(pipeline, request("Hi", 1)) - sent)
            load = [
                asyncio.create_task(to_the_end(pipeline, request(f"Write a long story about ship {i}.", 380)))
                for i in range(2)
            ]
            await asyncio.wait_for(promoted.wait(), 120)
            t2 = await first_token(pipeline, request("Hi", 1))
            fleet.autoscaler.on_decision.remove(on_decision)
            t0, t1 = crossings[0], stamp[0]
            detect.append(t1 - t0)
            ttft.append(t2 - t1)
            total.append(t2 - t0)
            await asyncio.gather(*load)
            await reset(fleet)
        fleet.autoscaler.on_decision.clear()
        for _ in range(args.cold_rounds):
            loaded_s, warm_s = await cold_start(fleet)
            cold_loaded.append(loaded_s)
            cold_warm.append(warm_s)
    finally:
        await fleet.close()
    return {
        "interval_s": args.interval,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "promotion": {
            "detect": summary(detect),
            "first_token": summary(ttft),
            "total": summary(total),
            "idle_probe_ttft": summary(baseline),
        },
        "cold_start": {"loaded": summary(cold_loaded), "warm": summary(cold_warm)},
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cold-rounds", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.1, help="[autoscaling] interval_s")
    p.add_argument("--threads", type=int, default=None, help="the version's engine threads (default: auto)")
    result = asyncio.run(main(p.parse_args()))
    json.dump(result, sys.stdout, indent=2)
    print()
