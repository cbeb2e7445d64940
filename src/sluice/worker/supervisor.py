"""Keep the local worker of `sluice serve` alive: restart it when it dies, give up when it keeps dying.

The worker is restarted on the same unix socket address, so the gateway's gRPC channel simply
reconnects (the client's reconnect backoff is capped at 1 s, channel_options.py). While it is
down the fleet's health poller (routing/dispatch/health_poller.py) says so: /ready is 503 and generation
requests get 529 with retry-after before any stream opens. After `RestartBackoff.max_restarts` exits within its
window (common/backoff.py) the supervisor gives up and calls `on_give_up`; `sluice serve` then exits non-zero so
that its own supervisor (systemd, Kubernetes) restarts the whole process or alerts.

Detecting an exit: the child's PID is polled every `poll_s` (0.2 s): cheaper and simpler than a
child watcher, and far below the time a restart takes anyway (the model load, ~2–5 s).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from sluice.aio import cancel_and_wait
from sluice.common.backoff import RestartBackoff
from sluice.errors import EngineUnavailableError
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.spawn import LocalWorker, start_local_worker, wait_ready

log = logging.getLogger("sluice.worker")


class WorkerSupervisor:
    def __init__(
        self,
        model: str | None,
        dtype: str,
        engine_args: Sequence[str],
        start_timeout_s: float,
        policy: RestartBackoff,
        on_give_up: Callable[[str], None] | None = None,
        poll_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model, self.dtype, self.engine_args = model, dtype, list(engine_args)
        self.start_timeout_s = start_timeout_s
        self.policy = policy
        self.on_give_up = on_give_up
        self.poll_s = poll_s
        self._clock = clock
        self.worker: LocalWorker | None = None
        self.restarts = 0
        self._task: asyncio.Task | None = None

    @property
    def address(self) -> str:
        assert self.worker is not None, "start() first"
        return self.worker.address

    async def start(self, client_for: Callable[[str], GrpcEngineClient]) -> GrpcEngineClient:
        """Start the first worker and wait until it is ready (raises EngineUnavailableError when it
        cannot start: a first start that fails is a configuration problem, not a crash)."""
        self.worker = start_local_worker(self.model, self.dtype, self.engine_args)
        log.info("engine worker started (pid %d)", self.worker.pid)
        client = client_for(self.worker.address)
        await wait_ready(self.worker, client, self.start_timeout_s)
        return client

    def watch(self, client: GrpcEngineClient) -> None:
        """From now on, restart the worker whenever it exits."""
        self._task = asyncio.get_running_loop().create_task(self._watch(client), name="sluice-worker-supervisor")

    async def _watch(self, client: GrpcEngineClient) -> None:
        assert self.worker is not None
        while True:
            code = self.worker.process.poll()
            if code is None:
                await asyncio.sleep(self.poll_s)
                continue
            reason = f"the engine worker (pid {self.worker.pid}) exited with code {code}"
            if not await self._restart(client, reason):
                return

    async def _restart(self, client: GrpcEngineClient, reason: str) -> bool:
        """Restart until a worker is ready (True) or the policy gives up (False)."""
        assert self.worker is not None
        while True:
            delay = self.policy.on_exit(self._clock())
            if delay is None:
                why = (
                    f"{reason}; it exited {self.policy.recent_exits} times within {self.policy.window_s:g}s, giving up"
                )
                log.error("%s", why)
                if self.on_give_up is not None:
                    self.on_give_up(why)
                return False
            log.warning("%s; restarting it in %.1fs (restart %d)", reason, delay, self.restarts + 1)
            await asyncio.sleep(delay)
            socket_dir = self.worker.socket_dir
            await asyncio.to_thread(self.worker.stop, 0, True)  # reap it; keep its address
            self.worker = start_local_worker(self.model, self.dtype, self.engine_args, socket_dir=socket_dir)
            self.restarts += 1
            try:
                await wait_ready(self.worker, client, self.start_timeout_s)
            except EngineUnavailableError as exc:
                reason = f"the restarted engine worker (pid {self.worker.pid}) failed to start: {exc}"
                continue
            log.info("engine worker restarted (pid %d)", self.worker.pid)
            return True

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop)
