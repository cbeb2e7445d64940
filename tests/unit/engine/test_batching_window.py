"""The dynamic batching window (flush / hold / adaptive) and batch utilization.

Every rule of the gate is checked on its own, then on a real engine (tiny random model) whose
scheduler reads an injected clock: time only moves when a test moves it, so nothing here depends
on how fast the machine is. Last, the async front under hold with an endless window: a held
request is still served (the window never holds while nothing decodes).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.batching_window import BatchingWindow, WindowGate, WindowView
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.engine.request import RequestStatus
from sluice.engine.stats import EngineStats
from sluice.observability.metrics import ServingMetrics
from sluice.types import GenerationRequest, SamplingParams
from tests.clock import FakeClock

GREEDY: dict[str, Any] = dict(temperature=0.0, ignore_eos=True)  # SamplingParams' fields
WINDOW_MS = 62.5  # = 4/64 s
TICK = 1 / 64
# a step boundary with 8 decodes running and one 10-token newcomer that has waited 10 ms; the
# next arrival is due in 5 ms
HELD = WindowView(
    oldest_wait_s=0.010,
    num_new=1,
    new_tokens=10,
    num_restarting=0,
    num_decodes=8,
    step_has_prefill=False,
    room_tokens=100,
    free_seats=20,
    next_arrival_s=0.005,
)


def gate(mode: str, window_ms: float = 50.0, ratio: float = 0.25) -> WindowGate:
    return WindowGate(BatchingWindow(mode), window_ms, ratio)


# -- the gate's rules -------------------------------------------------------------------------------
def test_flush_always_admits_and_hold_holds_a_lone_newcomer():
    assert gate("flush").opens(HELD)
    assert not gate("hold").opens(HELD)
    assert not gate("adaptive").opens(HELD)


@pytest.mark.parametrize(
    "change",
    [
        dict(num_decodes=0),  # nothing decodes: no stream to protect
        dict(num_new=0, new_tokens=0),  # nothing new to hold
        dict(num_restarting=1),  # a preempted request prefills this step anyway
        dict(step_has_prefill=True),  # a running prompt continues its chunk this step
        dict(new_tokens=100),  # the newcomers fill the token budget left
        dict(num_new=3, free_seats=3),  # ... or the free seats
        dict(oldest_wait_s=0.050),  # the cap: nothing waits longer than the window
    ],
)
def test_each_rule_opens_hold_and_adaptive(change):
    view = dataclasses.replace(HELD, **change)
    assert gate("hold").opens(view) and gate("adaptive").opens(view)


def test_adaptive_releases_once_enough_newcomers_per_decode_wait():
    g = gate("adaptive", ratio=0.25)
    assert not g.opens(dataclasses.replace(HELD, num_new=1, num_decodes=8))
    assert g.opens(dataclasses.replace(HELD, num_new=2, num_decodes=8))  # 2 >= 0.25 x 8
    assert g.opens(dataclasses.replace(HELD, num_new=1, num_decodes=4))  # light load: one is enough
    assert not gate("hold").opens(dataclasses.replace(HELD, num_new=2, num_decodes=8))  # hold waits on


def test_adaptive_does_not_hold_when_no_arrival_is_expected_before_the_cap():
    g = gate("adaptive", window_ms=50.0)
    assert not g.opens(dataclasses.replace(HELD, oldest_wait_s=0.010, next_arrival_s=0.040))  # due at 50 ms
    assert g.opens(dataclasses.replace(HELD, oldest_wait_s=0.010, next_arrival_s=0.041))  # due after the cap
    assert g.opens(dataclasses.replace(HELD, next_arrival_s=float("inf")))  # no history to go by
    assert not gate("hold").opens(dataclasses.replace(HELD, next_arrival_s=float("inf")))  # hold holds anyway


def test_config_takes_the_flag_string_and_rejects_unknown_modes():
    assert EngineConfig(batching_window="adaptive").batching_window is BatchingWindow.ADAPTIVE
    with pytest.raises(ValueError, match="batching_window must be one of flush, hold, adaptive"):
        EngineConfig(batching_window="sometimes")


# -- on a real engine with an injected clock --------------------------------------------------------
def new(rid: str, n: int = 6, max_tokens: int = 40) -> GenerationRequest:
    """A prompt of n tokens that shares no prefix block with another request id's."""
    k = sum(map(ord, rid))
    return GenerationRequest(
        rid, [(7 * i + 31 * k) % 200 + 3 for i in range(n)], SamplingParams(max_tokens=max_tokens, **GREEDY)
    )


