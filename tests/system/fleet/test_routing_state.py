"""Shared live routing state: memory and Redis stores, compare-and-set, and followers.

The Redis cases run two store instances (two gateways) against one real redis-server.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from sluice.routing.errors import StateConflictError
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.schema import RolloutSpec
from sluice.routing.state.follower import StateFollower
from sluice.routing.state.redis_store import RedisRoutingStateStore
from sluice.routing.state.rollout import Rollout, RolloutSignals
from sluice.routing.state.routing_state import (
    MemoryRoutingStateStore,
    ModelRoutingState,
    RoutingSnapshot,
    VersionState,
    effective_weights,
    leading_version,
)

FLEET = parse_fleet("""\
[models.m.versions.v1]
weights = "bundled"
traffic = 90
replicas = 1
[models.m.versions.v2]
weights = "bundled"
traffic = 10
replicas = 1
[models.m.versions.v3]
weights = "bundled"
replicas = 1
""")


@pytest.fixture(params=["memory", "redis"])
def two_stores(request):
    """Two handles on one shared state (two gateways)."""

    def make():
        if request.param == "memory":
            store = MemoryRoutingStateStore()
            return store, store
        url = request.getfixturevalue("redis_server").url
        prefix = f"t{uuid.uuid4().hex}"
        return RedisRoutingStateStore(url, prefix), RedisRoutingStateStore(url, prefix)

    return make


def test_effective_weights():
    model = FLEET.models["m"]
    assert effective_weights(model, ModelRoutingState()) == {"v1": 90, "v2": 10, "v3": 0}
    live = ModelRoutingState(weights={"v1": 50, "v3": 50, "gone": 1}, versions={"v3": VersionState.DRAINING})
    assert effective_weights(model, live) == {"v1": 50, "v2": 0}  # v3 draining; "gone" not in the file
    assert RoutingSnapshot().model("m") == ModelRoutingState()


def test_leading_version_follows_the_live_weights():
    """The version count_tokens, /tokenize and /detokenize use: the heaviest of the weights
    generation chooses by, so a retired or drained-away version is never it."""
    model = FLEET.models["m"]
    assert leading_version(model, ModelRoutingState()) == "v1"  # the file's traffic
    assert leading_version(model, ModelRoutingState(weights={"v1": 10, "v2": 90})) == "v2"
    retired = ModelRoutingState(weights={"v1": 90, "v2": 10}, versions={"v1": VersionState.RETIRED})
    assert leading_version(model, retired) == "v2"
    nothing = ModelRoutingState(weights={"v1": 100}, versions={"v1": VersionState.DRAINING})
    assert leading_version(model, nothing) == "v1"  # no active weight: the file's heaviest


@pytest.mark.asyncio
async def test_put_load_revisions_and_compare_and_set(two_stores):
    a, b = two_stores()
    try:
        assert await a.revision() == 0 and (await a.load()).models == {}
        s1 = await a.put("m", ModelRoutingState(weights={"v1": 80, "v2": 20}), expect_revision=0)
        assert s1.revision == 1 and s1.updated_at > 0
        snap = await b.load()
        assert snap.revision == await b.revision() == 1
        assert snap.models["m"].weights == {"v1": 80, "v2": 20} and snap.models["m"].revision == 1
        # both gateways read revision 1 and try to write: exactly one wins
        await b.put("m", ModelRoutingState(weights={"v1": 0, "v2": 100}), expect_revision=1)
        with pytest.raises(StateConflictError, match="at revision 2, not 1"):
            await a.put("m", ModelRoutingState(weights={"v1": 100}), expect_revision=1)
        assert (await a.load()).models["m"].weights == {"v1": 0, "v2": 100}
        await a.put("other", ModelRoutingState(versions={"x": VersionState.RETIRED}))  # unconditional
        await a.delete("m")
        snap = await b.load()
        assert set(snap.models) == {"other"} and snap.models["other"].state_of("x") is VersionState.RETIRED
        assert snap.revision == 4
        with pytest.raises(StateConflictError):  # the revision survives the delete: stale CAS still fails
            await b.put("m", ModelRoutingState(), expect_revision=0)
        assert (await b.put("m", ModelRoutingState(), expect_revision=3)).revision == 4
    finally:
        await a.close()
        if b is not a:
            await b.close()


@pytest.mark.asyncio
async def test_a_rollout_started_on_one_gateway_is_followed_by_another(two_stores) -> None:
    a, b = two_stores()
    seen: list[RoutingSnapshot] = []
    changed = asyncio.Event()

    def on_change(snap: RoutingSnapshot) -> None:
        seen.append(snap)
        changed.set()

    follower = StateFollower(b, on_change, interval_s=0.05)
    task = asyncio.create_task(follower.run())
    try:
        await asyncio.wait_for(changed.wait(), 10)  # the first poll loads the (empty) state
        changed.clear()
        plan = RolloutSpec(steps=[10, 50, 100], step_interval_s=60)
        rollout = Rollout.start("m", "v3", {"v1": 90, "v2": 10, "v3": 0}, plan, 1000.0)
        rollout.tick(1000.0, RolloutSignals(target_warm=True))

        def state(r: Rollout) -> ModelRoutingState:
            return ModelRoutingState(weights=r.weights(), versions=r.version_states(), rollout=r.to_dict())

        stored = await a.put("m", state(rollout), expect_revision=0)
        await asyncio.wait_for(changed.wait(), 10)  # generous: the test must not depend on speed
        followed = follower.snapshot.model("m")
        assert effective_weights(FLEET.models["m"], followed) == {"v1": 81, "v2": 9, "v3": 10}
        assert followed.rollout is not None
        assert Rollout.from_dict(followed.rollout) == rollout  # another gateway could take it over
        changed.clear()
        rollout.tick(1060.0, RolloutSignals(target_warm=True))
        await a.put("m", state(rollout), expect_revision=stored.revision)
        await asyncio.wait_for(changed.wait(), 10)
        assert effective_weights(FLEET.models["m"], follower.snapshot.model("m"))["v3"] == 50
        assert [s.revision for s in seen] == [0, 1, 2]  # one load per change, none in between
    finally:
        follower.stop()
        await asyncio.wait_for(task, 10)
        await a.close()
        if b is not a:
            await b.close()


class FlakyStore(MemoryRoutingStateStore):
    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def revision(self) -> int:
        if self.down:
            raise ConnectionError("redis down")
        return await super().revision()


@pytest.mark.asyncio
async def test_follower_keeps_its_snapshot_while_the_store_is_down():
    store = FlakyStore()
    await store.put("m", ModelRoutingState(weights={"v1": 1}))
    follower = StateFollower(store)
    assert await follower.poll_once() and follower.snapshot.revision == 1
    assert not await follower.poll_once()  # nothing changed: no reload
    store.down = True
    assert not await follower.poll_once() and follower.errors == 1
    assert follower.snapshot.model("m").weights == {"v1": 1}
    store.down = False
    await store.put("m", ModelRoutingState(weights={"v1": 2}))
    assert await follower.poll_once() and follower.snapshot.model("m").weights == {"v1": 2}


@pytest.mark.asyncio
async def test_store_factory(redis_server):
    from sluice.routing.state.stores import make_routing_state_store

    assert isinstance(make_routing_state_store("memory"), MemoryRoutingStateStore)
    store = make_routing_state_store("redis", redis_server.url)
    other = RedisRoutingStateStore(redis_server.url)  # another gateway on the same Redis
    try:
        assert isinstance(store, RedisRoutingStateStore)
        before = await other.revision()
        await store.put("m", ModelRoutingState(weights={"v1": 3}))
        assert await other.revision() == before + 1
        assert (await other.load()).model("m").weights == {"v1": 3}
    finally:
        await store.close()
        await other.close()
    with pytest.raises(ValueError, match="unknown routing state store"):
        make_routing_state_store("etcd")


@pytest.mark.asyncio
async def test_a_follower_writes_its_snapshot_back_into_a_store_found_empty():
    store = MemoryRoutingStateStore()
    follower = StateFollower(store)
    await store.put("m", ModelRoutingState(weights={"v1": 1, "v2": 3}))
    await store.put("m", ModelRoutingState(weights={"v1": 1, "v2": 3}))
    assert await follower.poll_once() and follower.snapshot.revision == 2
    follower.store = empty = MemoryRoutingStateStore()  # the store lost everything (a restart)
    assert not await follower.poll_once()  # nothing new to take: its own snapshot went back
    assert follower.restores == 1 and await empty.revision() == 2
    assert (await empty.load()).model("m").weights == {"v1": 1, "v2": 3}
    assert not await empty.restore(RoutingSnapshot(5))  # only into an empty store
    await empty.put("m", ModelRoutingState(weights={"v2": 1}), expect_revision=2)  # CAS goes on
