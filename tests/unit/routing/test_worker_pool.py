"""The worker pool: who takes requests, what load the picker sees, what a drain waits for."""

from __future__ import annotations

import asyncio

import pytest

from sluice.routing.dispatch.circuit_breaker import BreakerConfig, BreakerState, Outcome
from sluice.routing.dispatch.worker_pool import WorkerPool, WorkerStatus
from tests.clock import FakeClock


def test_only_warm_closed_workers_under_their_bound_take_requests():
    pool = WorkerPool(BreakerConfig(consecutive_failures=1), FakeClock(0.0))
    pool.add("a", "m", "v1", "h:1", status=WorkerStatus.WARM, max_outstanding_tokens=1000)
    pool.add("b", "m", "v1", "h:2")  # STARTING
    pool.add("c", "m", "v2", "h:3", status=WorkerStatus.WARM)
    assert [c.worker_id for c in pool.candidates("m", "v1")] == ["a"]
    assert not pool.warm("m", "v1") and pool.warm("m", "v2") and not pool.warm("m", "v9")
    pool.set_status("b", WorkerStatus.WARM)
    assert pool.warm("m", "v1") and len(pool.candidates("m", "v1")) == 2
    assert [c.worker_id for c in pool.candidates("m", "v1", exclude={"b"})] == ["a"]
    pool.report_load("a", 1000)  # at its bound: "its queue over bound"
    assert [c.worker_id for c in pool.candidates("m", "v1")] == ["b"]
    pool.set_status("b", WorkerStatus.DRAINING)
    assert pool.candidates("m", "v1") == [] and pool.begin("b", 1) is None
    d = pool.begin("c", 1)
    pool.finish(d, Outcome.FAILURE)
    assert pool.get("c").breaker.state is BreakerState.OPEN and pool.candidates("m", "v2") == []


def test_load_is_the_larger_of_reported_and_dispatched():
    pool = WorkerPool()
    pool.add("a", "m", "v", "h:1", status=WorkerStatus.WARM)
    d1 = pool.begin("a", 300)
    d2 = pool.begin("a", 200)
    assert pool.candidates("m", "v")[0].load_tokens == 500  # a burst before the next stats poll
    pool.report_load("a", 2000)  # other gateways' work shows in the worker's stats
    assert pool.candidates("m", "v")[0].load_tokens == 2000
    pool.report_load("a", 0)
    assert pool.inflight("m", "v") == 2
    pool.finish(d1, Outcome.SUCCESS)
    pool.finish(d2, Outcome.SUCCESS)
    assert pool.candidates("m", "v")[0].load_tokens == 0 and pool.inflight("m", "v") == 0
    pool.remove("a")
    pool.finish(d1, Outcome.SUCCESS)  # a finish after removal is harmless


def test_failed_health_checks_eject_a_worker():
    pool = WorkerPool(BreakerConfig(consecutive_failures=2))
    pool.add("a", "m", "v", "h:1", status=WorkerStatus.WARM)
    pool.record_health("a", False)
    pool.record_health("a", False)
    assert pool.candidates("m", "v") == []


@pytest.mark.asyncio
async def test_a_drain_wakes_when_the_last_request_finishes_or_the_worker_leaves() -> None:
    pool = WorkerPool()
    a = pool.add("a", "m", "v", "h:1", status=WorkerStatus.WARM)
    assert a.settled.is_set()  # nothing in flight: a drain has nothing to wait for
    d1, d2 = pool.begin("a", 10), pool.begin("a", 10)
    assert d1 is not None and d2 is not None and not a.settled.is_set()
    drained = asyncio.ensure_future(a.settled.wait())
    pool.finish(d1, Outcome.SUCCESS)
    await asyncio.sleep(0)
    assert not drained.done()  # one request still in flight
    pool.finish(d2, Outcome.SUCCESS)
    assert await drained  # woken by the finish, not by a poll
    d3 = pool.begin("a", 10)
    assert d3 is not None and not a.settled.is_set()
    pool.remove("a")  # removed with a request in flight: its drain has nothing left to wait for
    assert a.settled.is_set()
