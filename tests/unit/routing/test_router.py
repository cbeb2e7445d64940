"""The fleet router end to end over real components: registry, pool, breakers, quotas, state."""

from __future__ import annotations

import pytest

from sluice.routing.dispatch.circuit_breaker import BreakerConfig, Outcome
from sluice.routing.dispatch.router import FallbackReason, FleetRouter
from sluice.routing.dispatch.worker_picker import PickReason
from sluice.routing.dispatch.worker_pool import WorkerPool, WorkerStatus
from sluice.routing.errors import (
    ModelUnavailableError,
    PinNotAllowedError,
    QuotaExceededError,
    UnknownModelError,
    UnknownVersionError,
    VersionUnavailableError,
)
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.quota.memory_store import MemoryQuotaStore
from sluice.routing.state.routing_state import ModelRoutingState, RoutingSnapshot, VersionState
from tests.clock import FakeClock
from tests.routing_calls import RouteRequest, finish, route, user_key

FLEET = """\
[models.main]
aliases = ["claude-sonnet-4-5"]
fallbacks = ["backup"]
[models.main.tiers.free]
quota = { tokens = 1000, period = "day", mode = "soft" }
[models.main.tiers.standard]
quota = { tokens = 1000, period = "day", mode = "hard" }
[models.main.tiers.priority]
allow_pin = true
[models.main.versions.stable]
weights = "bundled"
traffic = 80
workers = ["h:1", "h:2"]
[models.main.versions.canary]
weights = "bundled"
traffic = 20
workers = ["h:3"]

[models.backup.versions.v1]
weights = "bundled"
traffic = 100
workers = ["h:9"]
"""


class Fleet:
    """A router over warm workers named after their addresses."""

    def __init__(self, fleet_text: str = FLEET) -> None:
        self.clock = FakeClock(1_800_000_000.0)
        self.registry = Registry(parse_fleet(fleet_text))
        self.pool = WorkerPool(BreakerConfig(consecutive_failures=2, cooldown_s=5), self.clock)
        for model_id, model in self.registry.fleet.models.items():
            for name, version in model.versions.items():
                for addr in version.workers:
                    self.pool.add(addr, model_id, name, addr, status=WorkerStatus.WARM)
        self.quota = MemoryQuotaStore(self.clock)
        self.snapshot = RoutingSnapshot()
        self.router = FleetRouter(self.registry, self.pool, self.quota, lambda: self.snapshot)

    def request(self, user: str = "u1", model: str = "main", tier: str = "priority", **kw) -> RouteRequest:
        return RouteRequest(model, "acme", tier, user_key("acme", user), list(range(64)), 100, **kw)


@pytest.mark.asyncio
async def test_routes_by_sticky_weight_and_reports_the_version():
    f = Fleet()
    versions = {}
    for i in range(400):
        d = await route(f.router, f.request(f"user{i}", model="claude-sonnet-4-5"))
        assert d.model_id == "main" and d.fallback_from is None
        # one prompt prefix: placed on a worker the first time each version sees it, then kept there
        first_time = d.version not in versions.values()
        assert d.pick.reason is (PickReason.NEW_PREFIX if first_time else PickReason.AFFINITY)
        assert d.version_header == f"main/{d.version}"
        versions[i] = d.version
        await finish(f.router, d, Outcome.SUCCESS, 50)
    canary = sum(v == "canary" for v in versions.values()) / 400
    assert 0.14 < canary < 0.26
    for i in range(400):  # sticky
        d = await route(f.router, f.request(f"user{i}"))
        assert d.version == versions[i]
        await finish(f.router, d, Outcome.SUCCESS, 50)
    with pytest.raises(UnknownModelError):
        await route(f.router, f.request(model="gpt-9"))


