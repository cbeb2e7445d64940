"""The fleet's routing and operations end to end: one real `sluice serve` with a fleet file
(three local workers of the bundled model, small KV pools), keys of different tiers, the admin
API, SIGHUP and the `sluice fleet` CLI.

- a weighted sticky canary over ~50 real requests: every user gets the version the router's
  rendezvous hash assigns it (and so the same version every time), the split is within 4
  binomial standard deviations, and growing the canary with `sluice fleet weights` moves only
  users into the canary;
- fallback when the model is unavailable (its only worker is an unreachable address) and when
  the tenant is over its soft quota; a hard quota answers 429 with retry-after;
- unknown model 404, pinning an unknown version 404, pinning from a tier that may not 403;
- reloads: an invalid file (admin API and SIGHUP) keeps the running fleet and names the line
  and field; a valid one applies (a new alias; a new model whose replica starts, then leaves
  again and its worker stops); bad fleet files at start-up exit 2 naming the line and field.
"""

from __future__ import annotations

import math
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice.routing.dispatch.version_router import choose_version
from tests.fleet_process import (
    ADMIN,
    admin,
    alive,
    ask,
    local_version,
    make_key,
    remote_version,
    sluice_cli,
    status,
    wait_until,
    warm_workers,
)
from tests.routing_calls import user_key
from tests.server_process import MODEL, free_port, start_server

pytestmark = pytest.mark.slow
USERS = [f"user-{i}" for i in range(50)]
TENANT = "acme"


