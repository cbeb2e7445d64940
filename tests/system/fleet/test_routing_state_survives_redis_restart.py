"""The live routing state outlives a Redis that restarts empty (a real redis-server, stopped and
started again on the same port without persistence).

Two followers on two store clients are two gateways. After an operator's weights (revision r)
reached both, Redis restarts with nothing: the first gateway to poll finds the store empty and
writes its snapshot back with its revisions; the other reads it back; neither ever routes by the
fleet file's `traffic` instead. A writer's compare-and-set on revision r still holds after the
restart (a rollout in progress goes on)."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError

from sluice.routing.state.follower import StateFollower
from sluice.routing.state.redis_store import RedisRoutingStateStore
from sluice.routing.state.routing_state import ModelRoutingState
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow
WEIGHTS = {"v1": 20.0, "v2": 80.0}


@pytest.fixture()
def redis():
    server = RedisServer()  # this test's own: it is restarted below
    yield server
    server.stop()


async def reconnected(call):
    """The call's result once the client reconnects (a pooled connection from before the restart
    fails once)."""
    for _ in range(50):
        try:
            return await call()
        except ConnectionError:
            await asyncio.sleep(0.05)
    return await call()


async def poll_until(follower: StateFollower, check, what: str, tries: int = 400) -> None:
    """Poll until `check()` holds (store errors while Redis restarts are kept quiet by the follower)."""
    for _ in range(tries):
        await follower.poll_once()
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


@pytest.mark.asyncio
async def test_gateways_put_the_live_weights_back_into_a_redis_restarted_empty(redis):
    stores = [RedisRoutingStateStore(redis.url), RedisRoutingStateStore(redis.url)]
    a, b = (StateFollower(s) for s in stores)
    try:
        await stores[0].put("m", ModelRoutingState(weights=dict(WEIGHTS)))
        written = await stores[0].put("m", ModelRoutingState(weights=dict(WEIGHTS)))  # revision 2
        for f in (a, b):
            assert await f.poll_once() and f.snapshot.model("m").weights == WEIGHTS
        revision = a.snapshot.revision

        redis.restart_empty()
        assert await reconnected(stores[1].revision) == 0  # nothing survived in Redis itself

        for _ in range(200):  # gateway A finds the store empty and writes its snapshot back
            await a.poll_once()
            if await reconnected(stores[1].revision) == revision:
                break
            await asyncio.sleep(0.05)
        assert await stores[1].revision() == revision, "the state was not restored"
        assert a.restores == 1 and a.snapshot.model("m").weights == WEIGHTS
        restored = await stores[1].load()
        assert restored.model("m").weights == WEIGHTS and restored.model("m").revision == written.revision
        for _ in range(5):  # B keeps routing by the operator's weights, never the file's traffic
            await b.poll_once()
            assert b.snapshot.model("m").weights == WEIGHTS and b.snapshot.revision == revision
        assert b.restores == 0  # one restore: B found the store already holding the state

        # a writer that read revision r before the restart still wins its compare-and-set
        moved = await stores[1].put("m", ModelRoutingState(weights={"v2": 100.0}), expect_revision=written.revision)
        assert moved.revision == written.revision + 1
        for f in (a, b):
            await poll_until(f, lambda f=f: f.snapshot.model("m").weights == {"v2": 100.0}, "the new weights")
    finally:
        for s in stores:
            await s.close()