@pytest.mark.asyncio
async def test_pins():
    f = Fleet()
    d = await route(f.router, f.request(pin="main/canary"))
    assert (d.model_id, d.version) == ("main", "canary")
    with pytest.raises(PinNotAllowedError):
        await route(f.router, f.request(tier="free", pin="main/canary"))
    with pytest.raises(UnknownVersionError):
        await route(f.router, f.request(pin="main/v7"))
    f.snapshot = RoutingSnapshot(1, {"main": ModelRoutingState(versions={"canary": VersionState.DRAINING})})
    with pytest.raises(VersionUnavailableError, match="draining"):
        await route(f.router, f.request(pin="canary"))


@pytest.mark.asyncio
async def test_live_state_overrides_the_file():
    f = Fleet()
    f.snapshot = RoutingSnapshot(1, {"main": ModelRoutingState(weights={"stable": 0, "canary": 100})})
    assert {(await route(f.router, f.request(f"u{i}"))).version for i in range(50)} == {"canary"}
    f.snapshot = RoutingSnapshot(2, {"main": ModelRoutingState(versions={"canary": VersionState.DRAINING})})
    assert {(await route(f.router, f.request(f"u{i}"))).version for i in range(50)} == {"stable"}


@pytest.mark.asyncio
async def test_failing_workers_are_ejected_then_the_model_falls_back():
    f = Fleet()
    for _ in range(3):
        for addr in ("h:1", "h:2", "h:3"):
            d = f.pool.begin(addr, 10)
            if d is not None:
                f.pool.finish(d, Outcome.TIMEOUT)  # hung: deadlines expire
    d = await route(f.router, f.request())
    assert (d.model_id, d.fallback_from, d.fallback_reason) == ("backup", "main", FallbackReason.UNAVAILABLE)
    f.clock.t += 5  # the circuits half-open: one probe each
    d = await route(f.router, f.request())
    assert d.model_id == "main" and d.dispatch.permit.probe
    await finish(f.router, d, Outcome.SUCCESS, 10)  # that worker is back
    d2 = await route(f.router, f.request("someone-else"))
    assert d2.model_id == "main"


@pytest.mark.asyncio
async def test_retry_excludes_the_workers_already_tried():
    f = Fleet()
    d = await route(f.router, f.request(pin="main/stable"))
    d2 = await route(f.router, f.request(pin="main/stable", exclude_workers={d.worker_id}))
    assert {d.worker_id, d2.worker_id} == {"h:1", "h:2"}
    with pytest.raises(VersionUnavailableError):
        await route(f.router, f.request(pin="main/stable", exclude_workers={"h:1", "h:2"}))


@pytest.mark.asyncio
async def test_unavailable_everywhere_is_a_529():
    f = Fleet()
    for w in ("h:1", "h:2", "h:3", "h:9"):
        f.pool.set_status(w, WorkerStatus.DRAINING)
    with pytest.raises(ModelUnavailableError, match="'main' and its fallbacks"):
        await route(f.router, f.request())


@pytest.mark.asyncio
async def test_soft_quota_falls_back_with_a_warning_and_hard_quota_is_a_429():
    f = Fleet()
    d = await route(f.router, f.request(tier="free"))  # reserves 100
    await finish(f.router, d, Outcome.SUCCESS, 1000)  # actually used 1000: the day's quota
    assert (await f.quota.usage("acme", "main", f.registry.model("main").tier_policy("free").quota)).used == 1000
    d = await route(f.router, f.request(tier="free"))
    assert (d.model_id, d.fallback_from, d.fallback_reason, d.soft_exceeded) == (
        "backup",
        "main",
        FallbackReason.QUOTA,
        ("main",),
    )
    f.pool.set_status("h:9", WorkerStatus.DRAINING)  # no fallback left: soft never refuses
    d = await route(f.router, f.request(tier="free"))
    assert d.model_id == "main" and d.soft_exceeded == ("main",) and d.quota.reservation is not None

    # the counter is the tenant's on the model, whatever the tier; the tier sets limit and mode
    with pytest.raises(QuotaExceededError) as exc:
        await route(f.router, f.request(tier="standard"))
    assert exc.value.model_id == "main" and 0 < exc.value.retry_after_s <= 86400
    f.pool.set_status("h:9", WorkerStatus.WARM)
    with pytest.raises(QuotaExceededError):  # hard: no fallback, even with one available
        await route(f.router, f.request(tier="standard"))
    other = RouteRequest("main", "other-tenant", "standard", "k", list(range(64)), 100)
    assert (await route(f.router, other)).model_id == "main"


