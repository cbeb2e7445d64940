"""The fleet's operations in one process: a real Fleet, router, rollout driver, serving pipeline
and admin API (over ASGI), with scripted engines (tests/fake_engine.py) as its remote workers
and the tiny test model's tokenizer — no model, no worker processes.

Covers what the real-process tests (test_fleet_ops.py, test_fleet_rollout.py) cannot force
deterministically: validation and compare-and-set of weights, rollout and rollback refusals,
a rollout to a version whose every request is rescued elsewhere still rolling back, reloads
(remote workers joining and leaving, invalid files and running versions' identity refused),
the admin API's guard and error shapes, and the replica goals."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from sluice.config import load_settings
from sluice.errors import EngineRefusedError
from sluice.gateway.principal import Principal
from sluice.routing.dispatch.worker_pool import WorkerStatus
from sluice.routing.errors import StateConflictError
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.fleet_file.schema import VersionSpec
from sluice.routing.state.replica_plan import ReplicaGoal, replica_goal
from sluice.routing.state.routing_state import VersionState
from sluice.serving.errors import ErrorKind
from sluice.serving.fleet_admin import AdminError, FleetAdmin
from sluice.serving.outcomes import Finished
from sluice.serving.output_budget import OutputBudget
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.serving.runtime import ServingRuntime
from tests.fake_engine import FakeEngine, Script

ADMIN = "admin-key-for-tests-0123"


def fleet_text(weights: str, *, v1_workers: str = '"10.0.0.1:1"', extra: str = "") -> str:
    return f"""
[rollout]
steps = [50, 100]
step_interval_s = 3600
min_requests = 3
[models.m]
[models.m.versions.v1]
weights = "{weights}"
traffic = 100
workers = [{v1_workers}]
[models.m.versions.v2]
weights = "{weights}"
workers = ["10.0.0.2:1"]
{extra}"""


class Harness:
    def __init__(self, tmp_path, tiny_dir, engines: dict[str, FakeEngine] | None = None):
        self.path = tmp_path / "fleet.toml"
        self.tiny = str(tiny_dir)
        self.path.write_text(fleet_text(self.tiny))
        self.engines = engines or {}
        self.settings = load_settings(
            None, safety=False, fleet=str(self.path), admin_key=ADMIN, health_check_interval_s=3600
        )

    async def __aenter__(self) -> Harness:
        self.fleet = Fleet.build(self.settings, Registry.from_file(self.path))
        self.fleet.tick_s = 3600  # the tests tick by hand
        await self.fleet.start(client_for=lambda addr: self.engines.setdefault(addr, FakeEngine()))
        self.rt = ServingRuntime(self.settings)
        self.rt.mark_ready(self.fleet, 4096)
        self.admin = FleetAdmin(self.fleet)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.fleet.close()

    def write(self, text: str) -> None:
        self.path.write_text(text)


def run(coro):
    return asyncio.run(coro)


def request(i: int, user: str) -> ServingRequest:
    return ServingRequest(
        request_id=f"msg_{i}",
        route=Route.MESSAGES,
        principal=Principal(),
        model="m",
        conversation=Conversation([Turn(Role.USER, ["hello"])]),
        budget=OutputBudget(4),
        affinity_user=user,
    )


# -- weights ----------------------------------------------------------------------------------
def test_weights_are_checked_merged_and_shared(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            for model, weights, kind in [
                ("nope", {"v1": 1}, ErrorKind.NOT_FOUND),
                ("m", {"v9": 1}, ErrorKind.INVALID_REQUEST),
                ("m", {"v2": -1}, ErrorKind.INVALID_REQUEST),
                ("m", {"v2": math.nan}, ErrorKind.INVALID_REQUEST),
                ("m", {"v1": 0}, ErrorKind.INVALID_REQUEST),
                ("m", {}, ErrorKind.INVALID_REQUEST),
            ]:
                with pytest.raises(AdminError) as info:
                    await h.admin.set_weights(model, weights)
                assert info.value.kind is kind, (model, weights)
            assert h.fleet.follower.snapshot.model("m").weights == {}  # nothing was written
            r = await h.admin.set_weights("m", {"v2": 100})  # v1 keeps its 100
            assert r["weights"] == {"v1": 100.0, "v2": 100.0}
            assert h.fleet.status()["models"]["m"]["versions"]["v2"]["share"] == 50.0
            assert await h.fleet.state_store.load() == await h.fleet.state_store.load()  # stored, not only local

    run(go())


class FlakyStore:
    """The fleet's store, with the first `conflicts` writes lost to another gateway."""

    def __init__(self, inner, conflicts: int):
        self.inner, self.conflicts = inner, conflicts

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def put(self, *a, **kw):
        if self.conflicts:
            self.conflicts -= 1
            raise StateConflictError("someone else wrote")
        return await self.inner.put(*a, **kw)


