"""Two gateways sharing one routing state through a real redis-server follow one rollout.

Two `sluice serve` gateways (`limits_store = "redis"`) with the same fleet file; the model's two
versions are each served by one `sluice worker` both gateways share (remote workers: nothing
to start or stop, so the test watches only the shared state). A rollout started on gateway A
shows on gateway B's `/admin/fleet` and in B's routing (each user's version follows the
weights) within a bounded wait; a rollback sent to B rolls back the rollout A drives. When Redis
restarts empty, the gateways write the live state back: the finished rollout's weights and
version states stay in force on both, never the fleet file's `traffic`."""

from __future__ import annotations

import pytest

from sluice.routing.dispatch.version_router import choose_version
from tests.fleet_process import ADMIN, admin, ask, remote_version, rollout_of, status, wait_until
from tests.redis_server import RedisServer
from tests.routing_calls import user_key
from tests.server_process import MODEL, free_port, start_server, start_worker

pytestmark = pytest.mark.slow
USERS = [f"user-{i}" for i in range(12)]


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    redis = RedisServer()  # this module's own: the rollout's keys never meet another test's
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    workers, procs = [], []
    try:
        for address in addresses:
            workers.append(start_worker(address, ["--kv-cache-gib", "0.1", "--max-num-seqs", "8"]))
        path = tmp_path_factory.mktemp("shared") / "fleet.toml"
        path.write_text(remote_version(MODEL, "v1", 100, addresses[0]) + remote_version(MODEL, "v2", 0, addresses[1]))
        env = {"SLUICE_ADMIN_KEY": ADMIN, "SLUICE_LIMITS_STORE": "redis", "SLUICE_REDIS_URL": redis.url}
        for _ in range(2):
            procs.append(start_server(["--fleet", str(path)], env=env))
        for proc in procs:
            wait_until(
                lambda p=proc: all(w["status"] == "warm" for w in status(p)["workers"]), "both shared workers warm"
            )
        procs[0].extra["redis"] = redis  # the last test restarts it
        yield procs
    finally:
        for p in procs + workers:
            p.stop()
        redis.stop()


def versions_served(proc, users: list[str]) -> dict[str, str]:
    out = {}
    for u in users:
        r = ask(proc, None, u)
        assert r.status_code == 200, r.text
        out[u] = r.headers["sluice-model-version"].rpartition("/")[2]
    return out


def expected(weights: dict[str, float]) -> dict[str, str]:
    return {u: choose_version(MODEL, weights, user_key("default", u)) for u in USERS}


def test_a_rollout_started_on_one_gateway_is_followed_and_can_be_rolled_back_by_the_other(gateways):
    a, b = gateways
    plan = {"to": "v2", "steps": [50, 100], "step_interval_s": 3600, "min_requests": 1000, "max_ttft_p95_s": 600}
    r = admin(a, "POST", f"/admin/fleet/models/{MODEL}/rollout", plan)
    assert r.status_code == 200, r.text
    seen = wait_until(
        lambda: (ro := rollout_of(b)) and ro["phase"] == "shifting" and ro, "gateway B to see the shift", 60
    )
    assert seen["driven_here"] is False and rollout_of(a)["driven_here"] is True
    assert status(b)["models"][MODEL]["versions"]["v2"]["share"] == 50.0
    half = expected({"v1": 50, "v2": 50})
    assert "v1" in half.values() and "v2" in half.values()  # both versions are exercised
    assert versions_served(b, USERS) == half  # B routes by the shared weights, user by user
    again = admin(b, "POST", f"/admin/fleet/models/{MODEL}/rollout", {"to": "v2"})
    assert again.status_code == 409  # the shared state says a rollout runs, whichever gateway asks

    r = admin(b, "POST", f"/admin/fleet/models/{MODEL}/rollback")  # B did not start it; it may roll it back
    assert r.status_code == 200, r.text
    wait_until(lambda: rollout_of(a)["phase"] == "rolled_back", "gateway A to finish the rollback", 60)
    assert status(a)["models"][MODEL]["versions"]["v1"]["share"] == 100.0
    assert versions_served(a, USERS) == {u: "v1" for u in USERS}


def test_a_complete_rollout_driven_by_one_gateway_moves_the_other_gateways_traffic(gateways):
    a, b = gateways
    plan = {"to": "v2", "steps": [50, 100], "step_interval_s": 1, "min_requests": 1000, "max_ttft_p95_s": 600}
    r = admin(a, "POST", f"/admin/fleet/models/{MODEL}/rollout", plan)
    assert r.status_code == 200, r.text
    wait_until(lambda: rollout_of(b)["phase"] == "done", "gateway B to see the rollout done", 120)
    s = status(b)["models"][MODEL]["versions"]
    assert s["v2"]["share"] == 100.0 and s["v1"]["state"] == "retired"
    assert versions_served(b, USERS) == {u: "v2" for u in USERS}


def test_the_live_state_survives_a_redis_restarted_empty(gateways):
    """After the complete rollout above (v2 at 100 %, v1 retired), Redis restarts with nothing;
    the fleet file still says v1 = 100. A gateway finds the store empty and restores its
    snapshot, revision included; both keep routing every user to v2."""
    import redis as redis_client

    a, b = gateways
    server = a.extra["redis"]
    client = redis_client.Redis.from_url(server.url)
    revision = int(client.get("{sluice:routing}:rev"))
    assert revision > 0 and status(b)["models"][MODEL]["versions"]["v2"]["share"] == 100.0
    server.restart_empty()
    wait_until(
        lambda: int(redis_client.Redis.from_url(server.url).get("{sluice:routing}:rev") or 0) == revision,
        "a gateway to write the routing state back",
        60,
    )
    for proc in (a, b):
        s = status(proc)["models"][MODEL]["versions"]
        assert s["v2"]["share"] == 100.0 and s["v1"]["state"] == "retired", s
        assert versions_served(proc, USERS) == {u: "v2" for u in USERS}
    assert "restored revision" in a.log() + b.log()
