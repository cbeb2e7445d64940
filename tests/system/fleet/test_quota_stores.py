"""Per-model token quotas per tier: the memory and the Redis store, same semantics.

The Redis store runs against a real redis-server. Its `clock` aid stands in for Redis TIME
where a test needs period boundaries; one test uses the real Redis TIME path.
"""

from __future__ import annotations

import asyncio
import calendar
import time
import uuid

import pytest

from sluice.routing.fleet_file.schema import QuotaMode, QuotaPeriod, TokenQuotaSpec
from sluice.routing.quota.memory_store import MemoryQuotaStore
from sluice.routing.quota.redis_store import RedisQuotaStore
from sluice.routing.quota.semantics import QuotaStatus, period_window
from tests.clock import FakeClock


def utc(*ymdhms: int) -> float:
    return float(calendar.timegm((*ymdhms, 0, 0, 0)[:6]))


@pytest.fixture(params=["memory", "redis"])
def make_store(request):
    def make(clock):  # each test closes its store inside its own event loop
        if request.param == "memory":
            return MemoryQuotaStore(clock)
        server = request.getfixturevalue("redis_server")
        return RedisQuotaStore(server.url, prefix=f"t{uuid.uuid4().hex}", clock=clock)

    return make


DAY_SOFT = TokenQuotaSpec(tokens=1000, period=QuotaPeriod.DAY, mode=QuotaMode.SOFT)
DAY_HARD = TokenQuotaSpec(tokens=1000, period=QuotaPeriod.DAY, mode=QuotaMode.HARD)
MONTH_HARD = TokenQuotaSpec(tokens=1000, period=QuotaPeriod.MONTH, mode=QuotaMode.HARD)


def test_period_calendar():
    assert period_window(QuotaPeriod.DAY, utc(2026, 3, 14, 15, 9, 26)) == (f"d{20526}", utc(2026, 3, 15))
    assert period_window(QuotaPeriod.MONTH, utc(2026, 12, 31, 23, 59, 59))[1] == utc(2027, 1, 1)
    assert period_window(QuotaPeriod.MONTH, utc(2028, 2, 29, 12))[1] == utc(2028, 3, 1)  # leap day
    assert period_window(QuotaPeriod.MONTH, utc(2026, 1, 1))[0] == f"m{2026 * 12}"
    assert period_window(QuotaPeriod.MONTH, utc(2026, 1, 1) - 1)[0] == f"m{2025 * 12 + 11}"


@pytest.mark.asyncio
async def test_under_the_limit_reserves_and_over_it_refuses(make_store):
    clock = FakeClock(utc(2026, 5, 10, 12))
    store = make_store(clock)
    try:
        d = await store.acquire("acme", "m", DAY_HARD, 600)
        assert d.status is QuotaStatus.OK and d.used == 600 and d.remaining == 400 and d.reservation is not None
        d = await store.acquire("acme", "m", DAY_HARD, 600)  # below the limit before it: admitted
        assert d.status is QuotaStatus.OK and d.used == 1200  # the last one may overshoot
        d = await store.acquire("acme", "m", DAY_HARD, 1)
        assert d.status is QuotaStatus.HARD_EXCEEDED and d.reservation is None and d.used == 1200
        assert d.reset_at == utc(2026, 5, 11) and d.retry_after_s == 12 * 3600
        # other tenants and other models have their own counters
        assert (await store.acquire("other", "m", DAY_HARD, 1)).status is QuotaStatus.OK
        assert (await store.acquire("acme", "m2", DAY_HARD, 1)).status is QuotaStatus.OK
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_soft_quota_and_force(make_store):
    store = make_store(FakeClock(utc(2026, 5, 10, 12)))
    try:
        await store.acquire("t", "m", DAY_SOFT, 1000)
        d = await store.acquire("t", "m", DAY_SOFT, 50)
        assert d.status is QuotaStatus.SOFT_EXCEEDED and d.reservation is None
        d = await store.acquire("t", "m", DAY_SOFT, 50, force=True)  # no fallback could serve
        assert d.status is QuotaStatus.SOFT_EXCEEDED and d.reservation is not None and d.used == 1050
        assert (await store.usage("t", "m", DAY_SOFT)).used == 1050
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_settle_corrects_the_estimate(make_store):
    store = make_store(FakeClock(utc(2026, 5, 10, 12)))
    try:
        d = await store.acquire("t", "m", DAY_HARD, 900)  # prompt + max_tokens
        await store.settle(d.reservation, 150)  # what the request really used
        assert (await store.usage("t", "m", DAY_HARD)).used == 150
        d = await store.acquire("t", "m", DAY_HARD, 100)
        await store.settle(d.reservation, 300)  # a top-up (an estimate can be low)
        assert (await store.usage("t", "m", DAY_HARD)).used == 450
        u = await store.usage("t", "m", DAY_HARD)
        assert u.reservation is None and u.status is QuotaStatus.OK and u.remaining == 550
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_the_period_resets(make_store):
    clock = FakeClock(utc(2026, 1, 31, 23, 59))
    store = make_store(clock)
    try:
        old = await store.acquire("t", "m", MONTH_HARD, 1000)
        assert (await store.acquire("t", "m", MONTH_HARD, 1)).status is QuotaStatus.HARD_EXCEEDED
        clock.t = utc(2026, 2, 1, 0, 0, 1)
        d = await store.acquire("t", "m", MONTH_HARD, 10)
        assert d.status is QuotaStatus.OK and d.used == 10 and d.reset_at == utc(2026, 3, 1)
        await store.settle(old.reservation, 0)  # last month's reservation changes nothing now
        assert (await store.usage("t", "m", MONTH_HARD)).used == 10
    finally:
        await store.close()


