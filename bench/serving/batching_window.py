#!/usr/bin/env python3
"""The batching window: flush vs hold vs adaptive, side by side on the bundled model.

Each mode gets its own LLMEngine (default EngineConfig plus --set, with batching_window and
batching_window_ms per mode) over one loaded model, replayed on its own virtual clock: an
iteration adds the requests whose arrival time has passed, runs one step() and moves the clock
on by what that step cost (--cost: by default its CPU time with one torch thread, which is
close to its wall time on an idle machine and far steadier on a shared one; or its wall time);
an idle engine jumps to the next arrival. That is how the
async front drives the engine (an arrival lands while a step runs and is seen at the next step
boundary), and the engine's batching window reads the same clock (it is injected). The modes
are stepped in turn, the one furthest behind in virtual time next, so a burst of other work on
this shared machine lands on all of them alike instead of on whichever mode ran at that moment.

Scenarios, all greedy with EOS ignored (exact lengths), chat prompts of ~40 tokens:
  burst      --background streams decode (long outputs); --bursts bursts of --burst-size prompts
             arrive at the same instant, --burst-gap seconds apart ("simultaneous arrivals");
             the background streams are aborted once the last burst request ends
  poisson    open loop: --poisson-n requests arrive as a Poisson process at --rate per second
  saturated  closed loop: --clients clients, more than max_num_seqs (--saturated-seqs); each sends
             its next request as soon as its last one ends (batch utilization under saturation)

Per mode: TTFT p50/p95 (arrival -> first token; burst: the burst requests only), ITL p50/p95
(every gap between two tokens of one request, all requests), throughput (output tokens / virtual
makespan), batch utilization (EngineStats.batch_utilization: the fullest of a step's three
limits, averaged over steps), held steps; per round the CPU share (CPU time / (wall x threads)).
Ratios against flush are taken within a round, then the median over --rounds.

    .venv/bin/python bench/serving/batching_window.py                 # full: 2 rounds, ~10 min on 2 cores
    .venv/bin/python bench/serving/batching_window.py --quick         # smoke: 1 round, small scenarios
    .venv/bin/python bench/serving/batching_window.py --window-ms 300 --only poisson
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sluice.engine.batching_window import BatchingWindow
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import load_model
from sluice.types import GenerationRequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common
from bench.common import log, pct

MODES = ("flush", "hold", "adaptive")
TOPICS = [
    "rivers",
    "glaciers",
    "honeybees",
    "volcanoes",
    "sourdough",
    "lighthouses",
    "coral reefs",
    "jazz",
    "windmills",
    "comets",
    "silk",
    "owls",
    "tides",
    "clocks",
    "salt",
    "deserts",
    "violins",
    "bridges",
]


@dataclass(slots=True)
class Arrival:
    at: float  # seconds after the run starts
    prompt: list[int]
    max_tokens: int
    measured: bool = True  # counts for TTFT (background streams do not)


@dataclass
class Run:
    arrivals: list[Arrival]
    closed_loop: Iterator[Arrival] | None = None  # the next request of a client whose last one ended
    stop_after_measured: bool = False  # abort the background streams once the measured ones end


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Replay:
    """One engine on its own virtual clock: each iteration adds the requests that have arrived,
    runs one step and advances the clock by what that step took (wall time); an idle engine
    jumps to the next arrival. The engine's batching window reads the same clock."""

    def __init__(self, loaded, config: EngineConfig, run: Run, cost: str = "cpu"):
        self.cost = cost
        self.clock = VirtualClock()
        self.engine = LLMEngine(loaded, config, clock=self.clock)
        self.run = run
        self.pending = sorted(run.arrivals, key=lambda a: a.at)
        self.meta: dict[str, Arrival] = {}
        self.open_measured: set[str] = set()
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.tokens = 0
        self.busy = 0.0  # wall seconds in step()
        self.busy_cpu = 0.0  # CPU seconds in step() / threads
        self.done = False

    def _add_due(self) -> None:
        while self.pending and self.pending[0].at <= self.clock.now:
            a = self.pending.pop(0)
            rid = f"q{len(self.meta)}"
            self.meta[rid] = a
            if a.measured:
                self.open_measured.add(rid)
            params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
            self.engine.add_request(GenerationRequest(rid, a.prompt, params))

    def advance(self) -> None:
        self._add_due()
        if self.run.stop_after_measured and not self.pending and not self.open_measured:
            for rid in list(self.engine.requests):
                self.engine.abort_request(rid)
        if not self.engine.has_unfinished():
            if not self.pending:
                self.done = True
            else:
                self.clock.now = self.pending[0].at
            return
        t0, c0 = time.perf_counter(), time.process_time()
        events = self.engine.step()
        wall = time.perf_counter() - t0
        cpu = (time.process_time() - c0) / torch.get_num_threads()
        self.busy += wall
        self.busy_cpu += cpu
        self.clock.now += cpu if self.cost == "cpu" else wall
        t = self.clock.now
        for ev in events:
            if ev.token_ids:
                self.tokens += len(ev.token_ids)
                if ev.request_id not in self.first:
                    self.first[ev.request_id] = t
                    if self.meta[ev.request_id].measured:
                        self.ttft.append(t - self.meta[ev.request_id].at)
                else:
                    self.itl.append(t - self.last[ev.request_id])
                self.last[ev.request_id] = t
            if ev.finished:
                self.open_measured.discard(ev.request_id)
                if self.run.closed_loop is not None and (nxt := next(self.run.closed_loop, None)) is not None:
                    nxt.at = t
                    bisect.insort(self.pending, nxt, key=lambda a: a.at)

    def summary(self) -> dict:
        s = self.engine.stats()
        return {
            "ttft_p50_ms": 1000 * pct(self.ttft, 0.5),
            "ttft_p95_ms": 1000 * pct(self.ttft, 0.95),
            "itl_p50_ms": 1000 * pct(self.itl, 0.5),
            "itl_p95_ms": 1000 * pct(self.itl, 0.95),
            "tok_s": self.tokens / self.clock.now if self.clock.now else 0.0,
            "utilization": s.batch_utilization,
            "held_steps": s.num_held_steps,
            "steps": s.num_steps,
            "requests": len(self.ttft),
            "virtual_s": self.clock.now,
            "busy_wall_s": self.busy,
            "busy_cpu_s": self.busy_cpu,
        }


