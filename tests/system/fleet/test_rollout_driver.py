"""Rollouts through the shared state: one gateway drives, another follows and may abort."""

from __future__ import annotations

import uuid

import pytest

from sluice.routing.errors import RolloutError
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.fleet_file.schema import RolloutSpec
from sluice.routing.state.redis_store import RedisRoutingStateStore
from sluice.routing.state.rollout import RolloutPhase, RolloutSignals
from sluice.routing.state.rollout_driver import RolloutDriver
from sluice.routing.state.routing_state import MemoryRoutingStateStore, VersionState, effective_weights
from tests.clock import FakeClock

FLEET = """\
[rollout]
steps = [20, 100]
step_interval_s = 10
min_requests = 5
[models.m.versions.v1]
weights = "bundled"
traffic = 100
replicas = 1
[models.m.versions.v2]
weights = "bundled"
replicas = 1
[models.m.versions.old]
weights = "bundled"
replicas = 1
"""
WARM = RolloutSignals(target_warm=True)


@pytest.fixture(params=["memory", "redis"])
def stores(request):
    def make():
        if request.param == "memory":
            s = MemoryRoutingStateStore()
            return s, s
        url = request.getfixturevalue("redis_server").url
        prefix = f"t{uuid.uuid4().hex}"
        return RedisRoutingStateStore(url, prefix), RedisRoutingStateStore(url, prefix)

    return make


def positive(weights: dict[str, float]) -> dict[str, float]:
    return {v: w for v, w in weights.items() if w > 0}


async def weights_seen_by(store, registry) -> dict[str, float]:
    """The traffic a gateway reading `store` would send (versions with weight > 0)."""
    return positive(effective_weights(registry.model("m"), (await store.load()).model("m")))


@pytest.mark.asyncio
async def test_one_gateway_drives_another_follows(stores):
    a, b = stores()
    reg = Registry(parse_fleet(FLEET))
    clock = FakeClock(100.0)
    driver = RolloutDriver(a, reg, clock)
    try:
        r = await driver.start("m", "v2")
        assert r.phase is RolloutPhase.WARMING
        with pytest.raises(RolloutError, match="still running"):
            await RolloutDriver(b, reg, clock).start("m", "v2")
        assert (await b.load()).model("m").state_of("v2") is VersionState.WARMING
        await driver.tick("m", WARM)
        assert await weights_seen_by(b, reg) == {"v1": 80, "v2": 20}
        clock.t += 10
        await driver.tick("m", WARM)
        state = (await b.load()).model("m")
        assert state.state_of("v1") is VersionState.DRAINING and positive(effective_weights(reg.model("m"), state)) == {
            "v2": 100
        }
        clock.t += 10
        r = await driver.tick("m", RolloutSignals(target_warm=True, sources_inflight=0))
        assert r.phase is RolloutPhase.DONE and "m" not in driver.rollouts
        state = (await b.load()).model("m")
        assert state.state_of("v1") is VersionState.RETIRED and state.rollout["phase"] == "done"
        assert state.state_of("old") is VersionState.ACTIVE  # not part of this rollout
        await RolloutDriver(b, reg, clock).start("m", "v1")  # finished: a new one may start
    finally:
        await a.close()
        if b is not a:
            await b.close()


@pytest.mark.asyncio
async def test_breach_and_remote_abort_roll_back(stores):
    a, b = stores()
    reg = Registry(parse_fleet(FLEET))
    clock = FakeClock(100.0)
    driver = RolloutDriver(a, reg, clock)
    try:
        await driver.start("m", "v2")
        await driver.tick("m", WARM)
        await driver.observe("m", "v1", ok=False)  # the old version's errors do not count
        for _ in range(4):
            await driver.observe("m", "v2", ok=False)
        assert await weights_seen_by(b, reg) == {"v1": 80, "v2": 20}  # 4 < min_requests
        await driver.observe("m", "v2", ok=False)  # the 5th: breach, written at once
        state = (await b.load()).model("m")
        assert state.rollout["phase"] == "rolling_back" and "error rate 1.00" in state.rollout["reason"]
        assert await weights_seen_by(b, reg) == {"v1": 100}
        r = await driver.tick("m", RolloutSignals(target_inflight=2))
        assert r.phase is RolloutPhase.ROLLING_BACK  # v2 still finishing two requests
        r = await driver.tick("m", RolloutSignals(target_inflight=0))
        assert r.phase is RolloutPhase.ROLLED_BACK

        # a second rollout, aborted from the other gateway; the driver adopts the abort
        await driver.start("m", "v2")
        await driver.tick("m", WARM)
        other = RolloutDriver(b, reg, clock)
        aborted = await other.abort("m", "operator says no")
        assert aborted.phase is RolloutPhase.ROLLING_BACK
        r = await driver.tick("m", RolloutSignals(target_inflight=1))
        assert r.phase is RolloutPhase.ROLLING_BACK and r.reason == "operator says no"
        assert await weights_seen_by(a, reg) == {"v1": 100}
        r = await driver.tick("m", RolloutSignals(target_inflight=0))
        assert r.phase is RolloutPhase.ROLLED_BACK
        state = (await b.load()).model("m")
        assert state.state_of("v2") is VersionState.RETIRED and state.rollout["reason"] == "operator says no"
    finally:
        await a.close()
        if b is not a:
            await b.close()


@pytest.mark.asyncio
async def test_a_new_driver_adopts_an_orphaned_rollout():
    store = MemoryRoutingStateStore()
    reg = Registry(parse_fleet(FLEET))
    clock = FakeClock(100.0)
    await RolloutDriver(store, reg, clock).start("m", "v2", RolloutSpec(steps=[50, 100], step_interval_s=10))
    heir = RolloutDriver(store, reg, clock)
    r = await heir.adopt("m")
    assert r is not None and r.target == "v2"
    await heir.tick("m", WARM)
    assert await weights_seen_by(store, reg) == {"v1": 50, "v2": 50}
    assert await RolloutDriver(store, reg, clock).adopt("nobody") is None
