"""Scheduler behaviour on a real (tiny random) model: preemption, priority, fairness, abort,
prefix-cache skips, tenant isolation, chunked prefill and the per-step limits.

Each engine's `scheduler.schedule` is wrapped to record every step's decisions; the tests read
those records and the engine's public stats. A model-free simulation at the end drives the real
Scheduler over random workloads with a shadow KV cache (see `simulate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.engine.kv_manager import KVCacheManager
from sluice.engine.policy import AdmissionPolicy, SchedulingPolicy
from sluice.engine.request import Request
from sluice.engine.scheduler import Scheduler, SchedulerOutput
from sluice.types import FinishReason, GenerationRequest, SamplingParams

GREEDY: dict[str, Any] = dict(temperature=0.0, ignore_eos=True)  # SamplingParams' fields


@dataclass
class Recorder:
    steps: list[SchedulerOutput] = field(default_factory=list)


def engine_with_recorder(model, **cfg) -> tuple[LLMEngine, Recorder]:
    engine = LLMEngine(model, EngineConfig(block_size=4, **cfg))
    rec = Recorder()
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        rec.steps.append(out)
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return engine, rec


def req(
    rid: str, n: int, max_tokens: int = 12, priority: int = 0, tenant: str = "", start: int = 3
) -> GenerationRequest:
    prompt = [(start + 5 * i + len(rid)) % 200 + 3 for i in range(n)]
    return GenerationRequest(
        rid, prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), priority=priority, tenant=tenant
    )


def alone(model, r: GenerationRequest) -> list[int]:
    engine = LLMEngine(model, EngineConfig(block_size=4, num_kv_blocks=256))
    return engine.generate([r])[r.request_id].token_ids


def run(engine: LLMEngine, max_steps: int = 2000) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {rid: [] for rid in engine.requests}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return tokens
        for ev in engine.step():
            tokens.setdefault(ev.request_id, []).extend(ev.token_ids)
    raise AssertionError("engine did not finish")


def test_tiny_pool_forces_preemption_and_outputs_do_not_change(tiny_llama):
    reqs = [req(f"p{i}", 10 + i, max_tokens=30) for i in range(6)]
    engine, rec = engine_with_recorder(tiny_llama, num_kv_blocks=30, max_num_batched_tokens=64)
    for r in reqs:
        engine.add_request(r)
    out = run(engine)
    assert engine.stats().num_preemptions > 0
    for r in reqs:
        assert out[r.request_id] == alone(tiny_llama, r), r.request_id
    for step in rec.steps:  # nothing admitted in a step that preempted
        if step.preempted:
            assert not step.admitted
    assert engine.stats().kv_blocks_used == 0


def test_high_priority_arrival_preempts_a_low_priority_runner(tiny_llama) -> None:
    engine, rec = engine_with_recorder(
        tiny_llama, num_kv_blocks=24, max_num_batched_tokens=64, scheduling_policy="priority"
    )
    low = [req(f"low{i}", 20, max_tokens=40, priority=5, start=37 * i) for i in range(3)]  # no shared prefix
    for r in low:
        engine.add_request(r)
    for _ in range(3):
        engine.step()
    assert len(engine.scheduler.running) == 3
    later_low = req("low-late", 8, max_tokens=4, priority=5, start=170)
    engine.add_request(later_low)
    high = req("high", 30, max_tokens=8, priority=0, start=150)
    engine.add_request(high)
    first_token: dict[str, int] = {}
    step_no = 0
    while engine.has_unfinished():
        step_no += 1
        for ev in engine.step():
            first_token.setdefault(ev.request_id, step_no)
    preempted = [r.request_id for s in rec.steps for r in s.preempted]
    assert preempted and set(preempted) <= {r.request_id for r in low}
    assert first_token["high"] <= first_token["low-late"]  # the urgent arrival is not queued behind

    def admitted_at(rid: str, after: int = 0) -> tuple[int, int]:
        return next(
            (i, [r.request_id for r in s.admitted].index(rid))
            for i, s in enumerate(rec.steps)
            if i >= after and rid in [r.request_id for r in s.admitted]
        )

    # the preempted request keeps its place in line: it resumes before the later arrival of its band
    victim = preempted[0]
    preempted_at = next(i for i, s in enumerate(rec.steps) if victim in [r.request_id for r in s.preempted])
    assert admitted_at(victim, preempted_at + 1) < admitted_at("low-late")


def test_fcfs_does_not_starve_the_oldest(tiny_llama):
    engine, _ = engine_with_recorder(tiny_llama, num_kv_blocks=40, max_num_batched_tokens=32, max_num_seqs=3)
    oldest = req("oldest", 40, max_tokens=10)
    engine.add_request(oldest)
    finished_at = None
    for step in range(400):
        if step % 2 == 0 and step < 300:  # a steady stream of short newcomers
            engine.add_request(req(f"n{step}", 6, max_tokens=3))
        for ev in engine.step():
            if ev.request_id == "oldest" and ev.finished:
                finished_at = step
        if finished_at is not None:
            break
    assert finished_at is not None and finished_at < 60


def test_reserve_admission_never_preempts(tiny_llama):
    engine, rec = engine_with_recorder(
        tiny_llama, num_kv_blocks=30, max_num_batched_tokens=64, admission_policy="reserve"
    )
    reqs = [req(f"r{i}", 10, max_tokens=30) for i in range(6)]
    for r in reqs:
        engine.add_request(r)
    out = run(engine)
    assert engine.stats().num_preemptions == 0 and not any(s.preempted for s in rec.steps)
    assert all(len(out[r.request_id]) == 30 for r in reqs)


def test_abort_frees_every_block_within_one_step(tiny_llama):
    engine, _ = engine_with_recorder(tiny_llama, num_kv_blocks=64)
    engine.add_request(req("keep", 12, max_tokens=20))
    engine.add_request(req("drop", 30, max_tokens=50, start=101))  # no prefix shared with "keep"
    for _ in range(4):
        engine.step()
    held_before = engine.kv.num_held_blocks(engine.requests["drop"])
    assert held_before > 0
    free_before = engine.stats().kv_blocks_free
    event = engine.abort_request("drop")
    assert event is not None and event.finished and event.finish_reason is FinishReason.ABORT
    engine.step()
    assert "drop" not in engine.requests
    assert all(r.request_id != "drop" for r in engine.scheduler.running)
    assert engine.stats().kv_blocks_free >= free_before + held_before - 1  # "keep" may take one more
    assert engine.kv.block_ids(type("R", (), {"request_id": "drop"})()) == []
    run(engine)
    assert engine.stats().kv_blocks_used == 0


def test_cached_system_prompt_skips_its_tokens(tiny_llama):
    system = [(7 * i) % 200 + 3 for i in range(40)]
    first = GenerationRequest("first", system + [11, 12, 13], SamplingParams(max_tokens=8, **GREEDY))
    second = GenerationRequest("second", system + [21, 22, 23, 24], SamplingParams(max_tokens=8, **GREEDY))
    engine, rec = engine_with_recorder(tiny_llama, num_kv_blocks=128)
    engine.generate([first])
    engine.add_request(second)
    first_events = engine.step()
    admitted = rec.steps[-1].admitted[0]
    assert admitted.request_id == "second"
    assert admitted.num_cached_tokens == 40  # 10 full blocks of the shared prefix
    chunk = next(c for c in rec.steps[-1].chunks if c.request.request_id == "second")
    assert chunk.start == 40  # num_computed_tokens jumped past the cached prefix
    out = run(engine)
    out["second"] = [t for ev in first_events for t in ev.token_ids] + out["second"]
    no_cache = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=128, enable_prefix_caching=False))
    reference = no_cache.generate([GenerationRequest("ref", second.prompt_token_ids, second.sampling)])["ref"].token_ids
    assert out["second"] == reference  # the cache hit changes nothing in the output


@pytest.mark.parametrize("share", [False, True])
def test_tenants_share_blocks_only_when_configured(tiny_llama, share):
    prompt = [(3 * i) % 200 + 3 for i in range(33)]
    engine = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=128, share_prefix_across_tenants=share))
    a = engine.generate([GenerationRequest("a", prompt, SamplingParams(max_tokens=2, **GREEDY), tenant="acme")])["a"]
    b = engine.generate([GenerationRequest("b", prompt, SamplingParams(max_tokens=2, **GREEDY), tenant="globex")])["b"]
    a2 = engine.generate([GenerationRequest("a2", prompt, SamplingParams(max_tokens=2, **GREEDY), tenant="acme")])["a2"]
    assert a.usage.cached_tokens == 0
    assert b.usage.cached_tokens == (32 if share else 0)
    assert a2.usage.cached_tokens == 32  # the same tenant always hits its own cache


def test_chunked_prefill_and_step_limits(tiny_llama):
    budget, seats = 16, 3
    engine, rec = engine_with_recorder(tiny_llama, num_kv_blocks=256, max_num_batched_tokens=budget, max_num_seqs=seats)
    long = req("long", 70, max_tokens=5)
    engine.add_request(long)
    for i in range(5):
        engine.add_request(req(f"s{i}", 5, max_tokens=6))
    out = run(engine)
    assert out["long"] == alone(tiny_llama, long)  # a prompt longer than the budget, alone or not
    chunks_of_long = [c for s in rec.steps for c in s.chunks if c.request.request_id == "long" and c.start < 70]
    assert len(chunks_of_long) >= 70 // budget  # the prompt went through in several chunks
    for step in rec.steps:
        assert step.num_batched_tokens <= budget
        assert len(step.chunks) <= seats


def test_single_prompt_longer_than_the_budget(tiny_llama):
    """A lone prompt over the step budget: steps that sample nothing still run (regression)."""
    engine = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=256, max_num_batched_tokens=16))
    r = req("solo", 50, max_tokens=4)
    assert engine.generate([r])["solo"].token_ids == alone(tiny_llama, r)


def test_kv_waste_counts_unfilled_table_tails(tiny_llama):
    engine = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=256))
    shared = [9, 8, 7, 6, 5, 4, 3, 2]  # two full shared blocks: sharing must not hide the tails
    for i in range(5):
        engine.add_request(
            GenerationRequest(f"w{i}", shared + [20 + i] * (i + 1), SamplingParams(max_tokens=30, **GREEDY))
        )
    for _ in range(3):
        engine.step()
    s = engine.stats()
    tables = [engine.kv.num_held_blocks(r) * 4 for r in engine.scheduler.running]
    live = [r.num_computed_tokens for r in engine.scheduler.running]
    assert s.kv_table_slots == sum(tables) and s.kv_live_tokens == sum(live)
    assert s.kv_waste == (sum(tables) - sum(live)) / sum(tables)
    assert all(0 <= t - n < 4 for t, n in zip(tables, live))  # under one block per request


# =================================================================================================
# Model-free scheduler simulation (hypothesis). The Scheduler and KVCacheManager are driven the
# way LLMEngine drives them, with the forward pass replaced by a shadow KV cache: every slot a
# chunk computes records the token prefix whose K/V it would hold. Before a chunk "attends", every
# slot of its context must hold exactly its own prefix — so a prefix hit on a block that was never
# computed, a block handed to two owners, or a table pointing at a stale block fails the test.
# =================================================================================================


@dataclass
class SimRequest:
    arrive_at: int  # simulation step at which it is added
    prompt: list[int]
    max_tokens: int
    priority: int
    tenant: str
    abort_at: int | None  # step at which it is aborted (if still live), or never


def next_token(prefix: list[int]) -> int:
    """The 'model': a deterministic function of the whole prefix, like greedy decoding."""
    return (sum((i + 1) * t for i, t in enumerate(prefix)) % 7) + 1


def _arrive(step: int, reqs: list[SimRequest], sched: Scheduler, live: dict[str, Request]) -> None:
    """Add the requests that arrive at `step` and abort those whose abort step it is."""
    for i, r in enumerate(reqs):
        if r.arrive_at == step:
            g = GenerationRequest(
                f"r{i}", r.prompt, SamplingParams(max_tokens=r.max_tokens), priority=r.priority, tenant=r.tenant
            )
            req = Request.from_generation_request(g, seed=0)
            req.arrival_time = float(step)  # arrival order = simulation order
            live[req.request_id] = req
            sched.add(req)
        if r.abort_at == step and f"r{i}" in live:
            sched.finish(live.pop(f"r{i}"))  # abort: blocks back before the next schedule()


def _check_limits(cfg: EngineConfig, sched: Scheduler, out: SchedulerOutput, step: int) -> None:
    """The per-step limits of one schedule() and its progress."""
    assert out.num_batched_tokens <= cfg.max_num_batched_tokens
    assert len(out.chunks) <= cfg.max_num_seqs and len(sched.running) <= cfg.max_num_seqs
    assert all(c.num_tokens >= 1 for c in out.chunks)
    if out.preempted:
        assert not out.admitted, "a step that preempted admitted new requests"
    if cfg.admission_policy == "reserve" and cfg.scheduling_policy == "fcfs":
        assert not out.preempted, "reserve admission preempted"
    if sched.has_work():
        # progress: something runs unless the step only preempted (it admits next step)
        assert out.chunks or out.preempted, f"step {step}: work waiting but nothing scheduled"
    ids = [c.request.request_id for c in out.chunks]
    assert len(ids) == len(set(ids))


def _forward(out: SchedulerOutput, shadow: dict[int, tuple[int, ...]], bs: int) -> None:
    """The "forward": write this step's K/V, then check what every chunk attends to."""
    for c in out.chunks:
        toks = c.request.all_token_ids
        assert len(c.block_ids) * bs >= c.end and 0 not in c.block_ids
        for p in range(c.start, c.end):
            shadow[c.block_ids[p // bs] * bs + p % bs] = tuple(toks[: p + 1])
    for c in out.chunks:
        toks = c.request.all_token_ids
        for p in range(c.end):
            got = shadow.get(c.block_ids[p // bs] * bs + p % bs)
            assert got == tuple(toks[: p + 1]), f"{c.request.request_id} reads wrong K/V at position {p}"


def _sample_and_finish(
    out: SchedulerOutput,
    sched: Scheduler,
    live: dict[str, Request],
    outputs: dict[str, list[int]],
    max_model_len: int,
) -> None:
    """Sample each sampling chunk's next token and finish the requests done, as LLMEngine does."""
    for c in out.chunks:
        req = c.request
        req.num_computed_tokens = c.end
        if not c.samples:
            continue
        req.all_token_ids.append(next_token(req.all_token_ids))
        if req.num_output_tokens >= req.sampling.max_tokens or req.num_tokens >= max_model_len:
            outputs[req.request_id] = req.output_token_ids
            live.pop(req.request_id)
            sched.finish(req)


def simulate(
    cfg: EngineConfig, num_blocks: int, reqs: list[SimRequest], fail_at: int | None = None
) -> dict[str, list[int]]:
    """Run `reqs` through a real Scheduler with a shadow KV; assert the per-step invariants.

    Returns each finished request's output tokens. `fail_at`: a step whose 'forward' raises, so
    its requests finish with an error and none of its K/V is written (as LLMEngine.step does).
    """
    kv = KVCacheManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching, cfg.share_prefix_across_tenants)
    max_model_len = (num_blocks - 1) * cfg.block_size
    sched = Scheduler(cfg, kv, max_model_len)
    shadow: dict[int, tuple[int, ...]] = {}  # KV slot -> the token prefix it was computed for
    live: dict[str, Request] = {}
    outputs: dict[str, list[int]] = {}
    last_arrival = max(r.arrive_at for r in reqs)
    # Generous but finite: a hang (a request that can never be admitted) fails here.
    max_steps = last_arrival + 50 + 4 * sum(len(r.prompt) + r.max_tokens for r in reqs)
    for step in range(max_steps):
        _arrive(step, reqs, sched, live)
        if step > last_arrival and not sched.has_work():
            break
        out = sched.schedule()
        _check_limits(cfg, sched, out, step)
        if step == fail_at:  # the forward raised: nothing was computed; the step's requests fail
            for c in out.chunks:
                live.pop(c.request.request_id)
                sched.finish(c.request)
            continue
        _forward(out, shadow, cfg.block_size)
        _sample_and_finish(out, sched, live, outputs, max_model_len)
        # -- block accounting after every step ----------------------------------------------
        held = [b for t in kv.tables.values() for b in t]
        assert set(kv.tables) <= {r.request_id for r in sched.running}  # waiting/preempted hold nothing
        assert len({b.block_id for b in held}) + kv.num_free_blocks == kv.num_usable_blocks
    else:
        raise AssertionError(f"not finished after {max_steps} steps: {len(live)} live")
    assert not live and kv.num_free_blocks == kv.num_usable_blocks  # nothing leaked
    return outputs


def solo_output(r: SimRequest, max_model_len: int) -> list[int]:
    toks = list(r.prompt)
    while len(toks) - len(r.prompt) < r.max_tokens and len(toks) < max_model_len:
        toks.append(next_token(toks))
    return toks[len(r.prompt) :]


HEADS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 5, 6, 7, 8, 13, 13, 13], [20, 21, 22, 23, 24, 25]]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[EngineConfig, int, list[SimRequest], int | None]:
    block_size = draw(st.sampled_from([2, 4]))
    num_blocks = draw(st.integers(6, 40))
    cfg = EngineConfig(
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(1, 24)),
        long_prefill_threshold=draw(st.sampled_from([0, 0, 3, 8])),
        scheduling_policy=draw(st.sampled_from([SchedulingPolicy.FCFS, SchedulingPolicy.PRIORITY])),
        admission_policy=draw(
            st.sampled_from([AdmissionPolicy.OPTIMISTIC, AdmissionPolicy.OPTIMISTIC, AdmissionPolicy.RESERVE])
        ),
        watermark=draw(st.sampled_from([0.0, 0.01, 0.1, 0.3])),
        enable_prefix_caching=draw(st.booleans()),
        share_prefix_across_tenants=draw(st.booleans()),
    )
    max_model_len = (num_blocks - 1) * block_size
    reqs = []
    for _ in range(draw(st.integers(1, 7))):
        head = draw(st.sampled_from(HEADS + [[]]))
        prompt = (head + draw(st.lists(st.integers(1, 30), min_size=1, max_size=30)))[: max_model_len - 1]
        reqs.append(
            SimRequest(
                arrive_at=draw(st.integers(0, 8)),
                prompt=prompt,
                max_tokens=draw(st.integers(1, 16)),
                priority=draw(st.integers(0, 2)),
                tenant=draw(st.sampled_from(["a", "b"])),
                abort_at=draw(st.one_of(st.none(), st.integers(0, 30))),
            )
        )
    fail_at = draw(st.one_of(st.none(), st.integers(0, 20)))
    return cfg, num_blocks, reqs, fail_at


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_scheduler_simulation_invariants(scenario):
    """Random workloads: the KV each chunk reads is its own, the limits hold, nothing hangs or
    leaks, and every request that ran to the end produced exactly what it produces alone."""
    cfg, num_blocks, reqs, fail_at = scenario
    outputs = simulate(cfg, num_blocks, reqs, fail_at)
    max_model_len = (num_blocks - 1) * cfg.block_size
    for rid, toks in outputs.items():
        assert toks == solo_output(reqs[int(rid[1:])], max_model_len), rid


def test_a_prompt_that_only_fits_an_empty_pool_is_admitted(tiny_llama):
    """Regression: the optimistic watermark was demanded even with nothing running, so a prompt
    within the context window but within the watermark of the whole pool waited forever."""
    engine = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=11, watermark=0.2))  # 10 usable, 2 kept
    assert engine.max_model_len == 40
    r = req("big", 38, max_tokens=2)  # 10 blocks: the whole pool
    engine.add_request(r)
    out = run(engine, max_steps=20)
    assert len(out["big"]) == 2
