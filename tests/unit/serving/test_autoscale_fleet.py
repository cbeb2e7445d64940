"""The local autoscaler with real worker processes (the tiny test model), real admission, routing
and serving pipeline, in one process; the policy runs on an injected clock.

One fleet for the module (worker processes are slow to start on a busy machine), driven through
the scenario in order: a burst past 0.7 promotes the warm worker and starts a replacement; load
gone scales down only after the cool-down, with zero failed requests while a worker drains; a
serving worker that dies is replaced from the warm pool. min_serving / max_workers are checked
on every decision the autoscaler takes. Every wait is an event or a bounded, generous poll; no
assertion depends on how fast the machine is. (Hysteresis is a unit test of the policy:
tests/unit/routing/test_scaling_policy.py.)"""

from __future__ import annotations

import os

# before grpc is imported: the fleet forks worker children while its gRPC clients run (as
# `sluice serve` does, cli/serve.py)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import asyncio
import concurrent.futures
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from sluice.config import load_settings
from sluice.gateway.principal import Principal
from sluice.routing.dispatch.worker_pool import Dispatch, WorkerStatus
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.scaling.decision import ScaleReason, ScalingDecision
from sluice.serving.outcomes import Finished
from sluice.serving.output_budget import OutputBudget
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.serving.runtime import ServingRuntime
from tests.clock import FakeClock

KEY = ("m", "v1")
MAX_WORKERS = 3
DOWN_COOLDOWN_S = 120.0
HOLD_S = 2.0  # every request waits this long before its first token: it stays in flight (faults.py)
WAIT_S = 300.0  # bound on any wait (worker starts on a busy 2-core machine)


def fleet_text(tiny: str) -> str:
    # no affinity slack: requests spread by load, so both serving workers hold some
    return f"""
[routing]
load_slack_tokens = 0
[autoscaling]
interval_s = 0.05
up_cooldown_s = 30
down_cooldown_s = {DOWN_COOLDOWN_S}
min_serving = 1
max_workers = {MAX_WORKERS}
[autoscaling.warm_pool]
windows = [{{ start = "00:00", size = 1 }}]

[models.m.versions.v1]
weights = "{tiny}"
traffic = 100
replicas = 1
autoscale = true
fault_injection = "delay_first_token_s={HOLD_S}"
[models.m.versions.v1.engine]
block_size = 16
num_kv_blocks = 64
max_num_seqs = 16
"""


