"""What constrained decoding costs the engine (bundled model, engine in-process).

1. Per-step overhead: decode steps of a batch of N rows (8, 32), all constrained vs none, one
   engine per variant stepped in turn (interleaved step by step: the machine is shared and
   noisy; only the ratios within a run mean anything). For the constrained batch the grammar's
   own share of each step is timed directly: mask fill + apply (sampler) and matcher advance
   (engine), so the overhead is reported both as the step-time ratio and as the grammar's CPU share of the step.
   Two grammars: a JSON schema (arrays of bounded strings) and tool_choice auto while the
   model writes free text (the "text that never opens a call" regex, the costlier mask).
2. Compile time of a tool-call grammar (3 tools), cold (new spec) and cached (same spec).
3. Throughput of a mix: M requests, half of them constrained, vs the same M unconstrained
   (two engines stepped alternately).

A readable table goes to stderr; the last stdout line is one JSON object with every figure.
Usage: python bench/serving/grammar_overhead.py [--rows 8 32] [--steps 16] [--rounds 5] [--mix 16] [--mix-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models import sampler
from sluice.models.grammar import bitmask
from sluice.models.grammar.matcher import GrammarMatcher
from sluice.models.loader import load_model
from sluice.models.tools.format import HERMES
from sluice.models.tools.guidance import json_schema_guidance, tool_guidance
from sluice.tool_types import ToolChoice, ToolSpec
from sluice.types import GenerationRequest, GuidedDecoding, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common
from bench.common import log

LONG_JSON = json_schema_guidance(
    {
        "type": "object",
        "properties": {
            "notes": {"type": "array", "items": {"type": "string", "minLength": 4, "maxLength": 40}, "minItems": 40}
        },
        "required": ["notes"],
    }
)
TOOLS = [
    ToolSpec(
        "get_weather",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    ),
    ToolSpec("get_time", {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}),
    ToolSpec(
        "search",
        {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 20}},
            "required": ["query"],
        },
    ),
]
AUTO_TEXT = tool_guidance(TOOLS, ToolChoice(), HERMES)


class GrammarClock:
    """Wall time spent in the grammar: the sampler's mask step and the matchers' advance."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._apply = bitmask.apply_grammars
        self._accept = GrammarMatcher.accept

    def __enter__(self) -> GrammarClock:
        clock, apply, accept = self, self._apply, self._accept

        def timed_apply(*args, **kw):
            t = time.perf_counter()
            apply(*args, **kw)
            clock.seconds += time.perf_counter() - t

        def timed_accept(self_, token):
            t = time.perf_counter()
            ok = accept(self_, token)
            clock.seconds += time.perf_counter() - t
            return ok

        sampler.apply_grammars = timed_apply
        GrammarMatcher.accept = timed_accept  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        sampler.apply_grammars = self._apply
        GrammarMatcher.accept = self._accept  # type: ignore[method-assign]


class Meter:
    """Wall time and this process's CPU share over a phase (well under 1.0: the machine was busy)."""

    def __init__(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def cpu_share(self) -> float:
        wall = time.perf_counter() - self.wall0
        return (time.process_time() - self.cpu0) / (wall * torch.get_num_threads()) if wall > 0 else 0.0


def prefilled(loaded, prompt: list[int], rows: int, guided: GuidedDecoding | None, steps: int) -> LLMEngine:
    """An engine of its own holding `rows` requests, each past its prefill."""
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=rows * 16 + 64, max_num_seqs=max(64, rows)))
    params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True, guided=guided)
    for i in range(rows):
        engine.add_request(GenerationRequest(f"r{i}", prompt, params))
    while any(r.num_output_tokens == 0 for r in engine.requests.values()):
        engine.step()
    return engine


def bench_steps(loaded, prompt: list[int], rows_list: list[int], steps: int) -> dict:
    """One engine per variant, stepped in turn (the order rotates): step-by-step interleaving."""
    variants: dict[str, GuidedDecoding | None] = {"none": None, "json_schema": LONG_JSON, "auto_free_text": AUTO_TEXT}
    log(f"== decode step: {steps} steps per variant, variants interleaved step by step")
    figures: dict = {}
    for rows in rows_list:
        engines = {name: prefilled(loaded, prompt, rows, g, steps) for name, g in variants.items()}
        times: dict[str, list[float]] = {name: [] for name in variants}
        shares: dict[str, list[float]] = {name: [] for name in variants}
        meter = Meter()
        for s in range(steps):
            names = list(variants)
            for name in names[s % len(names) :] + names[: s % len(names)]:
                with GrammarClock() as clock:
                    t = time.perf_counter()
                    events = engines[name].step()
                    dt = time.perf_counter() - t
                assert len(events) == rows and not any(e.finished for e in events), "a row ended inside the measurement"
                times[name].append(dt)
                shares[name].append(clock.seconds / dt)
        cpu = meter.cpu_share()
        base = statistics.median(times["none"])
        for name in variants:
            t = statistics.median(times[name])
            share = statistics.median(shares[name])
            figures[f"rows{rows}_{name}"] = {
                "step_ms": t * 1e3,
                "vs_none": t / base,
                "grammar_share": share,
                "cpu_share": cpu,
            }
            log(
                f"  rows {rows:2d}  {name:15s} step {t * 1e3:8.1f} ms  x{t / base:5.3f} of none   "
                f"grammar {share * 100:5.2f} % of the step   cpu share {cpu:.2f}"
            )
    return figures