def decoding_engine(tiny_llama, mode: str, decoders: int = 8, **cfg) -> tuple[LLMEngine, FakeClock]:
    clock = FakeClock()
    config = EngineConfig(
        block_size=4, num_kv_blocks=512, batching_window=BatchingWindow(mode), batching_window_ms=WINDOW_MS, **cfg
    )
    engine = LLMEngine(tiny_llama, config, clock=clock)
    for i in range(decoders):
        engine.add_request(new(f"d{i}", max_tokens=200))
    for _ in range(10):  # prefill them all (the clock stands still: holds end by filling the step)
        if all(r.num_output_tokens > 0 for r in engine.requests.values()):
            break
        engine.step()
    assert len(engine.scheduler.running) == decoders and not engine.scheduler.waiting
    assert all(r.num_output_tokens > 0 for r in engine.requests.values())
    return engine, clock


def status(engine: LLMEngine, rid: str) -> RequestStatus:
    return engine.requests[rid].status


def test_flush_admits_an_arrival_in_the_next_step(tiny_llama):
    engine, _ = decoding_engine(tiny_llama, "flush")
    engine.add_request(new("late"))
    engine.step()
    assert status(engine, "late") is RequestStatus.RUNNING
    assert engine.stats().num_held_steps == 0


def test_hold_keeps_an_arrival_until_the_window_passes(tiny_llama):
    engine, clock = decoding_engine(tiny_llama, "hold")
    engine.add_request(new("late"))
    for _ in range(5):  # the clock stands still: the decodes go on, the newcomer waits
        engine.step()
        assert status(engine, "late") is RequestStatus.WAITING
    assert engine.stats().num_held_steps == 5
    clock.t += 3 * TICK
    engine.step()
    assert status(engine, "late") is RequestStatus.WAITING
    clock.t += TICK  # the whole window after its arrival
    engine.step()
    assert status(engine, "late") is RequestStatus.RUNNING


def test_hold_gathers_arrivals_into_one_prefill_step(tiny_llama, monkeypatch) -> None:
    engine, clock = decoding_engine(tiny_llama, "hold")
    schedule = engine.scheduler.schedule
    admitted: list[list[str]] = []

    def recording():
        out = schedule()
        admitted.append([r.request_id for r in out.admitted])
        return out

    monkeypatch.setattr(engine.scheduler, "schedule", recording)
    for i in range(3):
        engine.add_request(new(f"n{i}"))
        clock.t += TICK
        engine.step()
    clock.t += TICK  # the first arrived a whole window ago
    engine.step()
    assert [a for a in admitted if a] == [["n0", "n1", "n2"]]  # one step prefilled all three


def test_hold_admits_at_once_when_the_arrival_fills_the_free_seats(tiny_llama):
    engine, _ = decoding_engine(tiny_llama, "hold", max_num_seqs=9)
    engine.add_request(new("last-seat"))
    engine.step()
    assert status(engine, "last-seat") is RequestStatus.RUNNING


def test_adaptive_waits_for_a_batch_worth_the_interruption(tiny_llama):
    # 16 arrivals just now (the decoders): more are due well inside the window
    engine, _ = decoding_engine(tiny_llama, "adaptive", decoders=16, batching_window_ratio=0.25)
    for rid in "abc":
        engine.add_request(new(rid))
        engine.step()
        assert status(engine, rid) is RequestStatus.WAITING  # fewer than 0.25 x 16 newcomers
    engine.add_request(new("d"))
    engine.step()
    assert all(status(engine, rid) is RequestStatus.RUNNING for rid in "abcd")


def test_adaptive_admits_at_once_when_arrivals_are_sparse(tiny_llama):
    engine, clock = decoding_engine(tiny_llama, "adaptive")
    clock.t += 40 * TICK  # the decoders' arrivals are ten windows old: they no longer set the rate
    for i in range(3):  # then arrivals four windows apart: holding would gather nobody
        clock.t += 16 * TICK
        engine.add_request(new(f"sparse{i}"))
        engine.step()
        assert status(engine, f"sparse{i}") is RequestStatus.RUNNING
    assert engine.stats().num_held_steps == 0


def test_adaptive_holds_while_arrivals_come_faster_than_the_window(tiny_llama):
    engine, clock = decoding_engine(tiny_llama, "adaptive", decoders=16)
    engine.add_request(new("a"))
    clock.t += TICK
    engine.step()  # 17 arrivals in the last 1/64 s: the next is due inside the window
    assert status(engine, "a") is RequestStatus.WAITING
    clock.t += 3 * TICK  # the cap
    engine.step()
    assert status(engine, "a") is RequestStatus.RUNNING


def test_adaptive_at_light_load_behaves_like_flush(tiny_llama):
    engine, _ = decoding_engine(tiny_llama, "adaptive", decoders=3)
    engine.add_request(new("late"))
    engine.step()
    assert status(engine, "late") is RequestStatus.RUNNING