@pytest.mark.parametrize(
    "instant",
    [
        utc(2026, 12, 31, 23, 59, 59),
        utc(2027, 1, 1),
        utc(2028, 2, 28, 23),
        utc(2028, 2, 29, 23),
        utc(2100, 2, 28, 12),
        utc(2000, 3, 1),
        utc(1999, 12, 31, 23, 59, 59),
        utc(2026, 7, 15, 8, 30),
    ],
)
@pytest.mark.asyncio
async def test_lua_calendar_matches_python(redis_server, instant):
    store = RedisQuotaStore(redis_server.url, prefix=f"t{uuid.uuid4().hex}", clock=FakeClock(instant + 0.25))
    try:
        for quota in (DAY_HARD, MONTH_HARD):
            d = await store.acquire("t", "m", quota, 1)
            assert (d.reservation.period_id, d.reset_at) == period_window(quota.period, instant + 0.25)
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_redis_time_is_the_clock(redis_server):
    store = RedisQuotaStore(redis_server.url, prefix=f"t{uuid.uuid4().hex}")  # no clock: Redis TIME
    try:
        d = await store.acquire("t", "m", DAY_HARD, 5)
        now = time.time()  # the same host, so the two clocks agree to well within a day
        assert d.reservation.period_id == period_window(QuotaPeriod.DAY, d.reset_at - 1)[0]
        assert 0 < d.retry_after_s <= 86400 and abs(d.reset_at - d.retry_after_s - now) < 3600
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_redis_check_and_reserve_is_atomic(redis_server):
    prefix = f"atomic-{uuid.uuid4().hex}"
    stores = [RedisQuotaStore(redis_server.url, prefix=prefix) for _ in range(4)]  # four gateways
    try:
        quota = TokenQuotaSpec(tokens=1000, period=QuotaPeriod.DAY, mode=QuotaMode.HARD)
        results = await asyncio.gather(*(stores[i % 4].acquire("t", "m", quota, 100) for i in range(60)))
        admitted = [r for r in results if r.status is QuotaStatus.OK]
        assert len(admitted) == 10  # exactly the limit's worth, however the calls interleave
        assert (await stores[0].usage("t", "m", quota)).used == 1000
    finally:
        for s in stores:
            await s.close()


@pytest.mark.asyncio
async def test_store_factory(redis_server):
    from sluice.routing.quota.stores import make_quota_store

    assert isinstance(make_quota_store("memory"), MemoryQuotaStore)
    store = make_quota_store("redis", redis_server.url)
    try:
        assert (await store.usage("nobody", "m", DAY_HARD)).used == 0
    finally:
        await store.close()
    with pytest.raises(ValueError, match="unknown quota store"):
        make_quota_store("sqlite")