class Scenario:
    """The fleet on an event loop in a thread; the test thread runs coroutines on it."""

    def __init__(self, tmp_path, tiny: str):
        path = tmp_path / "fleet.toml"
        path.write_text(fleet_text(tiny))
        self.settings = load_settings(
            None, safety=False, fleet=str(path), health_check_interval_s=0.2, request_timeout_s=600
        )
        self.clock = FakeClock()
        self.decisions: list[tuple[ScalingDecision, Any]] = []
        self.violations: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fleet = Fleet.build(self.settings, Registry.from_file(path))
        self.fleet.autoscaler.clock = self.clock
        self.fleet.autoscaler.on_decision.append(self._record)
        self.dispatched: list[str] = []
        begin = self.fleet.pool.begin

        def recording_begin(
            worker_id: str, cost_tokens: int, version_key: tuple[str, str] | None = None, adapter: str | None = None
        ) -> Dispatch | None:
            d = begin(worker_id, cost_tokens, version_key, adapter)
            if d is not None:
                self.dispatched.append(worker_id)
            return d

        self.fleet.pool.begin = recording_begin  # type: ignore[method-assign]
        self.run(self.fleet.start())
        self.rt = ServingRuntime(self.settings)
        self.rt.mark_ready(self.fleet, self.fleet.capacity()[0])
        self.pipeline = ServingPipeline(self.rt)

    def _record(self, model: str, version: str, d: ScalingDecision) -> None:
        obs = self.fleet.autoscaler.scalers[(model, version)].observed
        assert obs is not None  # a decision is made on an observation
        self.decisions.append((d, obs))
        if obs.total > MAX_WORKERS:
            self.violations.append(f"{obs.total} workers > max_workers {MAX_WORKERS}: {obs}")
        if d.desired_serving < 1 or d.desired_serving > MAX_WORKERS:
            self.violations.append(f"desired serving {d.desired_serving} outside 1..{MAX_WORKERS}")

    def run(self, coro: Coroutine, timeout: float = WAIT_S) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def go():
            return fn()

        return self.run(go())

    def ids(self, status: WorkerStatus) -> list[str]:
        """On the loop (inside a `wait` check); `by_status` from the test thread."""
        return [w.worker_id for w in self.fleet.pool.workers(*KEY) if w.status is status]

    def by_status(self, status: WorkerStatus) -> list[str]:
        return self.call(lambda: self.ids(status))

    def wait(self, check: Callable[[], Any], what: str, timeout: float = WAIT_S, during: Any = None) -> Any:
        """Poll `check` on the loop; `during`: requests whose failure ends the wait at once."""

        async def go():
            deadline = self.loop.time() + timeout
            while not (value := check()):
                if during is not None and during.done() and during.exception() is not None:
                    raise during.exception()
                assert self.loop.time() < deadline, (
                    f"timed out after {timeout:g} s waiting for {what}: {self.fleet.status()['workers']}"
                )
                await asyncio.sleep(0.02)
            return value

        return self.run(go(), timeout + 30)

    def counts(self) -> dict[str, int]:
        return self.call(
            lambda: {s.value: sum(w.status is s for w in self.fleet.pool.workers(*KEY)) for s in WorkerStatus}
        )

    def send(self, n: int, max_tokens: int) -> concurrent.futures.Future[list[Any]]:
        """n requests at once; a future of their final outcomes."""

        async def one(i: int):
            req = ServingRequest(
                request_id=f"msg_{os.urandom(4).hex()}_{i}",
                route=Route.MESSAGES,
                principal=Principal(),
                model="m",
                conversation=Conversation([Turn(Role.USER, ["hi"])]),
                budget=OutputBudget(max_tokens),
            )
            gen = await self.pipeline.start(req)
            return (await gen.collect()).final

        async def all_of():
            return await asyncio.gather(*(one(i) for i in range(n)))

        return asyncio.run_coroutine_threadsafe(all_of(), self.loop)

    def close(self) -> None:
        try:
            self.run(self.fleet.close(), 120)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, tiny_llama_dir):
    s = Scenario(tmp_path_factory.mktemp("autoscale"), str(tiny_llama_dir))
    try:
        yield s
    finally:
        s.close()


def last_reason(s: Scenario) -> ScaleReason | None:
    return s.decisions[-1][0].reason if s.decisions else None


def test_the_warm_pool_fills_in_the_background(scenario):
    s = scenario
    assert len(s.by_status(WorkerStatus.WARM)) == 1  # replicas = 1 serve from the start
    s.wait(
        lambda: len([w for w in s.fleet.pool.workers(*KEY) if w.status is WorkerStatus.STANDBY]) == 1,
        "a warm-pool worker",
    )
    standby = s.by_status(WorkerStatus.STANDBY)[0]
    assert standby not in s.dispatched  # loaded and warmed up, but no traffic
    status = s.wait(lambda: (st := s.fleet.status()["autoscaling"][0])["warm_pool"] == 1 and st, "the next tick")
    assert status["serving"] == 1 and status["desired_warm_pool"] == 1 and status["actions"]["start"] == 1
    assert s.call(s.fleet.warm_pool_counts) == {("m", "m/v1"): 1}


