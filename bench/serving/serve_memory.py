#!/usr/bin/env python3
"""Resident memory of `sluice serve` with the bundled model: RSS, PSS and unique pages per
process, idle and after concurrent streams.

Starts `sluice serve` (default settings plus any --serve-arg) on a free 127.0.0.1 port, waits
for /ready, and reads /proc/PID/smaps_rollup of every process in its tree (the gateway and its
worker): RSS (pages mapped), PSS (each shared page divided among the processes mapping it: the
figure that sums without counting shared libraries twice), and the anonymous part (heap,
tensors, KV: the process's own). PSS also divides pages with processes outside the tree (another
torch process on the machine halves libtorch's share), so it varies with what else runs; as
root, "unique" counts the tree's resident physical pages once each (/proc/PID/pagemap frame
numbers): the memory the serve tree holds, whatever else runs. Measured idle, then after each
of --waves waves of --streams concurrent streaming requests (max_tokens --max-tokens,
temperature 0), each time --settle seconds after (the engine gives memory back after 1 s idle).
With --breakdown, each process's mappings grouped (shared libraries by name, the model file, the
anonymous memory, the heap) show where the pages are. Stops the server by its PID (and any child
still alive by its PID).

    .venv/bin/python bench/serving/serve_memory.py                     # 1 wave of 32 streams
    .venv/bin/python bench/serving/serve_memory.py --waves 2 --breakdown
    .venv/bin/python bench/serving/serve_memory.py --serve-arg=--max-num-seqs --serve-arg=16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from array import array
from collections import defaultdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serve_load import Recorder, http_stream

from bench.common import log
from tests.server_process import free_port, metric

MIB = 2**20
ROLLUP_KEYS = {"Rss": "rss", "Pss": "pss", "Anonymous": "anon", "Pss_Anon": "pss_anon"}


def rollup(pid: int) -> dict[str, int]:
    """Bytes: rss, pss, anon (and pss_anon where the kernel reports it) from smaps_rollup."""
    out = dict.fromkeys(ROLLUP_KEYS.values(), 0)
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key = ROLLUP_KEYS.get(line.split(":")[0])
            if key:
                out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


_PRESENT = 1 << 63
_PFN = (1 << 55) - 1


def frames(pid: int) -> set[int] | None:
    """Physical frame numbers of the process's resident pages; None without the right to read
    them (frame numbers read as 0 unless root)."""
    page = os.sysconf("SC_PAGE_SIZE")
    out: set[int] = set()
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        with open(f"/proc/{pid}/pagemap", "rb") as pm:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if "[vsyscall]" in line:
                    continue
                pm.seek(lo // page * 8)
                entries = array("Q")
                entries.frombytes(pm.read((hi - lo) // page * 8))
                out.update(e & _PFN for e in entries if e & _PRESENT)
    except OSError:
        return None
    return None if out == {0} else out


def unique_bytes(pids: list[int]) -> int | None:
    seen: set[int] = set()
    for pid in pids:
        f = frames(pid)
        if f is None:
            return None
        seen |= f
    return len(seen) * os.sysconf("SC_PAGE_SIZE")


def tree(pid: int) -> list[int]:
    """pid and its descendants, parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def comm(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return "worker" if b"worker" in cmd else "serve" if b"serve" in cmd else cmd[0].decode()
    except OSError:
        return "?"


_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def breakdown(pid: int, top: int = 12) -> list[tuple[str, int, int]]:
    """(what, rss, pss) per group of mappings, largest PSS first."""
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    name = "?"
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        if _MAPPING.match(line):
            parts = line.split(None, 5)
            path = parts[5].strip() if len(parts) > 5 else ""
            if not path:
                name = "[anon: heap, tensors, KV, arenas]"
            elif path.startswith("["):
                name = path
            else:
                name = os.path.basename(path)
                if name.endswith(".gguf"):
                    name = f"model file {name}"
                elif ".so" in name:
                    name = re.sub(r"[-.]\d.*$", "", name.split(".so")[0]) + ".so"
        elif line.startswith("Rss:"):
            groups[name][0] += int(line.split()[1]) * 1024
        elif line.startswith("Pss:"):
            groups[name][1] += int(line.split()[1]) * 1024
    rows = sorted(((k, v[0], v[1]) for k, v in groups.items()), key=lambda r: -r[2])
    rest = rows[top:]
    rows = rows[:top]
    if rest:
        rows.append((f"{len(rest)} others", sum(r[1] for r in rest), sum(r[2] for r in rest)))
    return rows


class Server:
    def __init__(self, extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(f"/tmp/sluice-serve-memory-{os.getpid()}-{self.port}.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port), *extra],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self.seen: set[int] = set()

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice serve exited:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"not ready after {timeout}s:\n{self.log_path.read_text()}")

    def memory(self, unique: bool = False) -> dict[str, dict[str, int]]:
        """Per process of the tree (keyed "role pid") plus "total" (with `unique`: its resident
        physical pages counted once, when readable)."""
        out: dict[str, dict[str, int]] = {}
        total = dict.fromkeys(ROLLUP_KEYS.values(), 0)
        pids = tree(self.proc.pid)
        for pid in pids:
            self.seen.add(pid)
            m = rollup(pid)
            out[f"{comm(pid)} {pid}"] = m
            for k, v in m.items():
                total[k] += v
        if unique:
            u = unique_bytes(pids)
            if u is not None:
                total["unique"] = u
        out["total"] = total
        return out

    def stop(self) -> None:
        pids = tree(self.proc.pid) if self.proc.poll() is None else []
        self.seen.update(pids)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in self.seen - {self.proc.pid}:  # a worker the gateway left behind: by its PID
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.log_path.unlink(missing_ok=True)


async def wave(server: Server, streams: int, max_tokens: int, offset: int) -> dict:
    rec = Recorder()
    peak = {"rss": 0, "pss": 0}
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            t = server.memory()["total"]
            peak["rss"], peak["pss"] = max(peak["rss"], t["rss"]), max(peak["pss"], t["pss"])
            await asyncio.sleep(0.2)

    async with httpx.AsyncClient(timeout=600) as client:
        sampler = asyncio.create_task(sample())
        t0 = time.perf_counter()
        await asyncio.gather(*(http_stream(client, server.url, offset + i, max_tokens, rec) for i in range(streams)))
        wall = time.perf_counter() - t0
        done.set()
        await sampler
    return {"peak_total": peak, "output_tokens": rec.tokens, "errors": rec.errors, "wall_s": wall}


def kv_resident(url: str) -> float | None:
    """The engine's count of KV memory written and still resident (bytes), if it reports it."""
    try:
        return metric(url, "sluice_engine_kv_resident_bytes")
    except (KeyError, httpx.HTTPError):
        return None


def describe(m: dict[str, dict[str, int]]) -> str:
    return (
        "  ".join(
            f"{k}: RSS {v['rss'] / MIB:.0f} PSS {v['pss'] / MIB:.0f} anon {v['anon'] / MIB:.0f}"
            + (f" unique {v['unique'] / MIB:.0f}" if "unique" in v else "")
            for k, v in m.items()
        )
        + " MiB"
    )


def show_breakdown(server: Server, label: str) -> dict[str, list]:
    out = {}
    for pid in tree(server.proc.pid):
        rows = breakdown(pid)
        out[f"{comm(pid)} {pid}"] = rows
        log(f"  {label} {comm(pid)} {pid}: " + "; ".join(f"{n} {r / MIB:.1f}/{p / MIB:.1f}" for n, r, p in rows))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--waves", type=int, default=1)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--settle", type=float, default=2.0, help="seconds idle before each measurement")
    p.add_argument("--breakdown", action="store_true", help="group each process's mappings (RSS/PSS MiB)")
    p.add_argument("--serve-arg", action="append", default=[], help="extra `sluice serve` argument (repeatable)")
    args = p.parse_args()

    server = Server(args.serve_arg)
    result: dict = {"bench": "serve_memory", "params": vars(args), "waves": []}
    try:
        server.wait_ready()
        time.sleep(args.settle)
        result["idle"] = server.memory(unique=True)
        result["idle_kv_resident_bytes"] = kv_resident(server.url)
        log(f"idle: {describe(result['idle'])}")
        if args.breakdown:
            result["idle_breakdown"] = show_breakdown(server, "idle")
        for w in range(args.waves):
            r = asyncio.run(wave(server, args.streams, args.max_tokens, offset=w * args.streams))
            time.sleep(args.settle)
            r["after"] = server.memory(unique=True)
            r["kv_resident_bytes"] = kv = kv_resident(server.url)
            result["waves"].append(r)
            pk = r["peak_total"]
            log(
                f"wave {w + 1} ({args.streams} streams, {r['output_tokens']} tokens, {r['errors']} errors, "
                f"{r['wall_s']:.1f} s): peak total RSS {pk['rss'] / MIB:.0f} PSS {pk['pss'] / MIB:.0f} MiB; "
                f"after: {describe(r['after'])}" + ("" if kv is None else f"; KV resident {kv / MIB:.0f} MiB")
            )
        if args.breakdown and args.waves:
            result["after_breakdown"] = show_breakdown(server, "after")
    finally:
        server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
