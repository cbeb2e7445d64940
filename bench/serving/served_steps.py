#!/usr/bin/env python3
"""The engine's steps inside `sluice serve` under a concurrent streaming load (issue 25: where a
served step loses time against the engine's own).

Starts `sluice serve` (its defaults, or what --sluice-env adds) with a `sitecustomize` on its
PYTHONPATH that, in the gateway and the worker alike, times every `LLMEngine.step` (wall and the
engine thread's CPU, the batch's sequences and tokens) and every collection of Python's cyclic
collector (`gc.callbacks`), each process writing its own file. Then it sends
bench/serving/vs_llamacpp.py's load (streaming chat, greedy, `ignore_eos`, 2 x streams requests, closed
loop) --levels times, and reads every thread of the server's processes and of this one around each
level (CPU through psutil; the rest from Linux's /proc). Per level:

  engine          busy share of the level's wall time, the gaps between steps
  decode steps    those with as many tokens as sequences at the full batch: count, median wall,
                  median engine-thread CPU (wall - CPU: time the thread waited for a core or the GIL)
  other steps     prefill and mixed steps: count and total wall
  threads         each thread above --min-cores ("gateway|workerN|client pid tid name"; the
                  client is this process, the load's HTTP side): its CPU in cores, the time it
                  was runnable but waited for a core (schedstat, in cores), and how often per
                  second it was preempted (involuntary context switches)
  gc              per process and generation: collections, total and longest milliseconds

Compare the decode steps' wall with bench/kernels/step_breakdown.py's or bench/kernels/decode_threads.py's (the
same step, the engine alone) taken in the same hour. Ends with one JSON line.

    PYTHONPATH=src .venv/bin/python bench/serving/served_steps.py                  # 32 streams, 2 levels
    PYTHONPATH=src .venv/bin/python bench/serving/served_steps.py --streams 8 --levels 1
    PYTHONPATH=src .venv/bin/python bench/serving/served_steps.py --sluice-env SLUICE_KERNEL_ISA=avx2
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_llamacpp import level

from tests.server_process import MODEL, start_server

# Loaded by every Python process of the server tree (PYTHONPATH), it wraps LLMEngine.step once
# sluice.engine.engine is imported, and logs the collector's passes. Lines: "step <perf_counter
# start> <wall> <thread cpu> <seqs> <tokens>" and "gc <start> <generation> <seconds>".
SITECUSTOMIZE = r"""
import importlib.abc, importlib.util, os, sys, time, gc
_dir = os.environ.get("SLUICE_BENCH_TRACE_DIR")
if _dir:
    _out = open(os.path.join(_dir, f"trace.{os.getpid()}"), "a", buffering=1)
    _gc_start = {}
    def _gc(phase, info):
        if phase == "start":
            _gc_start["t"] = time.perf_counter()
        elif "t" in _gc_start:
            _out.write(f"gc {_gc_start['t']:.6f} {info['generation']} {time.perf_counter() - _gc_start['t']:.6f}\n")
    gc.callbacks.append(_gc)

    def _wrap(module):
        step = module.LLMEngine.step
        def timed(self):
            t, c = time.perf_counter(), time.thread_time()
            events = step(self)
            s = self._stats
            _out.write(f"step {t:.6f} {time.perf_counter() - t:.6f} {time.thread_time() - c:.6f} "
                       f"{s.last_step_seqs} {s.last_step_tokens}\n")
            return events
        module.LLMEngine.step = timed

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "sluice.engine.engine":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                _wrap(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _Hook())
"""


def thread_sched(procs: dict[str, psutil.Process]) -> dict[str, tuple[float, float, int, str]]:
    """Per thread of these processes, keyed "<role> <pid> <tid>": CPU seconds, seconds spent
    runnable but waiting for a core (the kernel's schedstat), involuntary context switches
    (preemptions), and the thread's name. Linux: the last three come from /proc."""
    out = {}
    for role, proc in procs.items():
        for t in proc.threads():
            task = Path(f"/proc/{proc.pid}/task/{t.id}")
            try:
                wait_ns = int((task / "schedstat").read_text().split()[1])
                status = (task / "status").read_text()
                invol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
                name = (task / "comm").read_text().strip()
            except (OSError, IndexError, ValueError):  # the thread ended, or no /proc
                wait_ns, invol, name = 0, 0, "?"
            out[f"{role} {proc.pid} {t.id}"] = (t.user_time + t.system_time, wait_ns / 1e9, invol, name)
    return out


def read_traces(trace_dir: Path) -> tuple[list[tuple[float, ...]], dict[int, list[tuple[float, int, float]]]]:
    steps, gcs = [], collections.defaultdict(list)
    for f in trace_dir.glob("trace.*"):
        pid = int(f.suffix[1:])
        for line in f.read_text().splitlines():
            kind, *v = line.split()
            if kind == "step":
                steps.append(tuple(float(x) for x in v))
            elif kind == "gc":
                gcs[pid].append((float(v[0]), int(v[1]), float(v[2])))
    return sorted(steps), gcs


def summarize(steps: list, gcs: dict, t0: float, t1: float, streams: int) -> dict:
    mine = [s for s in steps if t0 <= s[0] <= t1]
    busy = sum(s[1] for s in mine)
    decode = [s for s in mine if s[3] == streams and s[4] == streams]
    other = [s for s in mine if s[3] != s[4]]  # prefill and mixed: more tokens than sequences
    gaps = [b[0] - a[0] - a[1] for a, b in zip(mine, mine[1:])]
    gc_out = {}
    for pid, rows in gcs.items():
        for gen in (0, 1, 2):
            d = [r[2] for r in rows if t0 <= r[0] <= t1 and r[1] == gen]
            if d:
                gc_out[f"{pid}/gen{gen}"] = {"count": len(d), "total_ms": 1e3 * sum(d), "max_ms": 1e3 * max(d)}
    return {
        "wall_s": t1 - t0,
        "steps": len(mine),
        "busy_share": busy / (t1 - t0) if t1 > t0 else float("nan"),
        "gaps_s": sum(gaps),
        "decode_steps": len(decode),
        "decode_wall_ms_p50": 1e3 * statistics.median(s[1] for s in decode) if decode else float("nan"),
        "decode_engine_cpu_ms_p50": 1e3 * statistics.median(s[2] for s in decode) if decode else float("nan"),
        "other_steps": len(other),
        "other_steps_wall_s": sum(s[1] for s in other),
        "gc": gc_out,
    }


def thread_use(
    before: dict[str, tuple[float, float, int, str]], after: dict[str, tuple[float, float, int, str]], wall: float
) -> dict[str, dict[str, Any]]:
    """Per thread over the level: cores used, cores spent waiting to run, preemptions a second."""
    zero = (0.0, 0.0, 0, "")  # a thread that started during the level
    return {
        k: {
            "name": v[3],
            "cores": (v[0] - before.get(k, zero)[0]) / wall,
            "waiting_cores": (v[1] - before.get(k, zero)[1]) / wall,
            "preempted_per_s": (v[2] - before.get(k, zero)[2]) / wall,
        }
        for k, v in after.items()
    }


def print_level(n: int, row: dict[str, Any], streams: int) -> None:
    print(
        f"level {n + 1}: {row['aggregate_tok_s']:.1f} tok/s; engine busy {100 * row['busy_share']:.1f} % "
        f"(gaps {row['gaps_s']:.2f} s); {row['decode_steps']} decode steps of {streams}: wall "
        f"{row['decode_wall_ms_p50']:.1f} ms, engine thread CPU {row['decode_engine_cpu_ms_p50']:.1f} ms "
        f"(p50); {row['other_steps']} other steps {row['other_steps_wall_s']:.2f} s",
        file=sys.stderr,
    )
    print(f"    {'thread':44s} {'cores':>6s} {'waiting':>8s} {'preempted/s':>12s}", file=sys.stderr)
    for key, t in row["threads"].items():
        print(
            f"    {key + ' ' + t['name']:44s} {t['cores']:6.3f} {t['waiting_cores']:8.3f} {t['preempted_per_s']:12.0f}",
            file=sys.stderr,
        )
    for key, g in row["gc"].items():
        print(
            f"    gc {key:12s} {g['count']:4d} collections, {g['total_ms']:.1f} ms, longest {g['max_ms']:.1f} ms",
            file=sys.stderr,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=32, help="concurrent streams (default 32)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per request (default 128)")
    p.add_argument("--levels", type=int, default=2, help="how many times to run the load (default 2)")
    p.add_argument("--min-cores", type=float, default=0.003, help="threads below this many cores are not listed")
    p.add_argument(
        "--sluice-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for `sluice serve` and its worker (repeatable)",
    )
    args = p.parse_args()
    trace_dir = Path(tempfile.mkdtemp(prefix="sluice-served-steps-"))
    (trace_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(kv.split("=", 1) for kv in args.sluice_env)
    env["SLUICE_BENCH_TRACE_DIR"] = str(trace_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(trace_dir), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    server = start_server([], env=env, timeout=600)
    results = []
    try:
        asyncio.run(level(server.base_url, MODEL, 1, 16, 0))  # warm: the first request's one-off costs
        gateway = psutil.Process(server.process.pid)
        procs = {
            "gateway": gateway,
            "client": psutil.Process(),  # the client: this process, the load's HTTP side
            **{f"worker{i}": w for i, w in enumerate(gateway.children())},
        }
        for n in range(args.levels):
            before = thread_sched(procs)
            t0 = time.perf_counter()
            load = asyncio.run(level(server.base_url, MODEL, args.streams, args.max_tokens, 1000 * (n + 1)))
            t1 = time.perf_counter()
            after = thread_sched(procs)
            wall = t1 - t0
            threads = thread_use(before, after, wall)
            steps, gcs = read_traces(trace_dir)
            row = summarize(steps, gcs, t0, t1, args.streams)
            row["aggregate_tok_s"] = load["aggregate_tok_s"]
            row["threads"] = {
                k: {f: round(x, 4) if isinstance(x, float) else x for f, x in v.items()}
                for k, v in sorted(threads.items(), key=lambda kv: -kv[1]["cores"])
                if v["cores"] >= args.min_cores
            }
            results.append(row)
            print_level(n, row, args.streams)
    finally:
        server.stop()
    print(
        json.dumps(
            {
                "streams": args.streams,
                "max_tokens": args.max_tokens,
                "server_pid": server.process.pid,
                "levels": results,
                "load": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
