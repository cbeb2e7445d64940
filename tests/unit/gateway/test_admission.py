"""The admission queue: band order, EDF, aging, deadlines, token bound, cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice.gateway.admission import AdmissionQueue, Overloaded, Ticket
from tests.clock import FakeClock


def ticket(band: int, tokens: int = 10, deadline_in: float = 30.0) -> Ticket:
    return Ticket(band, tokens, time.monotonic() + deadline_in)


def test_high_band_overtakes_fifty_low():
    async def run() -> list[str]:
        q = AdmissionQueue(max_inflight=1)
        busy = await q.acquire(ticket(1))  # the engine is saturated
        order: list[str] = []

        async def client(name: str, band: int) -> None:
            lease = await q.acquire(ticket(band))
            order.append(name)
            await asyncio.sleep(0)
            lease.release()

        tasks = [asyncio.create_task(client(f"low{i}", 2)) for i in range(50)]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(client("high", 0)))
        await asyncio.sleep(0.01)
        assert q.depth == 51
        busy.release()
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(run())
    assert order[0] == "high" and len(order) == 51  # and every low one still completed
    assert order[1:] == [f"low{i}" for i in range(50)]  # FIFO (same deadlines order) within a band


def test_earliest_deadline_first_within_a_band():
    async def run() -> list[str]:
        q = AdmissionQueue(max_inflight=1)
        busy = await q.acquire(ticket(1))
        order: list[str] = []

        async def client(name: str, deadline_in: float) -> None:
            lease = await q.acquire(ticket(1, deadline_in=deadline_in))
            order.append(name)
            lease.release()

        tasks = [asyncio.create_task(client("late", 20)), asyncio.create_task(client("soon", 5))]
        await asyncio.sleep(0.01)
        busy.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == ["soon", "late"]


def test_aging_lets_a_low_band_through():
    now = [0.0]

    async def run() -> list[str]:
        q = AdmissionQueue(max_inflight=1, aging_s=1.0, clock=lambda: now[0])
        busy = await q.acquire(Ticket(0, 1, 1e9))
        order: list[str] = []

        async def client(name: str, band: int) -> None:
            lease = await q.acquire(Ticket(band, 1, 1e9))
            order.append(name)
            lease.release()

        old_low = asyncio.create_task(client("old-low", 3))
        await asyncio.sleep(0.01)
        now[0] = 5.0  # it has waited 5 agings: effective band 3 - 5 < 0
        fresh_high = asyncio.create_task(client("fresh-high", 0))
        await asyncio.sleep(0.01)
        busy.release()
        await asyncio.gather(old_low, fresh_high)
        return order

    assert asyncio.run(run()) == ["old-low", "fresh-high"]


def test_deadline_and_token_bound_shed_with_overloaded():
    async def run() -> None:
        clock = FakeClock()
        q = AdmissionQueue(max_inflight=1, max_queued_tokens=100, clock=clock)
        busy = await q.acquire(Ticket(1, 50, clock.t + 30))
        # a deadline already past: refused on arrival, never queued
        with pytest.raises(Overloaded, match="deadline passed"):
            await q.acquire(Ticket(1, 10, clock.t))
        # a deadline 0.1 s away: it queues, then expires (not sooner: it was waiting)
        expiring = asyncio.create_task(q.acquire(Ticket(1, 10, clock.t + 0.1)))
        await asyncio.sleep(0)
        assert q.depth == 1 and q.queued_tokens == 10
        with pytest.raises(Overloaded, match="waited past its queue deadline") as info:
            await expiring
        assert info.value.retry_after_s >= 1 and q.rejected["deadline"] == 2
        assert q.depth == 0 and q.queued_tokens == 0  # the expired entry is gone
        waiting = asyncio.create_task(q.acquire(Ticket(1, 90, clock.t + 600)))
        await asyncio.sleep(0)
        # 90 + 20 > 100: refused at once, not after waiting out its 600 s deadline
        with pytest.raises(Overloaded, match="full"):
            await asyncio.wait_for(q.acquire(Ticket(1, 20, clock.t + 600)), timeout=60)
        assert q.rejected["queue_full"] == 1
        busy.release()
        (await waiting).release()
        assert q.inflight == 0

    asyncio.run(run())


def test_cancelled_waiter_leaves_at_once():
    async def run() -> None:
        q = AdmissionQueue(max_inflight=1)
        busy = await q.acquire(ticket(1))
        waiter = asyncio.create_task(q.acquire(ticket(1, tokens=30)))
        await asyncio.sleep(0.01)
        assert q.depth == 1 and q.queued_tokens == 30
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert q.depth == 0 and q.queued_tokens == 0
        busy.release()
        assert q.inflight == 0 and q.scaling_signal() == 0

    asyncio.run(run())


def test_admit_context_manager_releases_however_the_block_ends():
    async def run() -> None:
        q = AdmissionQueue(max_inflight=1)
        async with q.admit(ticket(1, tokens=7)) as lease:
            assert q.inflight == 1 and q.inflight_tokens == 7 and lease.waited_s == 0.0
        assert q.inflight == 0
        with pytest.raises(RuntimeError):
            async with q.admit(ticket(1)):
                raise RuntimeError("the request failed")
        assert q.inflight == 0 and q.inflight_tokens == 0

    asyncio.run(run())


def test_dispatch_is_late_bound_to_the_capacity_gate():
    """Entries leave only when the engine side says yes; poke() re-asks; set_capacity() widens."""

    async def run() -> None:
        room = [False]
        q = AdmissionQueue(max_inflight=10, gate=lambda tokens: room[0])
        waiters = [asyncio.create_task(q.acquire(ticket(1, tokens=10))) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert q.depth == 3 and q.inflight == 0
        room[0] = True
        assert q.depth == 3  # the gate changed, but nobody asked yet
        q.poke()
        leases = await asyncio.gather(*waiters)
        assert q.depth == 0 and q.inflight == 3
        for lease in leases:
            lease.release()

        q2 = AdmissionQueue(max_inflight=1)
        busy = await q2.acquire(ticket(1))
        more = [asyncio.create_task(q2.acquire(ticket(1))) for _ in range(2)]
        await asyncio.sleep(0.01)
        q2.set_capacity(max_inflight=3)  # the engine reports more room
        await asyncio.gather(*more)
        assert q2.inflight == 3 and q2.depth == 0
        busy.release()

    asyncio.run(run())


def test_token_capacity_and_scaling_signal():
    async def run() -> None:
        q = AdmissionQueue(max_inflight=100, max_inflight_tokens=100, capacity_tokens=200)
        big = await q.acquire(ticket(1, tokens=80))
        waiting = asyncio.create_task(q.acquire(ticket(1, tokens=40)))  # 80 + 40 > 100: waits
        await asyncio.sleep(0.01)
        assert q.depth == 1 and q.queued_tokens == 40
        assert q.scaling_signal() == (40 + 80) / 200  # (queued + in flight) / capacity
        big.release()
        (await waiting).release()
        assert q.scaling_signal() == 0
        huge = await q.acquire(ticket(1, tokens=500))  # larger than capacity, nothing in flight: goes
        huge.release()

    asyncio.run(run())


def test_steady_high_band_traffic_does_not_starve_a_low_band_request():
    """Real time: with aging_s=0.05 a band-3 request overtakes fresh band-0 arrivals quickly."""

    async def run() -> float:
        q = AdmissionQueue(max_inflight=1, aging_s=0.05)
        stop = asyncio.Event()

        async def high_traffic() -> None:
            while not stop.is_set():
                tasks = [asyncio.create_task(q.acquire(ticket(0, deadline_in=5))) for _ in range(3)]
                for t in tasks:
                    lease = await t
                    await asyncio.sleep(0.005)
                    lease.release()

        feeder = asyncio.create_task(high_traffic())
        await asyncio.sleep(0.02)
        t0 = time.monotonic()
        async with q.admit(ticket(3, deadline_in=5)):
            waited = time.monotonic() - t0
        stop.set()
        await feeder
        return waited

    assert asyncio.run(run()) < 5.0  # admitted (aging) before its 5 s deadline, under steady high-band traffic
