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
import time

from sluice.api.app import create_app
from sluice.api.server import build_server, make_socket
from sluice.config import Settings
from sluice.errors import InvalidRequestError
from sluice.gateway.factory import build_authenticator
from sluice.gateway.tiers import load_tiers
from sluice.heap import freeze_startup_objects, trim_heap
from sluice.serving.fleet_admin import AdminError, FleetAdmin
from sluice.serving.fleet_setup import Fleet, build_registry, start_fleet
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
    server = build_server(app, rt, access_log)
    fleet: Fleet | None = None
    exit_code = 0
    started = time.perf_counter()

    def give_up(reason: str) -> None:
        # the local workers keep dying: exit non-zero so our own supervisor restarts the process
        nonlocal exit_code
        exit_code = EXIT_WORKER_FAILED
        rt.startup_error = reason
        _say(f"error: {reason}; exiting")
        server.should_exit = True

    async def bring_up() -> None:
        nonlocal fleet, exit_code
        # the safety pipelines (~1 s: the classifier's model, the pattern databases) build on a
        # thread while the workers load, not after them: they were the last second before /ready
        safety = asyncio.ensure_future(asyncio.to_thread(build_safety, settings)) if settings.safety else None
        try:
            registry = build_registry(settings, list(load_tiers(settings.tiers)))
            fleet = await start_fleet(settings, registry)
            if safety is not None:
                rt.safety = await safety
            fleet.on_give_up = give_up
            rt.mark_ready(fleet, fleet.capacity()[0])
            # start-up's objects out of the collector's full passes (heap.py), then the freed heap
            # the tokenizers' build and the safety pipelines' peak left behind (docs/BENCHMARKS.md,
            # "Serve memory") given back once
            rt.metrics.gc_frozen.set(freeze_startup_objects())
            trim_heap()
            rt.keep_task(follow_capacity(rt, fleet, settings.health_check_interval_s))
            workers = ", ".join(f"{h.model_id}/{h.version}@{h.worker_id}" for h in fleet.handles.values())
            _say(
                f"ready: {', '.join(registry.fleet.models)} at {base}/v1 (workers: {workers}; auth: {auth_mode}, "
                f"limits: {settings.limits_store}; started in {time.perf_counter() - started:.1f}s)"
            )
        except Exception as exc:
            if safety is not None:
                safety.cancel()  # its thread ends on its own; nobody needs its result (or error)
            rt.startup_error = str(exc)
            exit_code = EXIT_START_FAILED
            _say(f"error: start-up failed: {exc}")
            server.should_exit = True

    def on_hangup() -> None:
        if fleet is None:
            log.warning("SIGHUP ignored: the fleet is still starting")
        else:
            rt.keep_task(reload_fleet(FleetAdmin(fleet, settings.tiers)))

    # installed before anything slow: SIGHUP's default action would end the process
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hangup)
    task = asyncio.create_task(bring_up())
    try:
        await server.serve(sockets=[sock])
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        if fleet is not None:
            await fleet.close()
        await rt.replay.close()
        await rt.idempotency.close()
    return exit_code


async def reload_fleet(admin: FleetAdmin) -> None:
    """SIGHUP: the reload the admin API does, with its outcome in the log (nobody else sees it)."""
    try:
        r = await admin.reload()
    except AdminError as exc:
        log.error("SIGHUP: the fleet file was NOT reloaded; the running fleet is kept: %s", exc.message)
        return
    log.info("SIGHUP: fleet file reloaded (models added %s, removed %s, changed %s; workers added %s, removed %s; "
             "replicas starting %s, stopping %s)", r["added"], r["removed"], r["changed"], r["workers_added"],
             r["workers_removed"], r["replicas_starting"], r["replicas_stopping"])


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