@pytest.mark.asyncio
async def test_a_failing_quota_store_admits():
    class DownStore(MemoryQuotaStore):
        async def acquire(self, *a, **kw):
            raise ConnectionError("redis down")

    f = Fleet()
    f.router.quota = DownStore()
    d = await route(f.router, f.request(tier="standard"))
    assert d.model_id == "main" and d.quota is None and f.router.quota_errors == 1


@pytest.mark.asyncio
async def test_load_moves_a_prefix_off_a_busy_worker():
    f = Fleet()
    first = await route(f.router, f.request(pin="main/stable"))
    f.pool.report_load(first.worker_id, 100_000)  # that worker is swamped (seen in its stats)
    d = await route(f.router, f.request(pin="main/stable"))
    assert d.worker_id != first.worker_id and d.pick.reason is PickReason.SPILL


@pytest.mark.asyncio
async def test_round_robin_takes_turns_where_affinity_sticks():
    """`worker_choice = "round_robin"` (the affinity benchmark's baseline): one prompt prefix
    alternates over the version's workers; with affinity it stays on one."""
    affinity = Fleet()
    rr = Fleet('[routing]\nworker_choice = "round_robin"\n' + FLEET)
    for f, expect in ((affinity, 1), (rr, 2)):
        seen = []
        for i in range(6):
            d = await route(f.router, f.request(f"u{i}", model="main", pin="stable"))
            seen.append(d.worker_id)
            await finish(f.router, d, Outcome.SUCCESS, 10)
        assert len(set(seen)) == expect
        if f is rr:
            assert seen == ["h:1", "h:2"] * 3 and d.pick.reason is PickReason.ROUND_ROBIN


@pytest.mark.asyncio
async def test_tenants_are_balanced_and_a_lost_cache_is_forgotten():
    """New prefixes spread over the version's workers by count; a worker that goes down, is
    seen to restart, or leaves loses its prefixes, which are placed afresh."""
    f = Fleet()
    homes = {}
    for t in range(8):
        d = await route(
            f.router, RouteRequest("main", f"tenant-{t}", "priority", "k", list(range(64)), 100, pin="stable")
        )
        homes[t] = d.worker_id
        await finish(f.router, d, Outcome.SUCCESS, 10)
    assert f.router.prefix_groups() == {"h:1": 4, "h:2": 4}
    for lose in (
        lambda: f.pool.mark_restarted("h:1"),
        lambda: f.pool.set_status("h:1", WorkerStatus.STARTING),
        lambda: f.pool.remove("h:1"),
    ):
        lose()
        assert f.router.prefix_groups() == {"h:2": 4}
        f.pool.remove("h:1")
        f.pool.add("h:1", "main", "stable", "h:1", status=WorkerStatus.WARM)
        for t in range(8):  # h:2's tenants stay; h:1's are placed afresh, on h:1 (it has fewer)
            d = await route(
                f.router, RouteRequest("main", f"tenant-{t}", "priority", "k", list(range(64)), 100, pin="stable")
            )
            assert d.worker_id == homes[t]
            assert d.pick.reason is (PickReason.NEW_PREFIX if homes[t] == "h:1" else PickReason.AFFINITY)
            await finish(f.router, d, Outcome.SUCCESS, 10)
        assert f.router.prefix_groups() == {"h:1": 4, "h:2": 4}
