"""Rate limits: exact under concurrency in memory and in a real Redis shared by processes;
refunds; headers; refill; Redis down → the configured fail-open / fail-closed, never a raise."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import sys
import time
import uuid

import pytest

from sluice.gateway.limiter import make_limiter
from sluice.gateway.limiter_memory import MemoryLimiter
from sluice.gateway.limits import Limits
from sluice.gateway.rate_limit_headers import rate_limit_headers
from tests.server_process import free_port


def _key() -> str:
    return "k-" + uuid.uuid4().hex[:8]


def _exact(admitted: int, elapsed_s: float, rpm: int = 50) -> bool:
    """The full bucket and no more, plus what it refilled (continuously, rpm per minute) while
    the burst ran: on a loaded machine a burst can take seconds, so refill is counted, not
    assumed away."""
    return rpm <= admitted <= rpm + math.ceil(elapsed_s * rpm / 60)


async def _burst(limiter, key: str, limits: Limits, n: int) -> int:
    results = await asyncio.gather(*(limiter.acquire(key, limits, 10, 10) for _ in range(n)))
    return sum(d.allowed for d in results)


def test_memory_exact_under_concurrency():
    assert asyncio.run(_burst(MemoryLimiter(), _key(), Limits(rpm=50), 200)) == 50


def test_redis_exact_under_concurrency(redis_server):
    async def run() -> int:
        limiter = make_limiter("redis", redis_server.url)
        try:
            return await _burst(limiter, _key(), Limits(rpm=50), 200)
        finally:
            await limiter.close()

    t0 = time.monotonic()
    admitted = asyncio.run(run())
    assert _exact(admitted, time.monotonic() - t0), admitted


_CHILD = """
import asyncio, sys
from sluice.gateway.limiter import make_limiter
from sluice.gateway.limits import Limits
async def main():
    lim = make_limiter("redis", sys.argv[1])
    res = await asyncio.gather(*(lim.acquire(sys.argv[2], Limits(rpm=50), 1, 1) for _ in range(100)))
    await lim.close()
    print(sum(d.allowed for d in res))
