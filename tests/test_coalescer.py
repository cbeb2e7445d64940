"""Singleflight: one generation, many identical subscribers; cancellation; keys; the cache."""

from __future__ import annotations

import asyncio

from sluice.gateway.coalescer import Coalescer, ResponseCache, coalesce_key
from sluice.types import FinishReason, GenerationEvent, Usage


def make_producer(calls: list[int], n: int = 20, delay: float = 0.005, cancelled: list[bool] | None = None):
    async def produce():
        calls.append(1)
        try:
            for i in range(n):
                await asyncio.sleep(delay)
                yield GenerationEvent("r", text=f"t{i} ", token_ids=[i], finished=i == n - 1,
                                      finish_reason=FinishReason.LENGTH if i == n - 1 else None, usage=Usage(5, i + 1, 0))
        except asyncio.CancelledError:
            if cancelled is not None:
                cancelled.append(True)
            raise

    return produce


def test_twenty_identical_subscribers_share_one_generation():
    async def run():
        c, calls = Coalescer(), []

        async def sub(delay: float) -> str:
            await asyncio.sleep(delay)
            return "".join([e.text async for e in c.run("k", make_producer(calls))])

        texts = await asyncio.gather(*(sub(0.002 * i) for i in range(20)))  # late joiners too
        return texts, calls, c

    texts, calls, c = asyncio.run(run())
    assert len(calls) == 1 and c.coalesced == 19
    assert len(set(texts)) == 1 and texts[0] == "".join(f"t{i} " for i in range(20))


def test_cancelling_some_subscribers_leaves_the_rest_and_the_last_stops_it():
    async def run():
        c, calls, cancelled = Coalescer(), [], []
        producer = make_producer(calls, n=40, cancelled=cancelled)

        async def sub(stop_after: int | None) -> int:
            n = 0
            async for _ in c.run("k", producer):
                n += 1
                if stop_after is not None and n == stop_after:
                    break
            return n

        counts = await asyncio.gather(sub(3), sub(5), sub(None), sub(None))
        assert counts == [3, 5, 40, 40] and not cancelled
        # now everyone leaves early: the producer is cancelled
        partial = await asyncio.gather(sub(2), sub(4))
        await asyncio.sleep(0.05)
        return partial, calls, cancelled, c

    partial, calls, cancelled, c = asyncio.run(run())
    assert partial == [2, 4] and len(calls) == 2 and cancelled == [True] and c.in_flight() == 0


def test_keys():
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    k = coalesce_key("acme", "m", body)
    assert k == coalesce_key("acme", "m", {**body, "stream": True})  # the stream flag does not matter
    assert k != coalesce_key("globex", "m", body)  # tenants do not share by default
    assert coalesce_key("globex", "m", body, shared_across_tenants=True) == coalesce_key("acme", "m", body, True)
    assert coalesce_key("acme", "m", {**body, "temperature": 0.7}) is None  # not deterministic
    assert coalesce_key("acme", "m", {**body, "temperature": 0.7, "seed": 3}) is not None


def test_response_cache_ttl_and_bounds():
    now = [0.0]
    cache = ResponseCache(ttl_s=10, max_entries=2, clock=lambda: now[0])
    ev = [GenerationEvent("r", text="x")]
    cache.put("a", ev)
    cache.put("b", ev)
    assert cache.get("a") == ev
    cache.put("c", ev)  # evicts the least recently used: b
    assert cache.get("b") is None and cache.get("c") == ev
    now[0] = 11
    assert cache.get("a") is None and cache.hits == 2
