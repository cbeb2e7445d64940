"""Bring up `sluice serve`: listen at once, start the engine, mark ready, drain on exit.

The HTTP socket is bound before anything slow happens, so /health answers during start-up and
/ready tells "loading" from "ready". The fleet starts (serving/fleet_setup.py): local workers
load their models while this process loads only the tokenizers. A start-up failure ends the
process with exit code 2 and a one-line reason; local workers that keep dying end it with 3.
SIGHUP rereads the fleet file (as `POST /admin/fleet/reload` does) and logs the outcome; an
invalid file keeps the running fleet.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time

from sluice.api.app import create_app
from sluice.api.server import DrainingServer, build_server, make_socket
from sluice.config import Settings
from sluice.errors import InvalidRequestError
from sluice.gateway.factory import build_authenticator
from sluice.gateway.tiers import load_tiers
from sluice.heap import freeze_startup_objects, trim_heap
from sluice.serving.fleet_admin import AdminError, FleetAdmin
from sluice.serving.fleet_setup import Fleet, Registry, build_registry, start_fleet
from sluice.serving.guided import resolve_tool_format
from sluice.serving.runtime import ServingRuntime, build_safety

log = logging.getLogger("sluice.serve")
EXIT_START_FAILED = 2
EXIT_WORKER_FAILED = 3  # the spawned worker exited more often than worker_max_restarts allows


def _say(message: str) -> None:
    """An operator-facing line ("sluice: listening on …", "sluice: ready: …", "sluice: error: …"),
    through the log like every other line (JSON by default)."""
    (log.error if message.startswith("error") else log.info)("sluice: %s", message)


async def serve(settings: Settings, access_log: bool = False) -> int:
    try:
        authenticator, auth_mode = build_authenticator(settings)
        resolve_tool_format(settings.tool_format)  # a bad tool format stops start-up, not a request
    except (ValueError, InvalidRequestError) as exc:
        _say(f"error: {exc}")
        return EXIT_START_FAILED
    rt = ServingRuntime(settings, authenticator=authenticator)
    app = create_app(rt)
    try:
        sock = make_socket(settings.host, settings.port, settings.tcp_keepalive, settings.tcp_user_timeout_ms)
    except OSError as exc:
        _say(f"error: cannot listen on {settings.host}:{settings.port}: {exc.strerror}")
        return EXIT_START_FAILED
    host, port = sock.getsockname()[:2]
    base = f"http://{host}:{port}"
    _say(f"listening on {base} (loading the model...)")
    process = ServeProcess(settings, rt, build_server(app, rt, access_log), base, auth_mode)
    return await process.run(sock)


class ServeProcess:
    """One `sluice serve` from its bound socket to its exit code: the server listens while the
    fleet comes up beside it; SIGHUP reloads; the fleet and stores close however it ends."""

    def __init__(self, settings: Settings, rt: ServingRuntime, server: DrainingServer, base: str, auth_mode: str):
        self.settings, self.rt, self.server, self.base, self.auth_mode = settings, rt, server, base, auth_mode
        self.fleet: Fleet | None = None
        self.exit_code = 0
        self.started = time.perf_counter()

    async def run(self, sock: socket.socket) -> int:
        loop = asyncio.get_running_loop()
        # installed before anything slow: SIGHUP's default action would end the process
        loop.add_signal_handler(signal.SIGHUP, self.on_hangup)
        task = asyncio.create_task(self.bring_up())
        try:
            await self.server.serve(sockets=[sock])
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            if self.fleet is not None:
                await self.fleet.close()
            await self.rt.replay.close()
            await self.rt.idempotency.close()
        return self.exit_code

    def give_up(self, reason: str) -> None:
        """The local workers keep dying: exit non-zero so our own supervisor restarts the process."""
        self.exit_code = EXIT_WORKER_FAILED
        self.rt.startup_error = reason
        _say(f"error: {reason}; exiting")
        self.server.should_exit = True

    async def bring_up(self) -> None:
        settings, rt = self.settings, self.rt
        # the safety pipelines (~1 s: the classifier's model, the pattern databases) build on a
        # thread while the workers load, not after them: they were the last second before /ready
        safety = asyncio.ensure_future(asyncio.to_thread(build_safety, settings)) if settings.safety else None
        try:
            registry = build_registry(settings, list(load_tiers(settings.tiers)))
            self.fleet = fleet = await start_fleet(settings, registry)
            if safety is not None:
                rt.safety = await safety
            fleet.on_give_up = self.give_up
            self.ready(registry, fleet)
        except Exception as exc:
            if safety is not None:
                safety.cancel()  # its thread ends on its own; nobody needs its result (or error)
            rt.startup_error = str(exc)
            self.exit_code = EXIT_START_FAILED
            _say(f"error: start-up failed: {exc}")
            self.server.should_exit = True

    def ready(self, registry: Registry, fleet: Fleet) -> None:
        rt, settings = self.rt, self.settings
        rt.mark_ready(fleet, fleet.capacity()[0])
        # start-up's objects out of the collector's full passes (heap.py), then the freed heap
        # the tokenizers' build and the safety pipelines' peak left behind (docs/BENCHMARKS.md,
        # "Serve memory") given back once
        rt.metrics.gc_frozen.set(freeze_startup_objects())
        trim_heap()
        rt.keep_task(follow_capacity(rt, fleet, settings.health_check_interval_s))
        workers = ", ".join(f"{h.model_id}/{h.version}@{h.worker_id}" for h in fleet.handles.values())
        _say(
            f"ready: {', '.join(registry.fleet.models)} at {self.base}/v1 (workers: {workers}; auth: {self.auth_mode}, "
            f"limits: {settings.limits_store}; started in {time.perf_counter() - self.started:.1f}s)"
        )

    def on_hangup(self) -> None:
        if self.fleet is None:
            log.warning("SIGHUP ignored: the fleet is still starting")
        else:
            self.rt.keep_task(reload_fleet(FleetAdmin(self.fleet, self.settings.tiers)))


async def reload_fleet(admin: FleetAdmin) -> None:
    """SIGHUP: the reload the admin API does, with its outcome in the log (nobody else sees it)."""
    try:
        r = await admin.reload()
    except AdminError as exc:
        log.error("SIGHUP: the fleet file was NOT reloaded; the running fleet is kept: %s", exc.message)
        return
    log.info(
        "SIGHUP: fleet file reloaded (models added %s, removed %s, changed %s; workers added %s, removed %s; "
        "replicas starting %s, stopping %s)",
        r["added"],
        r["removed"],
        r["changed"],
        r["workers_added"],
        r["workers_removed"],
        r["replicas_starting"],
        r["replicas_stopping"],
    )


async def follow_capacity(rt: ServingRuntime, fleet: Fleet, every_s: float) -> None:
    """Keep the admission queue's dispatch limit and the scaling signal's capacity in step with
    the workers that take requests (workers join, die, drain, come back)."""
    assert rt.gateway is not None
    queue = rt.gateway.admission
    while True:
        tokens, seqs = fleet.capacity()
        if tokens:
            queue.capacity_tokens = tokens
        queue.set_capacity(max_inflight=rt.settings.max_inflight or max(1, seqs) + 8)
        await asyncio.sleep(every_s)