def test_a_lost_compare_and_set_is_retried_then_reported_as_a_conflict(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            inner = h.fleet.state_store
            h.fleet.state_store = FlakyStore(inner, 2)
            assert (await h.admin.set_weights("m", {"v2": 10}))["weights"]["v2"] == 10.0
            h.fleet.state_store = FlakyStore(inner, 100)
            with pytest.raises(AdminError) as info:
                await h.admin.set_weights("m", {"v2": 20})
            assert info.value.kind is ErrorKind.CONFLICT
            h.fleet.state_store = inner

    run(go())


# -- rollouts ---------------------------------------------------------------------------------
def test_rollout_and_rollback_refusals(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            with pytest.raises(AdminError) as info:
                await h.admin.start_rollout("m", "v9", {})
            assert info.value.kind is ErrorKind.NOT_FOUND
            with pytest.raises(AdminError) as info:
                await h.admin.start_rollout("m", "v2", {"steps": [50, 40], "bogus": 1})
            assert info.value.kind is ErrorKind.INVALID_REQUEST
            assert any(p.startswith("steps:") for p in info.value.problems) and any(
                "bogus" in p for p in info.value.problems
            )
            with pytest.raises(AdminError) as info:
                await h.admin.start_rollout("m", "v1", {})  # v1 has all the traffic already
            assert info.value.kind is ErrorKind.CONFLICT
            with pytest.raises(AdminError) as info:
                await h.admin.rollback("m")
            assert info.value.kind is ErrorKind.CONFLICT
            await h.admin.start_rollout("m", "v2", {"step_interval_s": 5})
            for call in (h.admin.start_rollout("m", "v2", {}), h.admin.set_weights("m", {"v2": 1})):
                with pytest.raises(AdminError) as info:
                    await call
                assert info.value.kind is ErrorKind.CONFLICT  # the running rollout owns the weights
            r = await h.admin.rollback("m")
            assert r["rollout"]["phase"] == "rolling_back"
            await h.fleet.tick()  # nothing in flight on v2: rolled back at once
            assert h.fleet.status()["models"]["m"]["rollout"]["phase"] == "rolled_back"
            assert h.fleet.follower.snapshot.model("m").state_of("v2") is VersionState.RETIRED

    run(go())


def test_a_rollout_whose_target_fails_every_request_rolls_back_though_every_request_is_rescued(
    tmp_path, tiny_llama_dir
):
    """The target refuses every request before any output; the failover serves each on v1, so
    no client sees an error — and the rollout must still see the target failing and roll back
    (each failed attempt on the target counts, not only the version that finally served)."""
    broken = FakeEngine(Script(raise_at=0, error=EngineRefusedError("injected fault: fail_all")))

    async def go():
        async with Harness(tmp_path, tiny_llama_dir, {"10.0.0.2:1": broken}) as h:
            await h.admin.start_rollout("m", "v2", {})
            await h.fleet.tick()  # the target is warm: 50 % on v2
            assert h.fleet.status()["models"]["m"]["rollout"]["phase"] == "shifting"
            pipeline = ServingPipeline(h.rt)
            for i in range(40):
                gen = await pipeline.start(request(i, f"user-{i}"))
                collected = await gen.collect()
                assert isinstance(collected.final, Finished)  # the client never sees the broken version
                assert gen.headers["sluice-model-version"] == "m/v1"  # the reply names the version that served it
                if h.fleet.status()["models"]["m"]["rollout"]["phase"] != "shifting":
                    break
            rollout = h.fleet.status()["models"]["m"]["rollout"]
            assert rollout["phase"] in ("rolling_back", "rolled_back") and "error rate" in rollout["reason"]
            assert broken.started, "no request reached the target: the test proves nothing"

    run(go())


# -- reload -----------------------------------------------------------------------------------
def test_a_reload_adds_and_drains_remote_workers_and_keeps_the_fleet_when_invalid(tmp_path, tiny_llama_dir):
    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            generation = h.fleet.registry.generation
            bad = fleet_text(h.tiny, extra="[models.m.versions.v3]\nweights = 7\nworkers = []\n")
            h.write(bad)
            with pytest.raises(AdminError) as info:
                await h.admin.reload()
            assert info.value.kind is ErrorKind.INVALID_REQUEST
            line = bad.splitlines().index("weights = 7") + 1
            assert any(f":{line}: models.m.versions.v3.weights:" in p for p in info.value.problems), info.value.problems
            h.write(fleet_text(str(tmp_path / "missing"), v1_workers='"10.0.0.1:1"'))  # a running version's weights
            with pytest.raises(AdminError) as info:
                await h.admin.reload()
            assert any("versions.v1.weights: cannot change" in p for p in info.value.problems), info.value.problems
            assert h.fleet.registry.generation == generation and set(h.fleet.handles) == {"10.0.0.1:1", "10.0.0.2:1"}

            h.write(
                fleet_text(
                    h.tiny,
                    v1_workers='"10.0.0.1:1", "10.0.0.9:1"',
                    extra=f'[models.other.versions.a]\nweights = "{h.tiny}"\ntraffic = 1\nworkers = ["10.0.0.7:1"]\n',
                )
            )
            r = await h.admin.reload()
            assert r["added"] == ["other"] and r["changed"] == ["m"]
            assert sorted(r["workers_added"]) == ["10.0.0.7:1", "10.0.0.9:1"]
            await h.fleet.poller.poll_once()  # warmed up by the health poller before taking traffic
            assert h.fleet.pool.get("10.0.0.9:1").status is WorkerStatus.WARM
            assert h.fleet.registry.resolve("other") == "other" and ("other", "a") in h.fleet.runtimes.versions

            h.write(fleet_text(h.tiny))  # back: the added workers leave (drained first)
            r = await h.admin.reload()
            assert r["removed"] == ["other"] and sorted(r["workers_removed"]) == ["10.0.0.7:1", "10.0.0.9:1"]
            for _ in range(100):
                if set(h.fleet.handles) == {"10.0.0.1:1", "10.0.0.2:1"}:
                    break
                await asyncio.sleep(0.05)
            assert (
                set(h.fleet.handles) == {"10.0.0.1:1", "10.0.0.2:1"} and ("other", "a") not in h.fleet.runtimes.versions
            )

    run(go())


def test_a_removed_worker_drains_its_requests_before_it_leaves(tmp_path, tiny_llama_dir):
    slow = FakeEngine(Script(texts=["a"] * 3, hang_at=1))

    async def go():
        async with Harness(tmp_path, tiny_llama_dir, {"10.0.0.1:1": slow}) as h:
            gen = await ServingPipeline(h.rt).start(request(1, "u"))
            outcomes = gen.outcomes()
            await anext(outcomes)  # in flight on 10.0.0.1:1
            h.write(fleet_text(h.tiny, v1_workers='"10.0.0.3:1"'))
            r = await h.admin.reload()
            assert r["workers_removed"] == ["10.0.0.1:1"]
            assert h.fleet.pool.get("10.0.0.1:1").status is WorkerStatus.DRAINING  # no new requests
            await asyncio.sleep(0.3)
            assert "10.0.0.1:1" in h.fleet.handles  # still finishing its request
            slow.release.set()
            rest = [o async for o in outcomes]
            assert isinstance(rest[-1], Finished)
            for _ in range(100):
                if "10.0.0.1:1" not in h.fleet.handles:
                    break
                await asyncio.sleep(0.05)
            assert "10.0.0.1:1" not in h.fleet.handles

    run(go())


# -- the admin API over HTTP ------------------------------------------------------------------
def test_the_admin_api_guards_parses_and_shapes_errors(tmp_path, tiny_llama_dir):
    from sluice.api.app import create_app

    async def go():
        async with Harness(tmp_path, tiny_llama_dir) as h:
            app = create_app(h.rt)
            auth = {"authorization": f"Bearer {ADMIN}"}
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                assert (await c.get("/admin/fleet")).status_code == 401
                assert (await c.get("/admin/fleet", headers={"x-api-key": "wrong"})).status_code == 401
                ok = await c.get("/admin/fleet", headers=auth)
                assert ok.status_code == 200 and set(ok.json()["models"]["m"]["versions"]) == {"v1", "v2"}
                r = await c.put("/admin/fleet/models/m/weights", headers=auth, json={"weights": {"v2": "lots"}})
                assert r.status_code == 400
                r = await c.put("/admin/fleet/models/m/weights", headers=auth, json={"weights": {"v2": 25}})
                assert r.status_code == 200 and r.json()["weights"] == {"v1": 100.0, "v2": 25.0}
                r = await c.post("/admin/fleet/models/nope/rollout", headers=auth, json={"to": "v2"})
                assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
                r = await c.post("/admin/fleet/models/m/rollout", headers=auth, json={})
                assert r.status_code == 400
                r = await c.post("/admin/fleet/models/m/rollback", headers=auth)
                assert r.status_code == 409
                h.write("[models.m]\nbroken = true\n")
                r = await c.post("/admin/fleet/reload", headers=auth)
                assert r.status_code == 400 and any(
                    "fleet.toml:2: models.m.broken" in p for p in r.json()["error"]["problems"]
                )
            no_admin = ServingRuntime(load_settings(None, safety=False))
            no_admin.mark_ready(h.fleet, 4096)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_app(no_admin)), base_url="http://t"
            ) as c:
                assert (await c.get("/admin/fleet", headers=auth)).status_code == 404  # no admin key: no admin API

    run(go())


# -- which local replicas run -----------------------------------------------------------------
@pytest.mark.parametrize(
    "state, weight, replicas, goal",
    [
        (VersionState.ACTIVE, 10.0, 1, ReplicaGoal.RUN),
        (VersionState.ACTIVE, 0.0, 1, ReplicaGoal.KEEP),  # staged: started when a rollout or weights need it
        (VersionState.WARMING, 0.0, 1, ReplicaGoal.RUN),  # a rollout's target
        (VersionState.DRAINING, 0.0, 1, ReplicaGoal.KEEP),  # finishing its requests
        (VersionState.RETIRED, 0.0, 1, ReplicaGoal.STOP),
        (VersionState.ACTIVE, 10.0, 0, ReplicaGoal.KEEP),  # remote workers only: nothing to start
    ],
)
def test_replica_goals(state, weight, replicas, goal):
    spec = VersionSpec(weights="bundled", replicas=replicas, workers=[] if replicas else ["10.0.0.1:1"])
    assert replica_goal(spec, state, weight) is goal
