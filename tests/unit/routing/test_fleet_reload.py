"""A reloaded fleet file applied to the running fleet (routing/fleet/reload.py `apply_reload`,
the path SIGHUP and `POST /admin/fleet/reload` take): the remote workers follow the file's
`workers` addresses, and the gateway's own worker is left alone. Real Fleet parts; the remote
addresses are never dialled (a gRPC client connects on its first call)."""

from __future__ import annotations

import asyncio

import pytest

from sluice.config import Settings
from sluice.routing.dispatch.worker_pool import WorkerStatus
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.registry import Registry
from sluice.worker.grpc_client import GrpcEngineClient


def fleet_file(stable_workers: str, canary_workers: str):
    return parse_fleet(f"""
[models.m.versions.stable]
weights = "bundled"
traffic = 1
workers = [{stable_workers}]
[models.m.versions.canary]
weights = "bundled"
workers = [{canary_workers}]
max_outstanding_tokens = 99
""")


async def reload(fleet: Fleet, stable_workers: str, canary_workers: str) -> dict[str, list[str]]:
    assert fleet.registry.reload(fleet_file(stable_workers, canary_workers)).applied
    changes = await fleet.apply_reload()
    for _ in range(6000):  # a leaving worker drains (nothing in flight here), then leaves the pool
        if not any(fleet.pool.get(w) for w in changes["workers_removed"] if w not in fleet.handles):
            break
        await asyncio.sleep(0.01)
    return changes


@pytest.mark.asyncio
async def test_remote_workers_follow_the_fleet_file():
    fleet = Fleet.build(Settings(), Registry(fleet_file('"h:1"', '"h:3"')))
    pool = fleet.pool
    fleet.members.add_worker("m", "stable", "inline", GrpcEngineClient("unix:/nowhere")).status = WorkerStatus.WARM
    for address, version in (("h:1", "stable"), ("h:3", "canary")):  # as Fleet.start connects them
        fleet.members.add_remote("m", version, address)
    try:
        changes = await reload(fleet, '"h:1", "h:2"', '"h:3"')
        assert changes["workers_added"] == ["h:2"] and changes["workers_removed"] == []
        assert pool.get("h:3").status is WorkerStatus.STARTING and pool.get("h:3").max_outstanding_tokens == 99
        pool.set_status("h:1", WorkerStatus.WARM)
        # h:2 moves to the canary, h:3 leaves; h:1 and the gateway's own worker are untouched
        changes = await reload(fleet, '"h:1"', '"h:2"')
        assert changes["workers_added"] == ["h:2"] and sorted(changes["workers_removed"]) == ["h:2", "h:3"]
        assert pool.get("h:2").version == "canary" and pool.get("h:2").remote
        assert pool.get("h:1").status is WorkerStatus.WARM and pool.get("inline").status is WorkerStatus.WARM
        assert pool.get("h:3") is None and "h:3" not in fleet.handles
    finally:
        await fleet.close()
