#!/usr/bin/env python3
"""Requests served per version over time during a rollout, under a steady streaming load.

One `sluice serve` with a fleet whose model has v1 (all traffic) and v2 (staged, traffic 0),
one local replica each. --clients closed loops of short greedy streams (distinct users) run
before, during and after `rollout --to v2` (steps 10, 25, 50, 100 %; --interval s each). Each
request is counted in the time bucket where it started, under the version its
`sluice-model-version` header named; the rollout's phase is sampled from /admin/fleet. Prints a
text chart (one row per bucket) and one JSON line; every request must complete (failed and
truncated requests are counted and reported).

    .venv/bin/python bench/serving/rollout_timeline.py [--interval 8] [--clients 3] [--bucket 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.serving.fleet_common import ADMIN, ADMIN_HEADERS, MODEL, fleet_status, load_average, stream, wait_warm
from tests.server_process import start_server

MAX_TOKENS = 8


def fleet_file() -> Path:
    path = Path(tempfile.mkdtemp(prefix="sluice-bench-")) / "fleet.toml"
    text = ""
    for name, traffic in (("v1", 100), ("v2", 0)):
        t = f'models."{MODEL}".versions.{name}'
        text += f'[{t}]\nweights = "bundled"\ntraffic = {traffic}\nreplicas = 1\n'
        text += f"[{t}.engine]\nkv_cache_gib = 0.1\nmax_num_seqs = 8\n"
    path.write_text(text)
    return path


async def run(url: str, clients: int, interval: float, lead_s: float) -> dict:
    t0 = time.perf_counter()
    records: list[tuple[float, str, bool]] = []  # (start offset, version, completed)
    phases: list[tuple[float, str]] = []
    stop = asyncio.Event()

    async def client_loop(c: int) -> None:
        n = 0
        async with httpx.AsyncClient(timeout=300) as http:
            while not stop.is_set():
                body = {
                    "model": MODEL,
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "metadata": {"user_id": f"u{c}-{n}"},
                    "messages": [{"role": "user", "content": f"One sentence about the number {n}."}],
                }
                started = time.perf_counter() - t0
                try:
                    r = await stream(http, url, body)
                    ok = r.ok and r.usage.get("output_tokens", 0) > 0
                    records.append((started, r.version.rpartition("/")[2] or "?", ok))
                except httpx.HTTPError:
                    records.append((started, "?", False))
                n += 1

    async def watch() -> None:
        while not stop.is_set():
            ro = (await asyncio.to_thread(fleet_status, url))["models"][MODEL]["rollout"]
            label = (
                "before"
                if ro is None
                else ro["phase"] + (f" {ro['steps'][ro['step']]:g} %" if ro["phase"] == "shifting" else "")
            )
            if not phases or phases[-1][1] != label:
                phases.append((time.perf_counter() - t0, label))
            if (
                ro is not None
                and ro["phase"] in ("done", "rolled_back")
                and time.perf_counter() - t0 > phases[-1][0] + lead_s
            ):
                stop.set()
            await asyncio.sleep(0.25)

    tasks = [asyncio.ensure_future(client_loop(c)) for c in range(clients)] + [asyncio.ensure_future(watch())]
    await asyncio.sleep(lead_s)
    plan = {
        "to": "v2",
        "steps": [10, 25, 50, 100],
        "step_interval_s": interval,
        "max_ttft_p95_s": 600,
        "min_requests": 1000,
    }
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(url + f"/admin/fleet/models/{MODEL}/rollout", json=plan, headers=ADMIN_HEADERS)
        r.raise_for_status()
    rollout_at = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    return {"records": records, "phases": phases, "rollout_at": rollout_at}


def chart(records: list, phases: list, bucket: float) -> tuple[str, list[dict]]:
    end = max(s for s, _, _ in records)
    rows, lines = (
        [],
        [f"{'t (s)':>7}  {'v1':>3} {'v2':>3}  phase", f"{'':>7}  (each # = one request started in the bucket)"],
    )
    b = 0.0
    while b <= end:
        in_b = [(v, ok) for s, v, ok in records if b <= s < b + bucket]
        v1, v2 = sum(v == "v1" for v, _ in in_b), sum(v == "v2" for v, _ in in_b)
        phase = (
            [label for at, label in phases if at < b + bucket][-1] if any(at < b + bucket for at, _ in phases) else ""
        )
        rows.append({"t": b, "v1": v1, "v2": v2, "phase": phase})
        lines.append(f"{b:7.0f}  {v1:3d} {v2:3d}  {phase:<16} {'1' * v1}{'2' * v2}")
        b += bucket
    return "\n".join(lines), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=8.0, help="step_interval_s of the rollout (default 8)")
    ap.add_argument("--clients", type=int, default=3, help="concurrent streaming loops (default 3)")
    ap.add_argument("--bucket", type=float, default=2.0, help="chart bucket in seconds (default 2)")
    args = ap.parse_args()
    proc = start_server(["--fleet", str(fleet_file())], env={"SLUICE_ADMIN_KEY": ADMIN}, timeout=600)
    try:
        wait_warm(proc.base_url, 1)
        load0 = load_average()
        out = asyncio.run(run(proc.base_url, args.clients, args.interval, lead_s=2 * args.bucket))
        text, rows = chart(out["records"], out["phases"], args.bucket)
        print(text)
        records = out["records"]
        print(
            json.dumps(
                {
                    "requests": len(records),
                    "failed_or_truncated": sum(not ok for *_, ok in records),
                    "served": {v: sum(x == v for _, x, _ in records) for v in ("v1", "v2")},
                    "phases": [(round(at, 1), label) for at, label in out["phases"]],
                    "rollout_requested_at_s": round(out["rollout_at"], 1),
                    "load_average": [round(load0, 1), round(load_average(), 1)],
                    "buckets": rows,
                }
            )
        )
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
