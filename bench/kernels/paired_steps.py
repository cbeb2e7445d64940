"""Shared by the engine A/B benchmarks (bench/kernels/decode_threads.py,
bench/kernels/decoder_stack.py, bench/kernels/sampling_cost.py): K requests (greedy unless given
other sampling) on one engine, then decode steps alternating between two or more sides (each
side a function that switches the engine to it), the lead swapping every step so that a burst
of other work on the shared machine lands on all alike; the contexts grow by one token per step
on every side."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def paired_decode_steps(
    engine: Any,
    tok: Any,
    k: int,
    steps: int,
    sides: dict[str, Callable[[], None]],
    first_id: int = 0,
    sampling: dict[str, Any] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Per side, the wall and process-CPU milliseconds of each of its `steps` decode steps over a
    batch of `k` requests (aborted afterwards). Request ids start after `first_id`; `sampling`:
    SamplingParams fields (temperature, top_p, ...; default greedy)."""
    from sluice.types import GenerationRequest, SamplingParams

    engine.kv.reset_prefix_cache()
    params = SamplingParams(max_tokens=2 * steps + 16, ignore_eos=True, **(sampling or {"temperature": 0.0}))
    for i in range(k):
        ids = tok.encode(f"Tell me about topic number {i} and why it matters to people, with examples.")
        engine.add_request(GenerationRequest(f"r{first_id + i + 1}", ids, params))
    for _ in range(4):  # the prefill and a few decodes, dropped
        engine.step()
    wall: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    order = list(sides)
    for s in range(steps):
        for name in order if s % 2 == 0 else order[::-1]:
            sides[name]()
            c0, w0 = time.process_time(), time.perf_counter()
            engine.step()
            wall[name].append(1000 * (time.perf_counter() - w0))
            cpu[name].append(1000 * (time.process_time() - c0))
    for request_id in list(engine.requests):  # done measuring: free the batch
        engine.abort_request(request_id)
    while engine.has_unfinished():
        engine.step()
    return {"wall_ms": wall, "cpu_ms": cpu}


def medians(times: dict[str, dict[str, list[float]]], new: str, old: str) -> dict[str, float]:
    """Median wall and CPU per side, and the median over paired steps of new / old wall time."""
    out = {f"{name}_{what}": statistics.median(v) for what, per in times.items() for name, v in per.items()}
    out["ratio_wall"] = statistics.median(a / b for a, b in zip(times["wall_ms"][new], times["wall_ms"][old]))
    return out


def compare_levels(
    engine: Any,
    tok: Any,
    streams: list[int],
    steps: int,
    sides: dict[str, Callable[[], None]],
    new: str,
    old: str,
    restore: Callable[[], None],
) -> dict[str, dict[str, float]]:
    """paired_decode_steps at each batch size in `streams`, `restore` after each (the engine's
    default side); prints one table row per level and returns the medians per level ("xK")."""
    result, n = {}, 0
    print(
        f"{'streams':>7} {old + ' wall':>12} {new + ' wall':>12} {old + ' CPU':>12} {new + ' CPU':>12} "
        f"{new + '/' + old + ' wall (paired)':>26}"
    )
    for k in streams:
        times = paired_decode_steps(engine, tok, k, steps, sides, first_id=n)
        n += k
        restore()
        med = medians(times, new, old)
        result[f"x{k}"] = med
        print(
            f"{k:>7} {med[old + '_wall_ms']:12.2f} {med[new + '_wall_ms']:12.2f} {med[old + '_cpu_ms']:12.2f} "
            f"{med[new + '_cpu_ms']:12.2f} {med['ratio_wall']:26.3f}",
            flush=True,
        )
    return result
