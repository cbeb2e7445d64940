#!/usr/bin/env python3
"""How long a worker's other Python threads wait for the GIL while the engine decodes.

The engine steps one greedy stream (the CPU kernels, 1 torch thread) on the main thread while a
second thread plays the worker's gRPC / asyncio side: every 2 ms it wakes, takes the GIL and does
~0.1 ms of Python (what sending one token's message costs). Reported: how late that thread runs
after it asked to (its wake-up lateness, p50 / p90: the time it waited for the GIL), and the
engine's decode step (wall median) with and without the second thread. Run it against two
checkouts to compare them (the kernels' entry points holding the GIL or not):

    PYTHONPATH=src .venv/bin/python bench/serving/gil_contention.py
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python bench/serving/gil_contention.py

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time


def busy_python(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    x = 0
    while time.perf_counter() < end:
        x += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="decode steps per phase (default: 60)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model
    from sluice.types import GenerationRequest, SamplingParams

    loaded = load_model(progress=False)
    engine = LLMEngine(loaded, EngineConfig(speculative_tokens=0))
    ids = loaded.tokenizer.encode_chat([{"role": "user", "content": "Write a long story about a lighthouse."}])
    n = 0

    def steps(count: int) -> list[float]:
        nonlocal n
        n += 1
        engine.add_request(
            GenerationRequest(f"g{n}", ids, SamplingParams(max_tokens=count + 2, temperature=0.0, ignore_eos=True))
        )
        engine.step()  # the prefill
        out = []
        while engine.has_unfinished():
            t0 = time.perf_counter()
            engine.step()
            out.append(time.perf_counter() - t0)
        return out

    steps(4)  # warm-up
    stop = threading.Event()
    lateness: list[float] = []

    def other() -> None:
        while not stop.is_set():
            asked = time.perf_counter() + 0.002
            time.sleep(0.002)  # releases the GIL; waking needs it back
            lateness.append(time.perf_counter() - asked)
            busy_python(100)

    alone = steps(args.steps)
    t = threading.Thread(target=other, daemon=True)
    t.start()
    shared = steps(args.steps)
    stop.set()
    t.join()
    late = sorted(lateness)
    res = {
        "step_alone_ms": 1000 * statistics.median(alone),
        "step_with_thread_ms": 1000 * statistics.median(shared),
        "thread_wake_late_p50_ms": 1000 * late[len(late) // 2],
        "thread_wake_late_p90_ms": 1000 * late[int(len(late) * 0.9)],
        "thread_wakeups_per_step": len(late) / max(1, len(shared)),
        "load": os.getloadavg(),
    }
    print(
        f"decode step alone {res['step_alone_ms']:.2f} ms, "
        f"with the thread {res['step_with_thread_ms']:.2f} ms; "
        f"thread wake-up late by p50 {res['thread_wake_late_p50_ms']:.2f} / "
        f"p90 {res['thread_wake_late_p90_ms']:.2f} ms "
        f"({res['thread_wakeups_per_step']:.1f} per step); load {res['load']}"
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