def within_binomial(count: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def fleet_text(unreachable: str, extra: str = "") -> str:
    return f"""
[models."{MODEL}"]
aliases = ["smol"]
fallbacks = ["backup"]
[models."{MODEL}".tiers.standard]
allow_pin = true
{local_version(MODEL, "stable", 80)}
{local_version(MODEL, "canary", 20)}

[models.backup]
fallbacks = ["{MODEL}"]
[models.backup.tiers.free]
quota = {{ tokens = 1, period = "day", mode = "soft" }}
[models.backup.tiers.batch]
quota = {{ tokens = 1, period = "day", mode = "hard" }}
[models.backup.versions.v1]
weights = "bundled"
traffic = 100
replicas = 1
[models.backup.versions.v1.engine]
kv_cache_gib = 0.1
max_num_seqs = 8

[models.ghost]
fallbacks = ["backup"]
{remote_version("ghost", "v1", 100, unreachable)}
{extra}"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet-ops")
    keys = {
        tier: make_key(tmp / "data", f"{tier}-tenant" if tier != "standard" else TENANT, tier)
        for tier in ("standard", "free", "batch")
    }
    path = tmp / "fleet.toml"
    text = fleet_text(f"127.0.0.1:{free_port()}")  # nothing listens there: ghost is never available
    path.write_text(text)
    proc = start_server(["--fleet", str(path)], env={"SLUICE_ADMIN_KEY": ADMIN, "SLUICE_DATA_DIR": str(tmp / "data")})
    proc.extra.update(path=path, text=text, keys=keys)
    wait_until(lambda: len(warm_workers(proc)) == 2 and warm_workers(proc, "backup"), "three warm workers")
    yield proc
    proc.stop()


def served_versions(proc, key: str, users: list[str]) -> dict[str, str]:
    def one(user: str) -> tuple[str, str]:
        r = ask(proc, key, user)
        assert r.status_code == 200, r.text
        return user, r.headers["sluice-model-version"].rpartition("/")[2]

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, users))


def predicted(users: list[str], weights: dict[str, float]) -> dict[str, str]:
    return {u: choose_version(MODEL, weights, user_key(TENANT, u)) for u in users}


def test_a_weighted_sticky_canary_grows_by_moving_users_only_into_it(fleet):
    key = fleet.extra["keys"]["standard"]
    first = served_versions(fleet, key, USERS)
    assert first == predicted(USERS, {"stable": 80, "canary": 20})  # the rendezvous assignment, user by user
    on_canary = {u for u, v in first.items() if v == "canary"}
    assert within_binomial(len(on_canary), len(USERS), 0.2), len(on_canary)
    again = served_versions(fleet, key, USERS[::3])
    assert again == {u: first[u] for u in USERS[::3]}  # sticky: nobody flaps

    out = sluice_cli("fleet", "weights", MODEL, "stable=60", "canary=40", "--url", fleet.base_url, "--admin-key", ADMIN)
    assert out.returncode == 0, out.stderr
    assert "canary=40 (40.0 %)" in out.stdout
    grown = served_versions(fleet, key, USERS)
    assert grown == predicted(USERS, {"stable": 60, "canary": 40})
    assert on_canary <= {u for u, v in grown.items() if v == "canary"}  # users in the canary stay in it
    movers = {u for u in USERS if grown[u] != first[u]}
    assert all(first[u] == "stable" and grown[u] == "canary" for u in movers)  # and only move into it
    assert within_binomial(sum(v == "canary" for v in grown.values()), len(USERS), 0.4)
    shares = status(fleet)["models"][MODEL]["versions"]
    assert shares["canary"]["share"] == 40.0 and shares["stable"]["share"] == 60.0


def test_the_cli_round_trip_and_its_errors(fleet):
    url = ["--url", fleet.base_url, "--admin-key", ADMIN]
    out = sluice_cli("fleet", "status", *url)
    assert out.returncode == 0, out.stderr
    assert f"model {MODEL}" in out.stdout and "canary" in out.stdout and "workers" in out.stdout
    out = sluice_cli("fleet", "status", "--json", *url)
    assert out.returncode == 0 and '"models"' in out.stdout
    out = sluice_cli("fleet", "rollback", MODEL, *url)
    assert out.returncode == 1 and "no rollout" in out.stderr  # refused by the server: exit 1
    out = sluice_cli("fleet", "weights", MODEL, "nightly=5", *url)
    assert out.returncode == 1 and "no version 'nightly'" in out.stderr
    out = sluice_cli("fleet", "weights", MODEL, "stable", *url)
    assert out.returncode == 2 and "VERSION=WEIGHT" in out.stderr  # a usage error: exit 2
    out = sluice_cli("fleet", "status", "--url", fleet.base_url, "--admin-key", "not-the-key")
    assert out.returncode == 1 and "admin key" in out.stderr
    out = sluice_cli("fleet", "reload", *url)
    assert out.returncode == 0 and "fleet file reloaded" in out.stdout  # the same file: nothing changes


def test_an_unavailable_model_falls_back_and_says_so(fleet):
    r = ask(fleet, fleet.extra["keys"]["standard"], "someone", model="ghost")
    assert r.status_code == 200, r.text
    assert r.headers["sluice-fallback-from"] == "ghost" and r.headers["sluice-model-version"] == "backup/v1"


def test_a_soft_quota_falls_back_with_a_warning_and_a_hard_quota_answers_429(fleet):
    free, batch = fleet.extra["keys"]["free"], fleet.extra["keys"]["batch"]
    first = ask(fleet, free, model="backup")  # under the quota: served by backup itself
    assert first.status_code == 200 and first.headers["sluice-model-version"] == "backup/v1"
    over = ask(fleet, free, model="backup")
    assert over.status_code == 200, over.text
    assert over.headers["sluice-fallback-from"] == "backup" and over.headers["sluice-quota-exceeded"] == "backup"
    assert over.headers["sluice-model-version"].startswith(MODEL + "/")
    assert ask(fleet, batch, model="backup").status_code == 200
    hard = ask(fleet, batch, model="backup")
    assert hard.status_code == 429 and hard.json()["error"]["type"] == "rate_limit_error"
    assert int(hard.headers["retry-after"]) >= 1 and "quota" in hard.json()["error"]["message"]


def test_unknown_models_and_bad_pins_are_clear_4xx(fleet):
    standard, free = fleet.extra["keys"]["standard"], fleet.extra["keys"]["free"]
    r = ask(fleet, standard, model="no-such-model")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = ask(fleet, standard, headers={"sluice-model-version": f"{MODEL}/nightly"})
    assert r.status_code == 404 and "nightly" in r.json()["error"]["message"]
    r = ask(fleet, free, headers={"sluice-model-version": f"{MODEL}/canary"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = ask(fleet, standard, "pinned-user", headers={"sluice-model-version": f"{MODEL}/canary"})
    assert r.status_code == 200 and r.headers["sluice-model-version"] == f"{MODEL}/canary"


def test_an_invalid_reload_keeps_the_fleet_by_admin_api_and_by_sighup(fleet):
    path, good = fleet.extra["path"], fleet.extra["text"]
    before = status(fleet)["reloads"]
    bad = good.replace("traffic = 100\nreplicas = 1", 'traffic = 100\nreplicas = "one"', 1)
    line = bad.splitlines().index('replicas = "one"') + 1
    path.write_text(bad)
    try:
        r = admin(fleet, "POST", "/admin/fleet/reload")
        assert r.status_code == 400
        assert any(f"fleet.toml:{line}: models.backup.versions.v1.replicas" in p for p in r.json()["error"]["problems"])
        os.kill(fleet.process.pid, signal.SIGHUP)
        wait_until(lambda: "NOT reloaded" in fleet.log(), "the SIGHUP reload's outcome in the log", 60)
        assert f"fleet.toml:{line}: models.backup.versions.v1.replicas" in fleet.log()
    finally:
        path.write_text(good)
    assert status(fleet)["reloads"] == before and fleet.process.poll() is None  # still the old fleet, still up
    assert ask(fleet, fleet.extra["keys"]["standard"], "after-bad-reload").status_code == 200


def test_a_valid_reload_applies_new_aliases_and_starts_and_stops_new_versions(fleet):
    path, good = fleet.extra["path"], fleet.extra["text"]
    key = fleet.extra["keys"]["standard"]
    with_late = good.replace('aliases = ["smol"]', 'aliases = ["smol", "tiny-chat"]') + local_version("late", "v1", 1)
    path.write_text(with_late)
    try:
        os.kill(fleet.process.pid, signal.SIGHUP)  # the same reload as the admin API's, by signal
        wait_until(lambda: "SIGHUP: fleet file reloaded" in fleet.log(), "the SIGHUP reload", 60)
        assert ask(fleet, key, "alias-user", model="tiny-chat").status_code == 200
        wait_until(lambda: warm_workers(fleet, "late"), "the new model's replica to start and warm up")
        r = ask(fleet, key, "late-user", model="late")
        assert r.status_code == 200 and r.headers["sluice-model-version"] == "late/v1"
        pid = warm_workers(fleet, "late")[0]["pid"]
    finally:
        path.write_text(good)
    r = admin(fleet, "POST", "/admin/fleet/reload")
    assert r.status_code == 200, r.text
    assert r.json()["removed"] == ["late"] and len(r.json()["replicas_stopping"]) == 1
    wait_until(
        lambda: not [w for w in status(fleet)["workers"] if w["model"] == "late"],
        "the removed model's worker to stop",
        120,
    )
    wait_until(lambda: not alive(pid), "the removed model's worker process to exit", 60)
    assert ask(fleet, key, model="late").status_code == 404


@pytest.mark.parametrize(
    "text, expect",
    [
        (
            f'[models."{MODEL}".versions.v1]\nweights = "bundled"\ntraffic = "lots"\nreplicas = 1\n',
            f"fleet.toml:3: models.{MODEL}.versions.v1.traffic: Input should be a valid number",
        ),
        (
            f'[models."{MODEL}"]\nfallbacks = ["nope"]\n'
            f'[models."{MODEL}".versions.v1]\nweights = "bundled"\ntraffic = 1\nreplicas = 1\n',
            f"fleet.toml:2: models.{MODEL}.fallbacks[0]: fallback 'nope' is not a model id or alias",
        ),
    ],
)
def test_a_bad_fleet_file_stops_start_up_naming_the_line_and_field(tmp_path, text, expect):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(RuntimeError) as info:
        start_server(["--fleet", str(path)], timeout=120)
    assert "exited with 2" in str(info.value) and expect in str(info.value), str(info.value)
