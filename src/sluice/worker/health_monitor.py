"""Is there an engine that can serve right now? A poller that keeps one answer up to date.

Why a poller and not "try and see": /ready must turn 503 as soon as no engine can serve, so a
load balancer or Kubernetes stops sending traffic, and a request must be refused with 529 +
retry-after *before* its stream opens (the SDKs retry a 529, not an in-stream error). A worker
that was killed refuses the health call at once; a worker that hangs (SIGSTOP, a wedged step)
answers nothing, so each probe has a deadline and a missed deadline counts as down.

`mark_down()` lets a caller report a failure it saw (a generate call that found no worker)
without waiting for the next probe; the next successful probe marks the engine up again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("sluice.worker")

Probe = Callable[[], Awaitable[tuple[bool, str]]]  # -> (ready, detail); raises when unreachable


class EngineHealth:
    def __init__(self, probe: Probe, interval_s: float = 1.0, timeout_s: float = 2.0):
        self._probe = probe
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.available = False
        self.detail = "not started"
        self._task: asyncio.Task | None = None

    async def check(self) -> bool:
        """Probe once now and update the state; returns availability."""
        try:
            ready, detail = await asyncio.wait_for(self._probe(), self.timeout_s)
        except TimeoutError:
            ready, detail = False, f"the worker did not answer a health check within {self.timeout_s:g}s"
        except Exception as exc:  # unreachable: connection refused, channel closed, …
            ready, detail = False, f"the worker is unreachable ({exc})"
        self._set(ready, detail)
        return ready

    def mark_down(self, detail: str) -> None:
        self._set(False, detail)

    def _set(self, ready: bool, detail: str) -> None:
        if ready != self.available:
            (log.info if ready else log.warning)("engine %s: %s", "available" if ready else "unavailable", detail)
        self.available, self.detail = ready, detail

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sluice-engine-health")

    async def _run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