def bench_compile(engine: LLMEngine, rounds: int) -> dict:
    cold, cached = [], []
    for r in range(rounds):
        tools = [ToolSpec(t.name, {**t.input_schema, "title": f"r{r}"}, t.description) for t in TOOLS]
        spec = tool_guidance(tools, ToolChoice(), HERMES)  # a spec no cache has seen
        assert spec is not None  # tools under tool_choice auto are always guided
        t = time.perf_counter()
        engine.grammars.matcher(spec)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.grammars.matcher(spec)
        cached.append(time.perf_counter() - t)
    figures = {"cold_ms": statistics.median(cold) * 1e3, "cached_us": statistics.median(cached) * 1e6}
    log(f"== compile, tool_choice auto over {len(TOOLS)} tools, median of {rounds}")
    log(f"  cold {figures['cold_ms']:8.2f} ms   cached {figures['cached_us']:8.1f} us")
    return figures


def bench_mix(loaded, prompt: list[int], n: int, tokens: int) -> dict:
    """Two engines, n requests each (all unconstrained / every other one constrained), stepped
    alternately from admission to the last token: tok/s = tokens / the engine's own step time."""
    log(f"== throughput, {n} requests x {tokens} tokens, half constrained (json schema) vs none, stepped alternately")
    kinds: dict[str, Callable[[int], GuidedDecoding | None]] = {
        "none": lambda i: None,
        "half_constrained": lambda i: LONG_JSON if i % 2 else None,
    }
    engines, busy, produced, grammar = {}, {k: 0.0 for k in kinds}, {k: 0 for k in kinds}, {k: 0.0 for k in kinds}
    for name, guided_for in kinds.items():
        engines[name] = engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=n * 16 + 64, max_num_seqs=max(64, n)))
        for i in range(n):
            params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, guided=guided_for(i))
            engine.add_request(GenerationRequest(f"{name}-{i}", prompt, params))
    meter = Meter()
    step = 0
    while any(e.has_unfinished() for e in engines.values()):
        names = list(kinds) if step % 2 == 0 else list(kinds)[::-1]
        for name in names:
            if engines[name].has_unfinished():
                with GrammarClock() as clock:
                    t = time.perf_counter()
                    events = engines[name].step()
                    busy[name] += time.perf_counter() - t
                grammar[name] += clock.seconds
                produced[name] += sum(len(e.token_ids) for e in events)
        step += 1
    cpu = meter.cpu_share()
    base = produced["none"] / busy["none"]
    figures = {}
    for name in kinds:
        tok_s = produced[name] / busy[name]
        figures[name] = {
            "tok_s": tok_s,
            "vs_none": tok_s / base,
            "tokens": produced[name],
            "grammar_share": grammar[name] / busy[name],
            "cpu_share": cpu,
        }
        log(
            f"  {name:16s} {tok_s:8.1f} tok/s  x{tok_s / base:5.3f}   {produced[name]} tokens   "
            f"grammar {grammar[name] / busy[name] * 100:5.2f} % of the time   cpu share {cpu:.2f}"
        )
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="compile rounds (cold and cached)")
    ap.add_argument("--mix", type=int, default=16, help="requests per side of the mix")
    ap.add_argument("--mix-tokens", type=int, default=48)
    args = ap.parse_args()
    loaded = load_model(progress=False)
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=1024, max_num_seqs=64))
    prompt = loaded.tokenizer.encode_chat(
        [{"role": "user", "content": "Write down some notes about the history of Paris."}]
    )
    engine.grammars.matcher(LONG_JSON)  # warm: the tokenizer view is built once per engine
    result = {"threads": torch.get_num_threads(), "compile": bench_compile(engine, args.rounds)}
    result["steps"] = bench_steps(loaded, prompt, args.rows, args.steps)
    result["mix"] = bench_mix(loaded, prompt, args.mix, args.mix_tokens)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
