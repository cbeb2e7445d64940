"""The health poller tells the pool when a worker restarted between two checks (its cumulative
step count went back), so the router's prefix table forgets what it sent there."""

from __future__ import annotations

import pytest

from sluice.engine.stats import EngineStats
from sluice.routing.dispatch.health_poller import HealthPoller, WorkerHandle
from sluice.routing.dispatch.worker_pool import WorkerPool, WorkerStatus
from tests.fake_engine import FakeEngine


class StatsOnly(FakeEngine):
    """Answers the poller's ready and stats calls (the worker counts as warmed up already)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    async def stats(self) -> EngineStats:
        return EngineStats(num_steps=self.steps)


@pytest.mark.asyncio
async def test_a_restart_between_checks_is_reported() -> None:
    pool = WorkerPool()
    pool.add("w", "m", "v", "h:1", status=WorkerStatus.WARM)
    lost: list[str] = []
    pool.on_cache_lost.append(lost.append)
    client = StatsOnly()
    handle = WorkerHandle("w", "m", "v", "h:1", client, warmed=True)
    poller = HealthPoller(pool, {"w": handle})
    for steps in (5, 90, 90):
        client.steps = steps
        await poller.poll_once()
    assert lost == []
    client.steps = 3  # a fresh process: fewer steps than the last check saw
    await poller.poll_once()
    assert lost == ["w"] and (w := pool.get("w")) is not None and w.status is WorkerStatus.WARM
