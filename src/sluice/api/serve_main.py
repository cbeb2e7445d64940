"""Bring up `sluice serve`: listen at once, start the engine, mark ready, drain on exit.

The HTTP socket is bound before anything slow happens, so /health answers during start-up and
/ready tells "loading" from "ready". The worker loads the model while this process loads only
the tokenizer (both in parallel). A start-up failure ends the process with exit code 2 and a
one-line reason.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from sluice.api.app import create_app
from sluice.serving.runtime import ServingRuntime
from sluice.api.server import build_server, make_socket
from sluice.config import Settings
from sluice.worker.engine_client import EngineClient

log = logging.getLogger("sluice.serve")
EXIT_WORKER_FAILED = 3  # the spawned worker exited more often than worker_max_restarts allows


def _say(message: str) -> None:
    print(f"sluice: {message}", file=sys.stderr, flush=True)


async def _connect_engine(settings: Settings, holder: dict) -> EngineClient:
    """The engine client, plus (in `holder`) its health monitor and, for a spawned worker, the
    supervisor that restarts it."""
    from sluice.worker.grpc_client import GrpcEngineClient
    from sluice.worker.health_monitor import EngineHealth
    from sluice.worker.restart_policy import RestartPolicy
    from sluice.worker.spawn import engine_argv
    from sluice.worker.supervisor import WorkerSupervisor

    def monitor(probe) -> EngineHealth:
        return EngineHealth(probe, settings.health_check_interval_s, settings.health_check_timeout_s)

    if settings.worker == "inline":
        client = await _inline_engine(settings)

        async def inline_probe() -> tuple[bool, str]:
            ready = await client.ready()
            return ready, "ready" if ready else "the engine loop stopped"

        holder["health"] = monitor(inline_probe)
        return client
    if settings.worker:
        remote = GrpcEngineClient(settings.worker)
        deadline = time.monotonic() + settings.worker_start_timeout_s
        while not await remote.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker at {settings.worker} is not ready")
            await asyncio.sleep(0.5)
        holder["health"] = monitor(lambda: remote.health(timeout=settings.health_check_timeout_s))
        return remote
    policy = RestartPolicy(settings.worker_max_restarts, settings.worker_restart_window_s)
    supervisor = WorkerSupervisor(
        settings.model, settings.dtype, engine_argv(settings.model_dump()), settings.worker_start_timeout_s, policy
    )
    holder["supervisor"] = supervisor
    local = await supervisor.start(GrpcEngineClient)
    _say(f"engine worker ready (pid {supervisor.worker.pid if supervisor.worker else '?'})")
    health = monitor(lambda: local.health(timeout=settings.health_check_timeout_s))
    supervisor.health = health
    holder["health"] = health
    return local


async def _inline_engine(settings: Settings) -> EngineClient:
    from sluice.engine.async_engine import AsyncEngine
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model
    from sluice.worker.engine_client import ModelInfo
    from sluice.worker.in_process import InProcessEngineClient
    from sluice.worker.worker_main import served_name

    config = EngineConfig(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        kv_cache_gib=settings.kv_cache_gib,
        max_model_len=settings.max_model_len,
        scheduling_policy=settings.scheduling_policy,
        admission_policy=settings.admission_policy,
        enable_prefix_caching=settings.enable_prefix_caching,
    )
    holder: dict = {}

    def build() -> LLMEngine:  # on the engine thread (see AsyncEngine on OpenMP pools)
        holder["loaded"] = load_model(settings.model, settings.dtype)
        return LLMEngine(holder["loaded"], config)

    engine = AsyncEngine(factory=build).start()
    llm = await engine.wait_loaded()
    loaded = holder["loaded"]
    info = ModelInfo(served_name(loaded.path), llm.max_model_len, loaded.tokenizer.vocab_size)
    return InProcessEngineClient(engine, info)


async def serve(settings: Settings, access_log: bool = False) -> int:
    from sluice.models.tokenizer_loader import load_tokenizer

    from sluice.gateway.factory import build_authenticator

    try:
        authenticator, auth_mode = build_authenticator(settings)
    except ValueError as exc:
        _say(f"error: {exc}")
        return 2
    rt = ServingRuntime(settings, authenticator=authenticator)
    app = create_app(rt)
    try:
        sock = make_socket(settings.host, settings.port, settings.tcp_keepalive, settings.tcp_user_timeout_ms)
    except OSError as exc:
        _say(f"error: cannot listen on {settings.host}:{settings.port}: {exc.strerror}")
        return 2
    host, port = sock.getsockname()[:2]
    base = f"http://{host}:{port}"
    _say(f"listening on {base} (loading the model...)")
    server = build_server(app, rt, access_log)
    holder: dict = {}
    started = time.perf_counter()

    async def bring_up() -> None:
        tokenizer_task = asyncio.ensure_future(asyncio.to_thread(load_tokenizer, settings.model))
        try:
            engine = await _connect_engine(settings, holder)
            holder["engine"] = engine
            tokenizer, _ = await tokenizer_task
            info = await engine.info()
            stats = await engine.stats()
            health = holder["health"]
            await health.check()
            health.start()
            rt.health = health
            supervisor = holder.get("supervisor")
            if supervisor is not None:
                supervisor.on_give_up = give_up
                supervisor.watch(engine)
            rt.mark_ready(engine, tokenizer, info, stats.block_size, stats.kv_blocks_total * stats.block_size)
            _say(
                f"ready: model {rt.model_ids[0]} at {base}/v1 (auth: {auth_mode}, limits: {settings.limits_store}; "
                f"started in {time.perf_counter() - started:.1f}s)"
            )
        except Exception as exc:
            if tokenizer_task.done() and not tokenizer_task.cancelled() and tokenizer_task.exception() is not None:
                exc = tokenizer_task.exception()  # the clearer reason (e.g. no such model path)
            else:
                tokenizer_task.cancel()
            rt.startup_error = str(exc)
            _say(f"error: start-up failed: {exc}")
            server.should_exit = True

    def give_up(reason: str) -> None:
        # the worker keeps dying: exit non-zero so our own supervisor restarts the process
        holder["exit_code"] = EXIT_WORKER_FAILED
        rt.startup_error = reason
        _say(f"error: {reason}; exiting")
        server.should_exit = True

    task = asyncio.create_task(bring_up())
    try:
        await server.serve(sockets=[sock])
    finally:
        task.cancel()
        health = holder.get("health")
        if health is not None:
            await health.stop()
        supervisor = holder.get("supervisor")
        if supervisor is not None:
            await supervisor.stop()
        engine = holder.get("engine")
        if engine is not None:
            await engine.close()
    if "exit_code" in holder:
        return holder["exit_code"]
    return 2 if rt.startup_error else 0
