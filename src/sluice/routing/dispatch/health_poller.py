"""Each worker's health and load, polled, written into the worker pool.

Every `interval_s` every worker gets a health probe with a deadline (`timeout_s`) and, when it
answers, a stats call: its outstanding tokens become the pool's reported load. A worker that
answers ready for the first time (or again, after it was down) is warmed up with a one-token
generation before it takes traffic — so the first real request does not pay for cold caches
and a worker that cannot generate never goes WARM. A worker that misses `down_after` probes in
a row (refused: it died; unanswered: it hangs — SIGSTOP, a wedged step) is taken out of
routing and its in-flight calls are given up, so their requests move to another worker at
once; the breaker hears every probe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from sluice.aio import cancel_and_wait
from sluice.engine.stats import EngineStats
from sluice.routing.dispatch.worker_pool import WorkerPool, WorkerStatus
from sluice.worker.engine_client import EngineClient, ModelInfo
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.supervisor import WorkerSupervisor
from sluice.worker.warmup import warmup_request

log = logging.getLogger("sluice.routing")


@dataclass(slots=True, eq=False)
class WorkerHandle:
    """One worker as the gateway reaches it."""

    worker_id: str
    model_id: str
    version: str
    address: str
    client: EngineClient
    supervisor: WorkerSupervisor | None = None  # a local replica's (restarts it when it exits)
    info: ModelInfo | None = None
    stats: EngineStats | None = None  # the last stats it answered
    failures: int = 0  # consecutive failed probes
    warmed: bool = False
    # the status it takes once warm: WARM (serves at once), or STANDBY for a worker the
    # autoscaler started to refill its warm pool (routing/fleet/autoscaler.py)
    join_status: WorkerStatus = WorkerStatus.WARM
    on_change: list[Callable[[WorkerHandle], None]] = field(default_factory=list)


def take_down(pool: WorkerPool, h: WorkerHandle) -> bool:
    """Take the worker out of routing until a probe finds it ready and warms it up again (so
    what comes back — the same process after a hang, or a restart at the same address — is a
    fresh incarnation in the pool). The health poller does it after missed probes; the request
    path does it at once when a call to the worker is refused or broken (routing/dispatch/failover.py):
    that is evidence about the worker now, and the next request must not be sent there (nor
    admitted, when it was the last one). True when the worker was up."""
    entry = pool.get(h.worker_id)
    up = entry is not None and entry.status in (WorkerStatus.WARM, WorkerStatus.STANDBY)
    if not up and not h.warmed:
        return False
    h.warmed = False
    if up:
        pool.set_status(h.worker_id, WorkerStatus.STARTING)
    _changed(h)
    return up


def _changed(h: WorkerHandle) -> None:
    for callback in h.on_change:
        callback(h)


class HealthPoller:
    def __init__(
        self,
        pool: WorkerPool,
        handles: dict[str, WorkerHandle],
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        down_after: int = 2,
    ):
        self.pool = pool
        self.handles = handles
        self.interval_s, self.timeout_s, self.down_after = interval_s, timeout_s, down_after
        self._task: asyncio.Task | None = None

    async def poll_once(self) -> None:
        await asyncio.gather(*(self.check(h) for h in list(self.handles.values())))

    async def check(self, h: WorkerHandle) -> None:
        try:
            ready = await asyncio.wait_for(h.client.ready(), self.timeout_s)
            if ready and not h.warmed:
                await asyncio.wait_for(self._warm_up(h), max(self.timeout_s, 60.0))
            stats = await asyncio.wait_for(h.client.stats(), self.timeout_s) if ready else None
        except Exception as exc:  # unreachable, a missed deadline, a failed warm-up
            ready, stats, why = False, None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            why = "not ready"
        self.pool.record_health(h.worker_id, ready)
        entry = self.pool.get(h.worker_id)
        if entry is None:
            return
        if ready and stats is not None:
            if h.stats is not None and stats.num_steps < h.stats.num_steps:
                self.pool.mark_restarted(h.worker_id)  # a fresh process: its prefix cache is empty
            h.failures, h.stats = 0, stats
            self.pool.report_load(h.worker_id, stats.outstanding_tokens)
            self.pool.report_adapters(h.worker_id, stats.lora_resident)
            if entry.status is WorkerStatus.STARTING:
                log.info("worker %s (%s/%s) is warm (%s)", h.worker_id, h.model_id, h.version, h.join_status.value)
                self.pool.set_status(h.worker_id, h.join_status)
                self._changed(h)
            return
        h.failures += 1
        up = entry.status in (WorkerStatus.WARM, WorkerStatus.STANDBY)
        if h.failures >= self.down_after and (up or h.warmed):
            log.warning(
                "worker %s (%s/%s) is down after %d failed health checks (%s)",
                h.worker_id,
                h.model_id,
                h.version,
                h.failures,
                why,
            )
            take_down(self.pool, h)
            if isinstance(h.client, GrpcEngineClient):
                h.client.abandon_calls(f"{h.worker_id} missed {h.failures} health checks")

    async def _warm_up(self, h: WorkerHandle) -> None:
        if h.info is None:
            h.info = await h.client.info()
        async with aclosing(h.client.generate(warmup_request())) as events:
            async for event in events:
                if event.finished:
                    break
        h.warmed = True

    def _changed(self, h: WorkerHandle) -> None:
        _changed(h)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sluice-health-poller")

    async def _run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
