"""Rollouts end to end under load: one real `sluice serve` with a fleet file whose model has a
stable version, a new one and a deliberately broken one (`fault_injection = "fail_all"`: every
generation refused before any output), all local replicas of the bundled model.

- a rollout to the broken version rolls back by itself (its error rate, counted on the attempts
  the failover rescued on the old version) and no client request fails; the broken version's
  worker is drained and stopped;
- a rollout to the good version under a steady loop of streaming requests for the whole shift:
  zero failed, zero truncated requests; the traffic moves to the new version step by step; the
  old version drains and its local worker stops.

Steps are short (`step_interval_s` a few seconds) and the TTFT threshold generous, so the
verdicts depend on errors only, never on how fast this machine is."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.fleet_process import (
    ADMIN,
    admin,
    alive,
    complete,
    local_version,
    rollout_of,
    status,
    stream,
    wait_until,
    warm_workers,
)
from tests.server_process import MODEL, start_server

pytestmark = pytest.mark.slow
MAX_TOKENS = 8
FLEET = "\n".join(
    [
        local_version(MODEL, "v1", 100),
        local_version(MODEL, "v2", 0),
        local_version(MODEL, "broken", 0, extra='fault_injection = "fail_all"'),
    ]
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("rollout") / "fleet.toml"
    path.write_text(FLEET)
    proc = start_server(["--fleet", str(path)], env={"SLUICE_ADMIN_KEY": ADMIN})
    wait_until(lambda: warm_workers(proc), "the first version's worker")
    yield proc
    proc.stop()


class Load:
    """A steady loop of streaming requests (distinct users, so every version gets its share)
    on `threads` threads until stopped; every reply is kept."""

    def __init__(self, proc, threads: int = 2):
        self.proc, self._stop = proc, threading.Event()
        self.replies: list[dict[str, Any]] = []
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]

    def _loop(self, t: int) -> None:
        n = 0
        while not self._stop.is_set():
            user = f"user-{t}-{n}"
            try:
                reply = stream(self.proc, None, user, MAX_TOKENS, f"Write one sentence about the number {n}.")
            except Exception as exc:  # a broken connection is a failed request, not a test crash
                reply = {
                    "status": 0,
                    "events": [],
                    "text": "",
                    "final": {},
                    "version": "?/?",
                    "error": repr(exc),
                    "began": time.monotonic(),
                    "at": time.monotonic(),
                }
            self.replies.append(reply)
            n += 1

    def __enter__(self) -> Load:
        for th in self._threads:
            th.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(360)

    def failures(self) -> list[dict]:
        return [r for r in self.replies if not complete(r, MAX_TOKENS)]


def test_a_rollout_to_a_broken_version_rolls_back_by_itself_and_no_request_fails(server):
    old = {v for v, s in status(server)["models"][MODEL]["versions"].items() if s["share"] > 0}
    plan = {
        "to": "broken",
        "steps": [50, 100],
        "step_interval_s": 120,
        "min_requests": 3,
        "max_error_rate": 0.05,
        "max_ttft_p95_s": 600,
        "warm_timeout_s": 600,
    }
    with Load(server) as load:
        r = admin(server, "POST", f"/admin/fleet/models/{MODEL}/rollout", plan)
        assert r.status_code == 200, r.text
        again = admin(server, "POST", f"/admin/fleet/models/{MODEL}/rollout", {"to": "v2"})
        assert again.status_code == 409  # one rollout at a time
        wait_until(lambda: warm_workers(server, version="broken"), "the broken version's worker to warm up")
        rollout = wait_until(
            lambda: (ro := rollout_of(server)) and ro["phase"] in ("rolling_back", "rolled_back") and ro,
            "the automatic rollback",
        )
        settled = len(load.replies) + 6
        wait_until(lambda: len(load.replies) >= settled, "requests after the rollback")
    assert "error rate" in rollout["reason"], rollout
    assert not load.failures(), load.failures()[:3]
    # streams planned onto the broken version were refused there before any output and
    # completed on the old version (a stream opens at its first output: its header names v1)
    assert "injected fault: fail_all" in server.log() and "failed before any output" in server.log()
    shares = status(server)["models"][MODEL]["versions"]
    assert {v for v, s in shares.items() if s["share"] > 0} == old
    wait_until(lambda: rollout_of(server)["phase"] == "rolled_back", "the rollback to finish")
    wait_until(
        lambda: not [w for w in status(server)["workers"] if w["version"] == "broken"],
        "the broken version's worker to stop",
        120,
    )
    assert status(server)["models"][MODEL]["versions"]["broken"]["state"] == "retired"


def test_a_rollout_under_steady_load_moves_all_traffic_without_a_failed_or_truncated_request(server):
    before = {w["version"]: w["pid"] for w in status(server)["workers"]}
    assert set(before) == {"v1"}, before
    plan = {
        "to": "v2",
        "steps": [50, 100],
        "step_interval_s": 4,
        "min_requests": 5,
        "max_error_rate": 0.2,
        "max_ttft_p95_s": 600,
        "warm_timeout_s": 600,
        "drain_timeout_s": 120,
    }
    with Load(server) as load:
        time.sleep(1.0)  # the loop is running before the rollout starts
        r = admin(server, "POST", f"/admin/fleet/models/{MODEL}/rollout", plan)
        assert r.status_code == 200, r.text
        started = time.monotonic()
        phases = []

        def done() -> bool:
            ro = rollout_of(server)
            assert ro is not None, "the rollout started above stays in the status"
            if not phases or phases[-1] != ro["phase"]:
                phases.append(ro["phase"])
            return ro["phase"] in ("done", "rolled_back")

        wait_until(done, "the rollout to finish", 600)
        finished = time.monotonic()
        after = len(load.replies) + 4
        wait_until(lambda: len(load.replies) >= after, "requests after the rollout")
    assert rollout_of(server)["phase"] == "done", rollout_of(server)
    assert "shifting" in phases and "draining" in phases, phases
    assert not load.failures(), load.failures()[:3]  # zero failed, zero truncated
    versions = [(r["began"], r["at"], r["version"].rpartition("/")[2]) for r in load.replies]
    assert all(v == "v1" for _, end, v in versions if end < started)
    assert all(v == "v2" for began, _, v in versions if began > finished)
    assert any(v == "v2" for *_, v in versions) and any(v == "v1" for *_, v in versions)
    s = status(server)["models"][MODEL]["versions"]
    assert s["v2"]["share"] == 100.0 and s["v1"]["state"] == "retired"
    wait_until(
        lambda: {w["version"] for w in status(server)["workers"]} == {"v2"}, "the old version's worker to stop", 120
    )
    wait_until(lambda: not alive(before["v1"]), "the old worker process to exit", 60)
