"""Singleflight: one generation, many identical subscribers; cancellation; keys; the cache."""

from __future__ import annotations

import asyncio

from sluice.gateway.coalescer import Coalescer, coalesce_key
from sluice.gateway.response_cache import ResponseCache
from sluice.types import FinishReason, GenerationEvent, Usage


def make_producer(calls: list[int], n: int = 20, delay: float = 0.005, cancelled: list[bool] | None = None):
    async def produce():
        calls.append(1)
        try:
            for i in range(n):
                await asyncio.sleep(delay)
                yield GenerationEvent(
                    "r",
                    text=f"t{i} ",
                    token_ids=[i],
                    finished=i == n - 1,
                    finish_reason=FinishReason.LENGTH if i == n - 1 else None,
                    usage=Usage(5, i + 1, 0),
                )
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
    assert len(calls) == 1 and c.leaders == 1 and c.coalesced == 19
    assert len(set(texts)) == 1 and texts[0] == "".join(f"t{i} " for i in range(20))


def test_every_subscriber_gets_the_identical_event_sequence():
    async def run():
        c, calls = Coalescer(), []

        async def sub(delay: float) -> list[tuple]:
            await asyncio.sleep(delay)
            return [
                (e.text, tuple(e.token_ids), e.finish_reason, e.usage.output_tokens)
                async for e in c.run("k", make_producer(calls))
            ]

        return await asyncio.gather(*(sub(0.003 * i) for i in range(20))), calls

    seqs, calls = asyncio.run(run())
    assert len(calls) == 1 and all(s == seqs[0] for s in seqs) and len(seqs[0]) == 20
    assert seqs[0][-1][2] == FinishReason.LENGTH


def test_a_seat_taken_at_admission_survives_the_flight_ending_first():
    """join() at admission, events() later: the flight may have finished (and left the map)
    in between; the subscriber still gets the whole reply and nothing runs twice."""

    async def run():
        c, calls, done = Coalescer(), [], []
        leader, is_leader = c.join("k", make_producer(calls, n=5, delay=0), on_done=lambda: done.append(1))
        late, late_is_leader = c.join("k", make_producer(calls))
        assert is_leader and not late_is_leader
        first = [e.text async for e in leader.events()]
        leader.leave()
        await asyncio.sleep(0.01)
        assert not c.has("k") and done == [1]  # finished; the lease-returning hook ran once
        second = [e.text async for e in late.events()]
        late.leave()
        return first, second, calls

    first, second, calls = asyncio.run(run())
    assert first == second == [f"t{i} " for i in range(5)] and len(calls) == 1


def test_producer_error_reaches_every_subscriber():
    async def broken():
        yield GenerationEvent("r", text="a")
        await asyncio.sleep(0.01)
        raise RuntimeError("engine died")

    async def run():
        c = Coalescer()

        async def sub() -> tuple[list[str], str]:
            got = []
            try:
                async for e in c.run("k", broken):
                    got.append(e.text)
            except RuntimeError as exc:
                return got, str(exc)
            return got, ""

        return await asyncio.gather(sub(), sub(), sub())

    assert asyncio.run(run()) == [(["a"], "engine died")] * 3


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
    assert c.abandoned == 1


def test_keys():
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    k = coalesce_key("acme", "m", body)
    assert k == coalesce_key("acme", "m", {**body, "stream": True})  # the stream flag does not matter
    assert k != coalesce_key("globex", "m", body)  # tenants do not share by default
    assert coalesce_key("globex", "m", body, shared_across_tenants=True) == coalesce_key("acme", "m", body, True)
    assert coalesce_key("acme", "m", {**body, "temperature": 0.7}) is None  # not deterministic
    assert coalesce_key("acme", "m", {k: v for k, v in body.items() if k != "temperature"}) is None  # default 1.0
    assert coalesce_key("acme", "m", {**body, "temperature": 0.7, "seed": 3}) is not None
    assert coalesce_key("acme", "m", {**body, "max_tokens": 6}) != k  # any real difference splits
    assert coalesce_key("acme", "other-model", body) != k
    reordered = dict(reversed(list(body.items())))
    assert coalesce_key("acme", "m", reordered) == k  # canonical JSON: key order does not matter


def test_non_deterministic_and_cross_tenant_requests_never_share_a_flight():
    """What the gateway does with keys: None → no coalescing (each runs); different tenants →
    different flights."""
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}

    async def run():
        c, calls = Coalescer(), []

        async def one(tenant: str, temperature: float) -> str:
            key = coalesce_key(tenant, "m", {**body, "temperature": temperature})
            if key is None:
                return "".join([e.text async for e in make_producer(calls, n=3)()])
            return "".join([e.text async for e in c.run(key, make_producer(calls, n=3))])

        await asyncio.gather(*(one("acme", 0.7) for _ in range(5)))
        assert len(calls) == 5  # sampled requests: every one generates
        await asyncio.gather(one("acme", 0), one("globex", 0), one("acme", 0))
        return calls, c

    calls, c = asyncio.run(run())
    assert len(calls) == 5 + 2 and c.leaders == 2 and c.coalesced == 1


def _reply(text: str, reason: FinishReason | None = FinishReason.EOS) -> list[GenerationEvent]:
    return [GenerationEvent("r", text=text), GenerationEvent("r", finished=True, finish_reason=reason)]


def test_response_cache_ttl_and_bounds():
    now = [0.0]
    cache = ResponseCache(ttl_s=10, max_entries=2, clock=lambda: now[0])
    ev = _reply("x")
    assert cache.put("a", ev) and cache.put("b", ev)
    assert cache.get("a") == ev
    cache.put("c", ev)  # evicts the least recently used: b
    assert cache.get("b") is None and cache.get("c") == ev
    now[0] = 11
    assert cache.get("a") is None and cache.hits == 2 and len(cache) == 1  # expired entries go


def test_response_cache_keeps_only_complete_replies_within_its_byte_bound():
    cache = ResponseCache(max_bytes=1000)
    assert not cache.put("aborted", _reply("x", FinishReason.ABORT))
    assert not cache.put("partial", [GenerationEvent("r", text="x")])
    assert not cache.put("huge", _reply("y" * 5000))  # larger than the whole cache
    for i in range(20):
        cache.put(f"k{i}", _reply("z" * 100))
    assert cache.bytes <= 1000 and cache.get("k19") is not None and cache.get("k0") is None
