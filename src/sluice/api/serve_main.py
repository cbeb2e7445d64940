"""Bring up `sluice serve`: listen at once, start the engine, mark ready, drain on exit.

The HTTP socket is bound before anything slow happens, so /health answers during start-up and
/ready tells "loading" from "ready". The worker loads the model while this process loads only
the tokenizer (both in parallel). A start-up failure ends the process with exit code 2 and a
one-line reason; a spawned worker that keeps dying ends it with exit code 3.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from sluice.api.app import create_app
from sluice.api.server import build_server, make_socket
from sluice.config import Settings
from sluice.gateway.factory import build_authenticator
from sluice.models.tokenizer_loader import load_tokenizer
from sluice.serving.engine_setup import EngineConnection, connect_engine
from sluice.serving.runtime import ServingRuntime

log = logging.getLogger("sluice.serve")
EXIT_START_FAILED = 2
EXIT_WORKER_FAILED = 3  # the spawned worker exited more often than worker_max_restarts allows


def _say(message: str) -> None:
    print(f"sluice: {message}", file=sys.stderr, flush=True)


async def serve(settings: Settings, access_log: bool = False) -> int:
    try:
        authenticator, auth_mode = build_authenticator(settings)
    except ValueError as exc:
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
    connection: EngineConnection | None = None
    exit_code = 0
    started = time.perf_counter()

    def give_up(reason: str) -> None:
        # the worker keeps dying: exit non-zero so our own supervisor restarts the process
        nonlocal exit_code
        exit_code = EXIT_WORKER_FAILED
        rt.startup_error = reason
        _say(f"error: {reason}; exiting")
        server.should_exit = True

    async def bring_up() -> None:
        nonlocal connection, exit_code
        tokenizer_task = asyncio.ensure_future(asyncio.to_thread(load_tokenizer, settings.model))
        try:
            connection = await connect_engine(settings, _say)
            tokenizer, _ = await tokenizer_task
            engine = connection.client
            info = await engine.info()
            stats = await engine.stats()
            await connection.health.check()
            connection.health.start()
            rt.health = connection.health
            if connection.supervisor is not None:
                connection.supervisor.on_give_up = give_up
                connection.supervisor.watch(engine)
            rt.mark_ready(engine, tokenizer, info, stats.block_size, stats.kv_blocks_total * stats.block_size)
            _say(
                f"ready: model {rt.model_ids[0]} at {base}/v1 (auth: {auth_mode}, limits: {settings.limits_store}; "
                f"started in {time.perf_counter() - started:.1f}s)"
            )
        except Exception as exc:
            reason: BaseException = exc
            if tokenizer_task.done() and not tokenizer_task.cancelled() and tokenizer_task.exception() is not None:
                reason = tokenizer_task.exception() or exc  # the clearer reason (e.g. no such model path)
            else:
                tokenizer_task.cancel()
            rt.startup_error = str(reason)
            exit_code = EXIT_START_FAILED
            _say(f"error: start-up failed: {reason}")
            server.should_exit = True

    task = asyncio.create_task(bring_up())
    try:
        await server.serve(sockets=[sock])
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        if connection is not None:
            await connection.close()
        await rt.replay.close()
    return exit_code