def replay_modes(loaded, configs: dict[str, EngineConfig], make_run, cost: str) -> tuple[dict[str, dict], float]:
    """Every mode's replay, stepped in turn (the one furthest behind in virtual time goes next), so
    machine noise lands on all modes alike. Returns the summaries and the CPU share."""
    replays = {mode: Replay(loaded, cfg, make_run(), cost) for mode, cfg in configs.items()}
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while live := [r for r in replays.values() if not r.done]:
        min(live, key=lambda r: r.clock.now).advance()
    wall = time.perf_counter() - wall0
    share = (time.process_time() - cpu0) / (wall * torch.get_num_threads()) if wall else 0.0
    return {mode: r.summary() for mode, r in replays.items()}, share


# -- scenarios ----------------------------------------------------------------------------------
def chat_prompt(tokenizer, i: int) -> list[int]:
    topic = TOPICS[i % len(TOPICS)]
    return tokenizer.encode_chat([{"role": "user", "content": f"Write a short paragraph about {topic} (note {i})."}])


def burst(tokenizer, args, seed: int) -> Run:
    background = [
        Arrival(0.0, chat_prompt(tokenizer, 1000 + i), 100_000, measured=False) for i in range(args.background)
    ]
    bursts = [
        Arrival(
            args.burst_start + k * args.burst_gap,
            chat_prompt(tokenizer, seed * 100 + k * args.burst_size + j),
            args.out_tokens,
        )
        for k in range(args.bursts)
        for j in range(args.burst_size)
    ]
    return Run(background + bursts, stop_after_measured=True)


def poisson(tokenizer, args, seed: int) -> Run:
    rng = random.Random(seed)
    t, arrivals = 0.0, []
    for i in range(args.poisson_n):
        arrivals.append(Arrival(t, chat_prompt(tokenizer, seed * 1000 + i), args.out_tokens))
        t += rng.expovariate(args.rate)
    return Run(arrivals)


def saturated(tokenizer, args, seed: int) -> Run:
    counter = itertools.count(args.clients)
    total = args.saturated_n

    def more() -> Iterator[Arrival]:
        for i in counter:
            if i >= total:
                return
            yield Arrival(0.0, chat_prompt(tokenizer, seed * 1000 + i), args.saturated_tokens)

    first = [Arrival(0.0, chat_prompt(tokenizer, seed * 1000 + i), args.saturated_tokens) for i in range(args.clients)]
    return Run(first, closed_loop=more())


SCENARIOS = {"burst": burst, "poisson": poisson, "saturated": saturated}


# -- main -------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--window-ms", type=float, default=EngineConfig().batching_window_ms, help="hold window / adaptive cap"
    )
    p.add_argument("--only", choices=list(SCENARIOS), action="append", help="run only these scenarios")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see the note on --cost)")
    p.add_argument(
        "--cost",
        choices=["cpu", "wall"],
        default="cpu",
        help="what a step advances the virtual clock by: its CPU time / threads (default) or its wall time. With one "
        "thread, CPU time is close to the step's wall time on an idle machine and far steadier on a shared one "
        "(with two, OpenMP threads spin at barriers while their partner is descheduled, which inflates it)",
    )
    p.add_argument("--out-tokens", type=int, default=48, help="output tokens of a measured request")
    p.add_argument("--background", type=int, default=16, help="burst: streams decoding in the background")
    p.add_argument("--bursts", type=int, default=4)
    p.add_argument("--burst-size", type=int, default=4)
    p.add_argument("--burst-gap", type=float, default=3.0)
    p.add_argument("--burst-start", type=float, default=2.0)
    p.add_argument("--rate", type=float, default=3.5, help="poisson: arrivals per second")
    p.add_argument("--poisson-n", type=int, default=96)
    p.add_argument("--clients", type=int, default=32, help="saturated: closed-loop clients")
    p.add_argument("--saturated-seqs", type=int, default=16, help="saturated: max_num_seqs (below --clients)")
    p.add_argument("--saturated-n", type=int, default=96)
    p.add_argument("--saturated-tokens", type=int, default=24)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="EngineConfig override (repeatable)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.background, args.bursts, args.poisson_n, args.saturated_n = 1, 8, 2, 16, 32
        args.out_tokens, args.clients, args.saturated_seqs = 24, 12, 6
    return args