asyncio.run(main())
"""


def test_redis_shared_by_two_processes(redis_server):
    key = _key()
    t0 = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, "-c", _CHILD, redis_server.url, key], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    admitted = [int(p.communicate(timeout=60)[0].strip()) for p in procs]
    assert _exact(sum(admitted), time.monotonic() - t0), admitted


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_output_tokens_refund_and_headers_count_down(store, redis_server):
    async def run():
        limiter = make_limiter(store, redis_server.url)
        key, limits = _key(), Limits(rpm=10, itpm=1000, otpm=100, max_concurrent=2)
        try:
            d1 = await limiter.acquire(key, limits, input_tokens=100, output_tokens=60)
            assert d1.allowed
            h1 = rate_limit_headers(d1)
            assert h1["anthropic-ratelimit-requests-remaining"] == "9"
            assert h1["anthropic-ratelimit-output-tokens-remaining"] in ("40", "39")
            assert h1["anthropic-ratelimit-input-tokens-limit"] == "1000"
            assert h1["anthropic-ratelimit-requests-reset"].endswith("Z")
            d2 = await limiter.acquire(key, limits, 100, 60)  # 60 > 40 left: refused, nothing taken
            assert not d2.allowed and d2.reason == "output_tokens" and d2.retry_after_s > 0
            h2 = rate_limit_headers(d2)
            assert int(h2["retry-after"]) >= 1 and "retry-after-ms" in h2
            await limiter.settle(key, limits, reserved_output=60, actual_output=5, lease=d1.lease)  # 55 back
            d3 = await limiter.acquire(key, limits, 100, 60)
            assert d3.allowed and rate_limit_headers(d3)["anthropic-ratelimit-requests-remaining"] == "8"
            d4 = await limiter.acquire(key, limits, 1, 1)
            assert d4.allowed
            d5 = await limiter.acquire(key, limits, 1, 1)  # a third concurrent request
            assert not d5.allowed and d5.reason == "concurrency"
            await limiter.settle(key, limits, 1, 1, d4.lease)
            assert (await limiter.acquire(key, limits, 1, 1)).allowed
        finally:
            await limiter.close()

    asyncio.run(run())


def test_continuous_refill():
    now = [1000.0]
    limiter = MemoryLimiter(clock=lambda: now[0])
    limits = Limits(rpm=60)  # one per second

    async def run():
        assert await _burst(limiter, "k", limits, 100) == 60
        assert not (await limiter.acquire("k", limits, 0, 0)).allowed
        now[0] += 2.0
        assert await _burst(limiter, "k", limits, 5) == 2

    asyncio.run(run())


@pytest.mark.parametrize("policy, allowed", [("open", True), ("closed", False)])
def test_redis_down_fails_open_or_closed(policy, allowed, caplog):
    async def run():
        limiter = make_limiter("redis", f"redis://127.0.0.1:{free_port()}/0", on_store_error=policy)
        try:
            decisions = [await limiter.acquire("k", Limits(rpm=5), 1, 1) for _ in range(3)]
            await limiter.settle("k", Limits(rpm=5), 1, 1, None)  # must not raise either
            return decisions
        finally:
            await limiter.close()

    with caplog.at_level(logging.WARNING, logger="sluice.gateway.limits"):
        decisions = asyncio.run(run())
    assert all(d.allowed is allowed and d.reason == "store_unavailable" for d in decisions)
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1  # one line, not one per request
    assert json.dumps([d.reason for d in decisions])


def test_headers_count_down_one_request_at_a_time():
    async def run() -> list[tuple[str, str, str]]:
        limiter, key, limits = MemoryLimiter(), _key(), Limits(rpm=10, itpm=1000, otpm=500)
        out = []
        for _ in range(4):
            h = rate_limit_headers(await limiter.acquire(key, limits, 100, 50))
            out.append(
                (
                    h["anthropic-ratelimit-requests-remaining"],
                    h["anthropic-ratelimit-input-tokens-remaining"],
                    h["anthropic-ratelimit-output-tokens-remaining"],
                )
            )
        return out

    got = asyncio.run(run())
    assert [g[0] for g in got] == ["9", "8", "7", "6"]
    assert [int(g[1]) for g in got] == [900, 800, 700, 600]
    assert all(abs(int(g[2]) - e) <= 1 for g, e in zip(got, (450, 400, 350, 300)))


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_request_larger_than_the_bucket_waits_for_a_full_one_then_owes(store, redis_server):
    """250 input tokens against 100 ITPM: admitted on a full bucket (never refused forever),
    leaving it 150 in debt; the next request waits until the debt is paid back."""

    async def run():
        limiter = make_limiter(store, redis_server.url)
        key, limits = _key(), Limits(itpm=100)
        try:
            d1 = await limiter.acquire(key, limits, 250, 0)
            assert d1.allowed and d1.buckets["input_tokens"].remaining == pytest.approx(-150, abs=1)
            assert rate_limit_headers(d1)["anthropic-ratelimit-input-tokens-remaining"] == "0"
            d2 = await limiter.acquire(key, limits, 10, 0)
            assert not d2.allowed and d2.reason == "input_tokens"
            assert d2.retry_after_s == pytest.approx((10 + 150) * 60 / 100, rel=0.02)  # ~96 s
        finally:
            await limiter.close()

    asyncio.run(run())


def test_redis_refill_over_time_with_a_short_window(redis_server):
    from sluice.gateway.limiter import GuardedLimiter
    from sluice.gateway.limiter_redis import RedisLimiter

    async def run() -> tuple[int, int, int]:
        redis_limiter = RedisLimiter(redis_server.url, window_s=1.0)  # 5 per second
        limiter = GuardedLimiter(redis_limiter)
        key, limits = _key(), Limits(rpm=5)
        try:
            first = await _burst(limiter, key, limits, 20)
            empty = await _burst(limiter, key, limits, 5)
            await asyncio.sleep(0.45)  # ~2.25 requests refill (a little more on a busy machine)
            later = await _burst(limiter, key, limits, 5)
            ttl = await redis_limiter.redis.ttl(redis_limiter._key(key, "requests"))
            assert 0 < ttl <= 3  # kept only until the bucket would be full again
            return first, empty, later
        finally:
            await limiter.close()

    first, empty, later = asyncio.run(run())
    assert (first, empty) == (5, 0) and 2 <= later <= 3


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_concurrency_slots_are_leases_a_crash_cannot_leak(store, redis_server):
    """A gateway that dies without settling: its slot frees itself when the lease runs out."""
    from sluice.gateway.limiter import GuardedLimiter
    from sluice.gateway.limiter_redis import RedisLimiter

    async def run():
        inner = RedisLimiter(redis_server.url, lease_ttl_s=0.5) if store == "redis" else MemoryLimiter(lease_ttl_s=0.5)
        limiter, key, limits = GuardedLimiter(inner), _key(), Limits(max_concurrent=1)
        try:
            held = await limiter.acquire(key, limits, 1, 1)
            assert held.allowed and held.lease
            refused = await limiter.acquire(key, limits, 1, 1)
            assert not refused.allowed and refused.reason == "concurrency" and refused.lease is None
            await asyncio.sleep(0.6)  # never settled: the "crashed" request's lease expires
            assert (await limiter.acquire(key, limits, 1, 1)).allowed
        finally:
            await limiter.close()

    asyncio.run(run())


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_an_open_session_keeps_its_slot_past_the_lease_ttl(store, redis_server):
    """A request that queues or streams for longer than the lease's TTL renews it: the key
    cannot exceed its concurrency limit meanwhile; closing the session frees the slot at once."""
    from sluice.gateway.admission import AdmissionQueue
    from sluice.gateway.gateway import Gateway, RateLimited
    from sluice.gateway.limiter import GuardedLimiter
    from sluice.gateway.limiter_redis import RedisLimiter
    from sluice.gateway.principal import Principal
    from sluice.types import GenerationRequest, SamplingParams

    ONE = GenerationRequest("r", [0], SamplingParams(max_tokens=1))  # one input token, one output

    async def nothing():
        return
        yield

    async def run():
        inner = RedisLimiter(redis_server.url, lease_ttl_s=0.3) if store == "redis" else MemoryLimiter(lease_ttl_s=0.3)
        limiter = GuardedLimiter(inner)
        gateway = Gateway(AdmissionQueue(), limiter)
        principal = Principal(key_id=_key(), limits=Limits(max_concurrent=1))
        try:
            session = await gateway.open(principal, ONE, nothing)
            await asyncio.sleep(1.0)  # over three TTLs
            with pytest.raises(RateLimited) as info:
                await gateway.open(principal, ONE, nothing)
            assert info.value.decision.reason == "concurrency"
            await session.close()
            again = await gateway.open(principal, ONE, nothing)
            await again.close()
            assert limiter.store_errors == 0
        finally:
            await limiter.close()

    asyncio.run(run())


def test_make_limiter_from_settings():
    from sluice.config import Settings
    from sluice.gateway.limiter_memory import MemoryLimiter as Mem

    limiter = make_limiter(Settings(limits_store="memory", on_store_error="closed"))
    assert isinstance(limiter.inner, Mem) and limiter.on_store_error == "closed"
    with pytest.raises(ValueError):
        make_limiter("memcached")