def test_a_burst_past_the_threshold_promotes_the_warm_worker_and_starts_a_replacement(scenario):
    s = scenario
    (first,) = s.by_status(WorkerStatus.WARM)
    (standby,) = s.by_status(WorkerStatus.STANDBY)
    seen = len(s.decisions)
    burst = s.send(2, max_tokens=380)  # two estimates of ~420 tokens on a ~1000-token worker: ~0.85
    s.wait(
        lambda: any(d.reason is ScaleReason.SCALE_UP for d, _ in s.decisions[seen:]),
        "a scale-up decision",
        during=burst,
    )
    up = next(d for d, _ in s.decisions[seen:] if d.reason is ScaleReason.SCALE_UP)
    assert up.signal > 0.7 and up.desired_serving == 2
    assert up.actions.promote == 1 and up.actions.start == 1  # the warm worker serves, a new one refills
    assert s.call(lambda: s.fleet.pool.get(standby).status) is WorkerStatus.WARM  # promoted by that tick
    # the promoted worker takes the next request (it is the least loaded)
    mark = len(s.dispatched)
    follow = s.send(1, max_tokens=20)
    s.wait(lambda: len(s.dispatched) > mark, "the next request to be dispatched", during=follow)
    assert s.dispatched[mark] == standby, (first, standby, s.dispatched)
    for outcome in burst.result(WAIT_S) + follow.result(WAIT_S):
        assert isinstance(outcome, Finished), outcome
    s.wait(lambda: len(s.ids(WorkerStatus.STANDBY)) == 1, "the replacement to join the warm pool")
    assert s.counts()["warm"] == 2 and not s.violations, s.violations


def test_load_gone_scales_down_only_after_the_cool_down_without_failing_a_request(scenario):
    s = scenario
    assert s.counts()["warm"] == 2
    s.wait(lambda: last_reason(s) is ScaleReason.DOWN_PENDING, "the low signal to be noticed")
    seen = len(s.decisions)
    s.wait(lambda: len(s.decisions) > seen + 20, "more ticks")  # the window has not passed on the policy's clock
    assert all(d.reason is ScaleReason.DOWN_PENDING for d, _ in s.decisions[seen:])
    assert s.counts()["warm"] == 2
    # small requests in flight on both serving workers (signal stays under 0.2), then the window passes
    mark = len(s.dispatched)
    inflight = s.send(6, max_tokens=8)
    s.wait(lambda: len(s.dispatched) >= mark + 6, "the small requests to be dispatched", during=inflight)
    serving = set(s.dispatched[mark:])
    assert len(serving) == 2, s.dispatched[mark:]  # both serving workers hold some
    seen = len(s.decisions)
    s.clock.t += DOWN_COOLDOWN_S + 1
    s.wait(lambda: any(d.reason is ScaleReason.SCALE_DOWN for d, _ in s.decisions[seen:]), "a scale-down")
    down = next(d for d, _ in s.decisions[seen:] if d.reason is ScaleReason.SCALE_DOWN)
    assert down.desired_serving == 1 and down.actions.drain_and_stop == 1  # the pool is full: this one stops
    (draining,) = s.by_status(WorkerStatus.DRAINING)
    assert draining in serving  # it had requests in flight: they finish first
    for outcome in inflight.result(WAIT_S):
        assert isinstance(outcome, Finished), outcome  # zero failed requests
    s.wait(lambda: draining not in s.fleet.handles, "the drained worker to stop")
    assert s.counts()["warm"] == 1 and s.counts()["standby"] == 1
    # at the floor, another window changes nothing
    seen = len(s.decisions)
    s.clock.t += DOWN_COOLDOWN_S + 1
    s.wait(lambda: any(d.reason is ScaleReason.AT_MIN for d, _ in s.decisions[seen:]), "the floor")
    assert s.counts()["warm"] == 1 and not s.violations, s.violations


def test_a_serving_worker_that_dies_is_replaced_from_the_warm_pool(scenario):
    s = scenario
    (victim,) = s.by_status(WorkerStatus.WARM)
    (standby,) = s.by_status(WorkerStatus.STANDBY)
    pid = s.call(lambda: s.fleet.handles[victim].supervisor.worker.pid)
    seen = len(s.decisions)
    os.kill(pid, signal.SIGKILL)
    s.wait(lambda: s.fleet.pool.get(standby).status is WorkerStatus.WARM, "the warm worker to be promoted")
    assert any(d.reason is ScaleReason.REPLACE and d.actions.promote == 1 for d, _ in s.decisions[seen:])
    # the dead one is restarted by its supervisor and rejoins as the warm pool, not as a 2nd server
    s.wait(
        lambda: (w := s.fleet.pool.get(victim)) is not None and w.status is WorkerStatus.STANDBY,
        "the restarted worker to rejoin the warm pool",
    )
    assert s.counts()["warm"] == 1
    outcome = s.send(1, max_tokens=4).result(WAIT_S)[0]
    assert isinstance(outcome, Finished), outcome
    assert not s.violations, s.violations
