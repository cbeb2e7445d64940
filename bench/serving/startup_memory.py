#!/usr/bin/env python3
"""Cold start and resident memory of `sluice serve` with the bundled model at default settings.

  cold start  --starts times: spawn `sluice serve` on a free 127.0.0.1 port and time, from the
              process start, its "listening" line, the worker's "listening" line (model loaded,
              engine built; serve prestarts its worker and shows that worker's output once the
              fleet adopts it, so since then: the later of the two) and the first 200 from
              /ready (the process is ready to serve)
  memory      on the last server started: resident memory (VmRSS, and its anonymous part: the
              process's own heap and tensors, as opposed to file pages of shared libraries and
              the mapped model file, which the kernel may drop) of the serve process and of its
              worker, idle; then --waves waves of --streams concurrent streaming requests
              (--max-tokens each, temperature 0), sampling both every 0.1 s: the peak during each
              wave and the figure after it; plus the engine's own count of KV memory written
              (sluice_engine_kv_resident_bytes) and its pool ceiling
  in-process  a fresh interpreter times import torch / load the model / build the LLMEngine, and
              the cost that lazily touched KV removed: zero-filling a pool of the old default
              size (2 GiB) with torch.zeros, as the engine used to at start-up

Resident memory counts pages, not time, so it is stable on a busy machine; the times are not:
every start records the CPU share of the machine's load (1-minute load average / cores).

    .venv/bin/python bench/serving/startup_memory.py                 # 3 starts, 2 waves of 32 streams
    .venv/bin/python bench/serving/startup_memory.py --starts 1 --waves 1 --streams 8   # smoke
    .venv/bin/python bench/serving/startup_memory.py --serve-arg=--kv-idle-gib --serve-arg=0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common
import httpx

from bench.common import log

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import Recorder, http_stream

from tests.server_process import free_port, metric

MIB = 2**20


def rss(pid: int) -> dict[str, int]:
    """VmRSS and its anonymous part (heap, tensors, the KV mappings: this process's own) vs
    file-backed pages (shared libraries, the mapped model file: shared and reclaimable)."""
    out = {"rss": 0, "anon": 0, "file": 0}
    keys = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file"}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = keys.get(line.split(":")[0] + ":")
            if key:
                out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Server:
    """`sluice serve` with its output in a log file we poll, timing when each marker appears."""

    MARKERS = {
        "listening": "sluice: listening on",
        "worker_ready": "sluice worker listening",
        "log_ready": "sluice: ready",
    }

    def __init__(self, extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(f"/tmp/sluice-startup-bench-{os.getpid()}-{self.port}.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        self.t0 = time.perf_counter()
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port), *extra],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self.times: dict[str, float] = {}

    def wait_ready(self, timeout: float = 300.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice serve exited:\n{self.log_path.read_text()}")
            self._markers()
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    self.times["ready"] = time.perf_counter() - self.t0
                    self._markers()  # lines written since the last poll: at most 50 ms early
                    return self.times
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"not ready after {timeout}s:\n{self.log_path.read_text()}")

    def _markers(self) -> None:
        text = self.log_path.read_text(errors="replace")
        now = time.perf_counter() - self.t0
        for name, marker in self.MARKERS.items():
            if name not in self.times and marker in text:
                self.times[name] = now

    def pids(self) -> tuple[int, list[int]]:
        return self.proc.pid, children(self.proc.pid)

    def memory(self) -> dict[str, dict[str, int]]:
        serve, workers = self.pids()
        worker = {"rss": 0, "anon": 0, "file": 0}
        for w in workers:
            for k, v in rss(w).items():
                worker[k] += v
        return {"serve": rss(serve), "worker": worker}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log_path.unlink(missing_ok=True)


async def wave(server: Server, streams: int, max_tokens: int, offset: int) -> dict:
    rec = Recorder()
    peak = {"serve": 0, "worker": 0, "total": 0, "worker_anon": 0}
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            m = server.memory()
            for k in ("serve", "worker"):
                peak[k] = max(peak[k], m[k]["rss"])
            peak["total"] = max(peak["total"], m["serve"]["rss"] + m["worker"]["rss"])
            peak["worker_anon"] = max(peak["worker_anon"], m["worker"]["anon"])
            await asyncio.sleep(0.1)

    async with httpx.AsyncClient(timeout=600) as client:
        sampler = asyncio.create_task(sample())
        t0 = time.perf_counter()
        await asyncio.gather(*(http_stream(client, server.url, offset + i, max_tokens, rec) for i in range(streams)))
        wall = time.perf_counter() - t0
        done.set()
        await sampler
    return {
        "peak": peak,
        "after": server.memory(),
        "output_tokens": rec.tokens,
        "errors": rec.errors,
        "wall_s": wall,
        "kv_resident_bytes": optional_metric(server.url, "sluice_engine_kv_resident_bytes"),
    }


PHASES = textwrap.dedent("""
    import json, time
    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.engine.kv_memory import kv_bytes_per_block
    from sluice.models.loader import load_model
    loaded = load_model(None, "float32", progress=False)
    t2 = time.perf_counter()
    engine = LLMEngine(loaded, EngineConfig())
    t3 = time.perf_counter()
    per_block = kv_bytes_per_block(loaded.model, 8)
    blocks = (2 << 30) // per_block
    cfg = loaded.config
    shape = (cfg.num_kv_heads, blocks * 8, cfg.head_dim)
    z0 = time.perf_counter()
    old = [torch.zeros(shape) for _ in range(2 * cfg.num_layers)]
    z1 = time.perf_counter()
    print(json.dumps({"import_torch_s": t1 - t0, "load_model_s": t2 - t1, "build_engine_s": t3 - t2,
                      "zero_fill_2gib_s": z1 - z0,
                      "pool_reserved_gib": engine.kv.num_usable_blocks * per_block / 2**30}))
""")


def in_process() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PHASES],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def optional_metric(url: str, name: str) -> float | None:
    try:
        return metric(url, name)
    except KeyError:  # an older server without it
        return None


def describe(m: dict[str, dict[str, int]]) -> str:
    s, w = m["serve"], m["worker"]
    return (
        f"RSS serve {s['rss'] / MIB:.0f} (anon {s['anon'] / MIB:.0f}) + worker {w['rss'] / MIB:.0f} "
        f"(anon {w['anon'] / MIB:.0f}) = {(s['rss'] + w['rss']) / MIB:.0f} MiB"
    )


def load_share() -> float:
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", type=int, default=3)
    p.add_argument("--waves", type=int, default=2)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--serve-arg", action="append", default=[], help="extra `sluice serve` argument (repeatable)")
    p.add_argument(
        "--skip-in-process",
        action="store_true",
        help="skip the in-process phase timing (e.g. to measure an older checkout through PYTHONPATH)",
    )
    args = p.parse_args()

    starts = []
    server = None
    for i in range(args.starts):
        if server is not None:
            server.stop()
        load = load_share()
        server = Server(args.serve_arg)
        times = server.wait_ready()
        times["machine_load_per_core"] = load
        starts.append(times)
        log(f"start {i + 1}: " + "  ".join(f"{k} {v:.2f}" for k, v in times.items()))
    assert server is not None
    try:
        time.sleep(1.0)
        idle = server.memory()
        ceiling = metric(server.url, "sluice_engine_kv_blocks_total")
        log(f"idle: {describe(idle)}")
        waves = []
        for w in range(args.waves):
            r = asyncio.run(wave(server, args.streams, args.max_tokens, offset=w * args.streams))
            waves.append(r)
            pk = r["peak"]
            log(
                f"wave {w + 1} ({args.streams} streams, {r['output_tokens']} tokens, {r['errors']} errors): "
                f"peak RSS serve {pk['serve'] / MIB:.0f} + worker {pk['worker'] / MIB:.0f} = "
                f"{pk['total'] / MIB:.0f} MiB "
                f"(worker anonymous {pk['worker_anon'] / MIB:.0f}); after: {describe(r['after'])}; "
                + ("" if r["kv_resident_bytes"] is None else f"KV written {r['kv_resident_bytes'] / MIB:.0f} MiB")
            )
    finally:
        server.stop()
    phases = {} if args.skip_in_process else in_process()
    log("in-process: " + "  ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    med = {k: statistics.median(s[k] for s in starts) for k in starts[0]}
    log(f"median cold start (process start -> /ready): {med['ready']:.2f} s over {args.starts} start(s)")
    print(
        json.dumps(
            {
                "bench": "startup_memory",
                "params": vars(args),
                "starts": starts,
                "median_start": med,
                "idle": idle,
                "kv_blocks_total": ceiling,
                "waves": waves,
                "in_process": phases,
            }
        )
    )


if __name__ == "__main__":
    main()
