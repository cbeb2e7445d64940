"""The one event log (streaming/event_log.py) behind coalescing and stream replay, the replay
stores on it, and the recorder that writes streams into them."""

from __future__ import annotations

import asyncio
import json

import pytest

from sluice.streaming.event_log import EventLog, LogGap
from sluice.streaming.recorder import Recording
from sluice.streaming.replay_log import MemoryReplayLog, RedisReplayLog, ReplayEvent


def test_a_follower_paused_at_a_yield_still_gets_the_rest_and_the_end():
    """The replay bug: events appended — and finish() called — while a slow follower was paused
    at a `yield` were never delivered (it iterated a stale copy). Here the follower reads one
    event, everything else happens, then it resumes."""

    async def run():
        log: EventLog[int] = EventLog()
        for i in (1, 2, 3):
            log.append(i)
        follower = log.follow()
        assert await anext(follower) == 1  # paused at its yield from here on
        log.append(4)
        log.finish()
        return [1] + [x async for x in follower]

    assert asyncio.run(run()) == [1, 2, 3, 4]


def test_live_followers_see_every_event_once_in_order_and_the_producers_error():
    async def run():
        log: EventLog[int] = EventLog()

        async def follow(after: int) -> list[int]:
            return [x async for x in log.follow(after)]

        readers = [asyncio.ensure_future(follow(a)) for a in (0, 0, 2)]
        for i in range(1, 101):
            log.append(i)
            if i % 7 == 0:
                await asyncio.sleep(0)
        log.finish()
        got = await asyncio.gather(*readers)
        failing: EventLog[int] = EventLog()
        failing.append(1)
        failing.finish(RuntimeError("boom"))
        with pytest.raises(RuntimeError, match="boom"):
            [x async for x in failing.follow()]
        return got

    a, b, c = asyncio.run(run())
    assert a == b == list(range(1, 101)) and c == list(range(3, 101))


def test_trimming_keeps_the_newest_and_refuses_a_gap():
    async def run():
        log: EventLog[str] = EventLog(max_bytes=10, size_of=len)
        for s in ("aaaa", "bbbb", "cccc", "dddd"):
            log.append(s)
        assert log.first_seq == 3 and log.last_seq == 4 and log.bytes == 8
        log.finish()
        with pytest.raises(LogGap):
            [x async for x in log.follow(0)]
        return [x async for x in log.follow(2)]

    assert asyncio.run(run()) == ["cccc", "dddd"]


@pytest.fixture(params=["memory", "redis"])
def replay(request):
    if request.param == "memory":
        return lambda: MemoryReplayLog(ttl_s=60)
    server = request.getfixturevalue("redis_server")
    return lambda: RedisReplayLog(server.url, ttl_s=60)


def _ev(seq: int, name: str = "content_block_delta") -> ReplayEvent:
    return ReplayEvent(seq, name, json.dumps({"type": name, "n": seq}))


def test_a_resumed_follower_gets_everything_after_its_position_then_the_end(replay):
    async def run():
        store = replay()
        sid = f"msg_{id(store)}"
        await store.open(sid, "acme")
        for seq in (1, 2, 3):
            await store.append(sid, _ev(seq))
        follower = store.follow(sid, 1)
        first = await anext(follower)  # paused at its yield while the stream goes on and ends
        await store.append(sid, _ev(4, "message_stop"))
        await store.finish(sid)
        rest = [e async for e in follower]
        owner = await store.owner(sid)
        await store.close()
        return [first.seq] + [e.seq for e in rest], owner

    seqs, owner = asyncio.run(run())
    assert seqs == [2, 3, 4] and owner == "acme"


def test_a_recording_cut_short_ends_the_log_with_the_cut_event(replay):
    """Closed before its source ended — even before it started — a recording appends the wire's
    cut event and finishes the log, so a resumed client sees an end instead of waiting."""

    async def run():
        store = replay()

        async def source():
            for seq in range(1, 100):
                yield _ev(seq)
                await asyncio.sleep(0)

        def cut(seq: int) -> ReplayEvent:
            return ReplayEvent(seq, "error", '{"type":"error"}')

        started = await Recording.open(store, f"a{id(store)}", "t", source(), cut)
        events = started.events()
        assert [(await anext(events)).seq for _ in range(3)] == [1, 2, 3]
        await started.close()
        never = await Recording.open(store, f"b{id(store)}", "t", source(), cut)
        await never.close()
        a = [(e.seq, e.name) async for e in store.follow(f"a{id(store)}", 0)]
        b = [(e.seq, e.name) async for e in store.follow(f"b{id(store)}", 0)]
        await store.close()
        return a, b

    a, b = asyncio.run(run())
    assert a == [(1, "content_block_delta"), (2, "content_block_delta"), (3, "content_block_delta"), (4, "error")]
    assert b == [(1, "error")]
