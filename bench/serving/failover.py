#!/usr/bin/env python3
"""Failover under load: kill -9 a worker while streams run on it, and measure what the streams
that migrated to the other worker paid.

One `sluice serve` with a fleet of two local replicas of the bundled model. Each round starts
--streams concurrent greedy streams (distinct prompts, max_tokens --max-tokens); once every
stream has sent --kill-after deltas, the worker with the most requests in flight is killed
(SIGKILL). The gateway's log names every migrated request (`request msg_…: worker … lost after
N output tokens …; migrating`). For each migrated stream the extra latency is its largest gap
between two deltas minus the median delta gap of the streams that did not migrate in the same
round (the continuation re-prefills prompt + tokens so far on the other worker, next to that
worker's own streams). Lost = a stream that did not end with message_stop or carried an error.
Between rounds the supervisor restarts the killed worker and the script waits until both are
warm again.

    .venv/bin/python bench/serving/failover.py [--rounds 5] [--streams 6] [--max-tokens 48]

`--restart` measures instead how soon a stream continues on its worker restarted at the same
address: a fleet of ONE local replica (`migration_wait_s = 60`), one greedy stream, kill -9 of
the worker after --kill-after s; its supervisor restarts it and the health poller warms it. For
each round: the restart time (kill → the new process warm in /admin/fleet, polled every 20 ms),
the resumption delay (warm → the stream's next delta; negative by up to one status poll when
the stream was faster than the poll) and, to compare it with, the stream's own TTFT (a
continuation re-prefills the prompt and the tokens sent so far on the new process). Before the
fix the stream waited for half of `migration_wait_s` after the loss (30 s here) whenever the
restart was quicker than that.

    .venv/bin/python bench/serving/failover.py --restart [--rounds 3] [--max-tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import pct
from bench.serving.fleet_common import ADMIN, MODEL, fleet_status, load_average, stream, wait_warm
from tests.server_process import start_server

TOPICS = [
    "a lighthouse",
    "the tide",
    "a fishing boat",
    "gulls",
    "a storm",
    "the harbour",
    "a map",
    "sand",
    "a lantern",
    "the reef",
    "whales",
    "a sailor",
]
MIGRATED = re.compile(r"request (msg_\w+): worker \S+ lost after (\d+) output tokens")
RETRIED = re.compile(r"request (msg_\w+): worker \S+ failed before any output")


def fleet_file(replicas: int = 2, routing: str = "") -> Path:
    path = Path(tempfile.mkdtemp(prefix="sluice-bench-")) / "fleet.toml"
    path.write_text(
        f'{routing}[models."{MODEL}".versions.v1]\nweights = "bundled"\ntraffic = 100\nreplicas = {replicas}\n'
        f'[models."{MODEL}".versions.v1.engine]\nkv_cache_gib = 0.25\nmax_num_seqs = 16\n'
    )
    return path


async def restart_round(url: str, r: int, max_tokens: int, kill_after: float) -> dict:
    """One stream on the only worker; kill -9 it; time its restart and the stream's resumption."""
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"Round {r}: tell a long story about {TOPICS[r % len(TOPICS)]}."}],
    }
    async with httpx.AsyncClient(timeout=600) as client:
        task = asyncio.ensure_future(stream(client, url, body))
        while True:
            busy = [
                w for w in (await asyncio.to_thread(fleet_status, url))["workers"] if w["inflight"] > 0 and w["pid"]
            ]
            if busy or task.done():
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(kill_after)
        victim = busy[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        killed = time.perf_counter()
        while True:
            workers = (await asyncio.to_thread(fleet_status, url))["workers"]
            if any(w["status"] == "warm" and w["pid"] and w["pid"] != victim for w in workers):
                warm = time.perf_counter()
                break
            await asyncio.sleep(0.02)
        reply = await task
    after = [t for t in reply.deltas if t > killed]
    gaps = [(b - a, b) for a, b in zip(reply.deltas, reply.deltas[1:])]
    resumed = max(gaps)[1] if gaps else float("nan")  # the delta that ended the outage
    # the stream's own TTFT (queue + prefill on a warm worker): what a continuation pays at
    # least, since it re-prefills the prompt and the tokens sent so far on the new process
    return {
        "ok": reply.ok,
        "restart_s": round(warm - killed, 2),
        "resume_after_warm_ms": round(1000 * (resumed - warm)),
        "ttft_ms": round(1000 * reply.ttft),
        "deltas_after_kill": len(after),
    }


def main_restart(args: argparse.Namespace) -> None:
    proc = start_server(
        ["--fleet", str(fleet_file(1, "[routing]\nmigration_wait_s = 60\n"))],
        env={"SLUICE_ADMIN_KEY": ADMIN},
        timeout=600,
    )
    try:
        load0 = load_average()
        rounds = []
        for r in range(args.rounds):
            wait_warm(proc.base_url, 1)
            rounds.append(asyncio.run(restart_round(proc.base_url, r, args.max_tokens, args.kill_after)))
        delays = [x["resume_after_warm_ms"] for x in rounds]
        print(
            json.dumps(
                {
                    "rounds": rounds,
                    "lost_streams": sum(1 for x in rounds if not x["ok"]),
                    "resume_after_warm_ms_max": max(delays),
                    "migration_wait_s": 60,
                    "load_average": [round(load0, 1), round(load_average(), 1)],
                }
            )
        )
    finally:
        proc.stop()


async def one_round(url: str, r: int, streams: int, max_tokens: int, kill_after: float) -> tuple[list, int]:
    """Start the streams, wait until all run on a worker, stream `kill_after` s, kill -9 the
    busiest worker; returns the replies and how many streams were on it."""

    def body(i: int) -> dict:
        topic = TOPICS[(r * streams + i) % len(TOPICS)]
        return {
            "model": MODEL,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": [{"role": "user", "content": f"Round {r}: tell a long story about {topic}."}],
        }

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=streams + 4)) as client:
        tasks = [asyncio.ensure_future(stream(client, url, body(i))) for i in range(streams)]
        while not all(t.done() for t in tasks):
            workers = (await asyncio.to_thread(fleet_status, url))["workers"]
            if sum(w["inflight"] for w in workers) >= streams:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(kill_after)
        busy = [w for w in (await asyncio.to_thread(fleet_status, url))["workers"] if w["inflight"] > 0 and w["pid"]]
        victim = max(busy, key=lambda w: w["inflight"]) if busy else None
        if victim is not None:
            os.kill(victim["pid"], signal.SIGKILL)
        replies = await asyncio.gather(*tasks)
    return replies, victim["inflight"] if victim else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--streams", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--kill-after", type=float, default=1.0, help="seconds of streaming before the kill (default 1)")
    ap.add_argument(
        "--restart",
        action="store_true",
        help="measure a stream's resumption on its only worker restarted at the same address",
    )
    args = ap.parse_args()
    if args.restart:
        return main_restart(args)
    proc = start_server(["--fleet", str(fleet_file())], env={"SLUICE_ADMIN_KEY": ADMIN}, timeout=600)
    extra: list[float] = []
    lost = migrated_total = 0
    per_round = []
    try:
        wait_warm(proc.base_url, 2)
        load0 = load_average()
        for r in range(args.rounds):
            wait_warm(proc.base_url, 2)
            replies, on_victim = asyncio.run(
                one_round(proc.base_url, r, args.streams, args.max_tokens, args.kill_after)
            )
            migrated = {m.group(1) for m in MIGRATED.finditer(proc.log())}
            retried = {m.group(1) for m in RETRIED.finditer(proc.log())}
            lost += sum(1 for x in replies if not x.ok)
            moved = [x for x in replies if x.message_id in migrated and x.ok]
            stayed = [x for x in replies if x.message_id not in migrated and x.ok and len(x.deltas) > 1]
            gaps = [b - a for x in stayed for a, b in zip(x.deltas, x.deltas[1:])]
            typical = statistics.median(gaps) if gaps else 0.0
            round_extra = [
                max(b - a for a, b in zip(x.deltas, x.deltas[1:])) - typical for x in moved if len(x.deltas) > 1
            ]
            extra += round_extra
            migrated_total += len(moved)
            per_round.append(
                {
                    "on_killed_worker": on_victim,
                    "migrated": len(moved),
                    "retried_before_output": sum(1 for x in replies if x.message_id in retried),
                    "median_delta_gap_ms": round(1000 * typical, 1),
                    "extra_ms": [round(1000 * e) for e in round_extra],
                }
            )
        result = {
            "rounds": per_round,
            "migrated_streams": migrated_total,
            "lost_streams": lost,
            "extra_latency_p50_ms": 1000 * pct(extra, 0.5),
            "extra_latency_p99_ms": 1000 * pct(extra, 0.99),
            "load_average": [round(load0, 1), round(load_average(), 1)],
        }
        print(json.dumps(result))
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
