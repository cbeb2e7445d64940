"""The idempotency stores (memory and a real redis-server: one behaviour) and the coordinator's
decisions: claim once, complete or release only by the holder, leases, bounds, store failures."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.idempotency.redis_store import RedisIdempotencyStore
from sluice.serving.idempotency.retries import Action, Idempotency, fingerprint
from sluice.serving.idempotency.store import MemoryIdempotencyStore, Phase, Record, StoredReply
from sluice.streaming.replay_log import MemoryReplayLog, ReplayEvent
from tests.clock import FakeClock
from tests.server_process import free_port


@pytest.fixture(params=["memory", "redis"])
def make_store(request):
    made = []

    prefix = f"t{uuid.uuid4().hex[:8]}"  # this test's keys only

    def make():
        if request.param == "memory":
            store = MemoryIdempotencyStore()
        else:
            store = RedisIdempotencyStore(request.getfixturevalue("redis_server").url, prefix=prefix)
        made.append(store)
        return store

    return make


def record(fp: str = "fp", stream: str | None = None) -> Record:
    return Record(fp, uuid.uuid4().hex, Phase.RUNNING, stream)


REPLY = StoredReply(200, {"anthropic-ratelimit-requests-remaining": "9"}, body='{"id":"msg_1"}')
STREAM = StoredReply(200, {}, events=[ReplayEvent(1, "message_start", "{}"), ReplayEvent(2, "message_stop", '{"ü":1}')])


def test_claim_once_complete_by_the_holder_only(make_store):
    async def run():
        store = make_store()
        first, second = record(), record()
        assert await store.claim("k", first, 30) is None
        held = await store.claim("k", second, 30)
        assert held is not None and held.phase is Phase.RUNNING and held.token == first.token
        assert not await store.complete("k", second.token, REPLY, 60)  # not its claim
        assert await store.complete("k", first.token, REPLY, 60)
        done = await store.claim("k", second, 30)
        assert done.phase is Phase.DONE and done.reply == REPLY and done.fingerprint == "fp"
        await store.release("k", first.token)  # a completed record is kept until its TTL
        assert (await store.claim("k", second, 30)).phase is Phase.DONE
        assert await store.claim("s", record(stream="msg_9"), 30) is None
        assert await store.complete("s", (await store.claim("s", record(), 30)).token, STREAM, 60)
        assert (await store.claim("s", record(), 30)).reply == STREAM
        await store.close()

    asyncio.run(run())


def test_release_frees_the_key_for_a_new_attempt(make_store):
    async def run():
        store = make_store()
        first = record()
        await store.claim("k", first, 30)
        await store.release("k", "not-the-token")
        assert await store.claim("k", record(), 30) is not None  # still held
        await store.release("k", first.token)
        assert await store.claim("k", record(), 30) is None
        await store.close()

    asyncio.run(run())


def test_concurrent_claims_have_exactly_one_winner(make_store):
    async def run():
        stores = [make_store() for _ in range(2)]  # for redis: two clients, as two replicas
        if isinstance(stores[0], MemoryIdempotencyStore):
            stores = [stores[0], stores[0]]
        results = await asyncio.gather(*(stores[i % 2].claim("race", record(), 30) for i in range(20)))
        assert sum(r is None for r in results) == 1
        for s in {id(s): s for s in stores}.values():
            await s.close()

    asyncio.run(run())


def test_a_claim_whose_lease_is_not_renewed_expires(make_store):
    """A gateway that died mid-request stops renewing: its key frees itself within a lease."""

    async def run():
        store = make_store()
        gone = record()
        assert await store.claim("k", gone, 0.2) is None
        for _ in range(400):  # generous: the lease is 0.2 s on the store's own clock
            if await store.claim("k", record(), 0.2) is None:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the lease never expired")
        assert not await store.complete("k", gone.token, REPLY, 60)  # the late attempt cannot overwrite
        await store.close()

    asyncio.run(run())


def test_memory_store_leases_ttl_and_bounds_on_its_clock():
    async def run():
        clock = FakeClock(0.0)
        store = MemoryIdempotencyStore(max_entries=3, max_bytes=10_000, clock=clock)
        holder = record()
        await store.claim("run", holder, 30)
        clock.t = 20
        await store.renew("run", holder.token, 30)
        clock.t = 45
        assert await store.claim("run", record(), 30) is not None  # renewed: still held at 45
        for i in range(4):
            r = record()
            await store.claim(f"d{i}", r, 30)
            await store.complete(f"d{i}", r.token, REPLY, 100)
        assert await store.claim("d0", record(), 30) is None  # the oldest reply went first
        assert (await store.claim("run", record(), 30)).phase is Phase.RUNNING  # a running claim is never evicted
        big = record()
        await store.claim("big", big, 30)
        await store.complete("big", big.token, StoredReply(200, body="x" * 20_000), 100)
        assert store.bytes <= 10_000
        clock.t = 1000  # past every TTL
        assert await store.claim("d3", record(), 30) is None and len(store) <= 3

    asyncio.run(run())


def _coordinator(store, **kw) -> Idempotency:
    return Idempotency(store, MemoryReplayLog(), ttl_s=60, **kw)


def test_begin_decides_run_replay_follow_conflict_and_mismatch():
    async def run():
        replay = MemoryReplayLog()
        idem = Idempotency(MemoryIdempotencyStore(), replay, ttl_s=60)
        fp = fingerprint("/v1/messages", {"a": 1, "b": [1, 2]})
        assert fp == fingerprint("/v1/messages", {"b": [1, 2], "a": 1})  # canonical: key order does not matter
        assert fp != fingerprint("/v1/chat/completions", {"a": 1, "b": [1, 2]})
        first = await idem.begin("acme", "k", fp, None, 1)
        assert first.action is Action.RUN and first.keyed
        with pytest.raises(ServingError) as info:
            await idem.begin("acme", "k", fp, None, 0)  # still running, no time to wait
        assert info.value.kind is ErrorKind.CONFLICT
        with pytest.raises(ServingError) as info:
            await idem.begin("acme", "k", "another body", None, 0)
        assert info.value.kind is ErrorKind.UNPROCESSABLE
        other_tenant = await idem.begin("zeta", "k", fp, None, 0)
        assert other_tenant.action is Action.RUN
        waiting = asyncio.ensure_future(idem.begin("acme", "k", fp, None, 30))
        await asyncio.sleep(0)
        await first.complete(REPLY)
        assert (await waiting).action is Action.REPLAY and (await waiting).reply == REPLY
        await other_tenant.release()

        stream = await idem.begin("acme", "s", fp, "msg_s", 1)
        pending = asyncio.ensure_future(idem.begin("acme", "s", fp, "msg_s", 30))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not pending.done()  # its log is not open yet: nothing to follow
        await replay.open("msg_s", "acme")
        following = await pending
        assert following.action is Action.FOLLOW and following.stream_id == "msg_s"
        await stream.release()

    asyncio.run(run())


def test_a_store_that_is_down_fails_open_or_closed():
    async def run():
        down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
        opened = await _coordinator(RedisIdempotencyStore(down)).begin("t", "k", "fp", None, 1)
        assert opened.action is Action.RUN and not opened.keyed  # runs, unprotected (logged)
        with pytest.raises(ServingError) as info:
            await _coordinator(RedisIdempotencyStore(down), on_store_error="closed").begin("t", "k", "fp", None, 1)
        assert info.value.kind is ErrorKind.OVERLOADED and info.value.retry_after_s

    asyncio.run(run())


def test_two_replicas_share_keys_through_redis(redis_server):
    async def run():
        prefix = f"x{uuid.uuid4().hex[:8]}"
        replay = MemoryReplayLog()
        a = Idempotency(RedisIdempotencyStore(redis_server.url, prefix=prefix), replay, ttl_s=60)
        b = Idempotency(RedisIdempotencyStore(redis_server.url, prefix=prefix), replay, ttl_s=60)
        first = await a.begin("acme", "k", "fp", None, 1)
        retry = asyncio.ensure_future(b.begin("acme", "k", "fp", None, 30))
        await asyncio.sleep(0.1)
        assert not retry.done()
        await first.complete(REPLY)
        got = await retry
        assert got.action is Action.REPLAY and got.reply == REPLY
        await a.close()
        await b.close()

    asyncio.run(run())