def test_a_continuing_prompt_chunk_lets_newcomers_ride_along(tiny_llama):
    engine, clock = decoding_engine(tiny_llama, "hold", max_num_batched_tokens=24, long_prefill_threshold=8)
    engine.add_request(new("long", n=40))
    clock.t += 4 * TICK
    engine.step()  # admitted after the window; its prompt takes 8 tokens a step
    assert status(engine, "long") is RequestStatus.RUNNING
    assert engine.requests["long"].num_computed_tokens < 40
    engine.add_request(new("rider"))
    engine.step()
    assert status(engine, "rider") is RequestStatus.RUNNING


def test_window_results_are_the_same_tokens(tiny_llama) -> None:
    """Holding changes when a request starts, never what it generates."""
    outputs = {}
    for mode in ("flush", "hold", "adaptive"):
        engine, clock = decoding_engine(tiny_llama, mode, decoders=6)
        tokens: dict[str, list[int]] = {}
        for i in range(4):
            engine.add_request(new(f"x{i}", n=5 + i, max_tokens=12))
        while engine.has_unfinished():
            clock.t += TICK
            for ev in engine.step():
                tokens.setdefault(ev.request_id, []).extend(ev.token_ids)
        outputs[mode] = tokens
    assert outputs["flush"] == outputs["hold"] == outputs["adaptive"]


# -- batch utilization ------------------------------------------------------------------------------
def test_utilization_is_the_fullest_limit_of_each_step(tiny_llama):
    engine = LLMEngine(
        tiny_llama, EngineConfig(block_size=4, num_kv_blocks=512, max_num_seqs=4, max_num_batched_tokens=32)
    )
    for i in range(4):
        engine.add_request(new(f"u{i}", n=8, max_tokens=3))
    engine.step()  # 4 prompts x 8 tokens = the whole budget, and every seat
    s = engine.stats()
    assert s.last_step_tokens == 32 and s.last_step_utilization == 1.0
    engine.step()  # 4 decodes: 4/32 of the tokens but all 4 seats
    assert engine.stats().last_step_utilization == 1.0
    engine.step()
    engine.add_request(new("alone", n=8, max_tokens=2))
    engine.step()  # one request of 4 seats, 8 of 32 tokens; KV far from full
    s = engine.stats()
    assert s.last_step_seqs == 1 and s.last_step_utilization == pytest.approx(0.25)
    assert s.batch_utilization == pytest.approx(s.batch_utilization_sum / s.num_steps)
    assert s.batch_utilization == pytest.approx((1.0 + 1.0 + 1.0 + 0.25) / 4)


def test_utilization_and_window_stats_reach_prometheus(tiny_llama):
    engine, _ = decoding_engine(tiny_llama, "hold")
    engine.add_request(new("late"))
    engine.step()
    metrics = ServingMetrics()
    metrics.observe_engines({("m", "m/v1"): engine.stats()})
    text = metrics.render().decode()
    s = engine.stats()
    labels = '{model="m",version="m/v1"}'
    assert f"sluice_engine_batch_utilization_ratio{labels} {s.last_step_utilization}" in text
    assert f"sluice_engine_batch_utilization_sum{labels} {s.batch_utilization_sum}" in text
    assert f"sluice_engine_held_steps_total{labels} 1.0" in text
    assert f"sluice_engine_kv_resident_bytes{labels} {float(s.kv_resident_bytes)}" in text


def test_stats_defaults_come_from_the_engine_config():
    assert EngineStats().block_size == EngineConfig().block_size


# -- the async front: nothing starves ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["hold", "adaptive"])
def test_a_held_request_is_served_when_the_decodes_end(tiny_llama, mode):
    """An endless window still admits once nothing decodes: holding never deadlocks."""
    config = EngineConfig(block_size=4, num_kv_blocks=256, batching_window=mode, batching_window_ms=1e9)
    engine = AsyncEngine(LLMEngine(tiny_llama, config)).start()

    async def collect(r: GenerationRequest, started: asyncio.Event | None = None) -> list[int]:
        tokens: list[int] = []
        async for ev in engine.generate(r):
            tokens += ev.token_ids
            if started is not None:
                started.set()
        return tokens

    async def main():
        started = asyncio.Event()
        runner = asyncio.create_task(collect(new("runner", max_tokens=30), started))
        await started.wait()  # it decodes now
        late = await asyncio.wait_for(collect(new("late", max_tokens=5)), timeout=60)
        return await runner, late

    try:
        runner_tokens, late_tokens = asyncio.run(main())
    finally:
        engine.shutdown()
    assert len(runner_tokens) == 30 and len(late_tokens) == 5