def literal(text: str) -> int | float | bool | str:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def engine_config(args, mode: str, scenario: str) -> EngineConfig:
    # --set values, by name: typed as each EngineConfig field is only when EngineConfig checks them
    cfg: dict[str, Any] = {key: literal(value) for key, value in (item.split("=", 1) for item in args.set)}
    if scenario == "saturated":
        cfg["max_num_seqs"] = args.saturated_seqs
    return EngineConfig(**cfg, batching_window=BatchingWindow(mode), batching_window_ms=args.window_ms)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(None, "float32", progress=False)
    scenarios = args.only or list(SCENARIOS)
    results: dict = {s: {m: [] for m in MODES} for s in scenarios}
    ratios: dict = {s: {m: [] for m in MODES if m != "flush"} for s in scenarios}
    shares: list[float] = []
    for rnd in range(args.rounds):
        for scenario in scenarios:
            configs = {mode: engine_config(args, mode, scenario) for mode in MODES}
            got, share = replay_modes(
                loaded,
                configs,
                lambda scenario=scenario, rnd=rnd: SCENARIOS[scenario](loaded.tokenizer, args, seed=rnd + 1),
                args.cost,
            )
            shares.append(share)
            for mode in MODES:
                r = got[mode]
                r["cpu_share"] = share
                log(
                    f"round {rnd + 1} {scenario:9} {mode:8} "
                    f"TTFT p50/p95 {r['ttft_p50_ms']:7.0f}/{r['ttft_p95_ms']:7.0f} ms  "
                    f"ITL p50/p95 {r['itl_p50_ms']:6.0f}/{r['itl_p95_ms']:6.0f} ms  {r['tok_s']:6.1f} tok/s  "
                    f"util {r['utilization']:.2f}  held {r['held_steps']:4d}/{r['steps']:4d}  cpu {share:.2f}"
                )
                results[scenario][mode].append(r)
            for mode in ratios[scenario]:
                ratios[scenario][mode].append(
                    {
                        k: got[mode][k] / got["flush"][k] if got["flush"][k] else float("nan")
                        for k in ("ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "itl_p95_ms", "tok_s")
                    }
                )
    summary: dict = {}
    log(f"\nmedian over {args.rounds} round(s); window {args.window_ms:g} ms; ratios are mode / flush within a round")
    log(
        f"{'scenario':10}{'mode':9}{'TTFT p50':>10}{'TTFT p95':>10}{'ITL p50':>9}{'ITL p95':>9}{'tok/s':>8}{'util':>7}"
        f"  {'ratio TTFT p50/p95':>19}{'ratio ITL p50/p95':>19}{'ratio tok/s':>12}"
    )
    for scenario in scenarios:
        summary[scenario] = {}
        for mode in MODES:
            med = {k: statistics.median(r[k] for r in results[scenario][mode]) for k in results[scenario][mode][0]}
            rat = (
                {k: statistics.median(r[k] for r in ratios[scenario][mode]) for k in ratios[scenario][mode][0]}
                if mode != "flush"
                else {}
            )
            summary[scenario][mode] = {"median": med, "ratio_vs_flush": rat, "runs": results[scenario][mode]}
            rtxt = (
                (
                    f"  {rat['ttft_p50_ms']:9.2f}/{rat['ttft_p95_ms']:<9.2f}"
                    f"{rat['itl_p50_ms']:9.2f}/{rat['itl_p95_ms']:<9.2f}"
                    f"{rat['tok_s']:12.2f}"
                )
                if rat
                else ""
            )
            log(
                f"{scenario:10}{mode:9}{med['ttft_p50_ms']:10.0f}{med['ttft_p95_ms']:10.0f}{med['itl_p50_ms']:9.0f}"
                f"{med['itl_p95_ms']:9.0f}{med['tok_s']:8.1f}{med['utilization']:7.2f}{rtxt}"
            )
    params = {k: v for k, v in vars(args).items() if k not in ("only",)}
    print(
        json.dumps(
            {
                "bench": "batching_window",
                "params": params,
                "scenarios": summary,
                "engine_config": dataclasses.asdict(engine_config(args, "flush", "poisson")),
            }
        )
    )


if __name__ == "__main__":
    main()
