"""The worker process: gRPC server first (Health answers at once), then the model, then serve.

Start-up order matters: listening before the (slow) model load lets a supervisor tell
"starting" (Health: not ready, detail "loading the model") from "dead" (connection refused).
When ready it prints exactly one line to stderr, `sluice worker listening on ADDR (model NAME)`;
supervisors and tests wait for it.

SIGTERM/SIGINT: stop accepting calls, abort every in-flight request (each open stream gets its
final `abort` event, so clients see a proper end rather than a transport error; a Stream call
then ends by itself), give those last messages a short grace to leave, exit 0. A signal during
the model load exits at once: the load runs on a daemon thread that cannot be interrupted, so we
do not wait for it.

SIGUSR1: drain (scale-down, Kubernetes preStop). Health turns NOT_SERVING at once, new requests
(Generate calls, or starts on a Stream call) are refused with UNAVAILABLE (the router retries
them elsewhere), the running ones finish, and the worker exits 0 when the last one has ended.
A SIGTERM during the drain stops as above.

Health is served twice: the worker's own `Health` RPC and the standard grpc.health.v1 service
(`standard_health.py`) that Kubernetes' grpc probes call.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
import stat
import time
from pathlib import Path

import grpc

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.heap import freeze_startup_objects
from sluice.models.bundled import BUNDLED_FILE
from sluice.models.loader import LoadedModel, load_model
from sluice.worker.channel_options import SERVER_OPTIONS
from sluice.worker.engine_client import ModelInfo
from sluice.worker.faults import FaultSpec
from sluice.worker.grpc_server import EngineServicer
from sluice.worker.proto import engine_pb2_grpc as pb_grpc
from sluice.worker.standard_health import WorkerHealth

log = logging.getLogger("sluice.worker")
BUNDLED_NAME = "smollm2-135m-instruct"
# after aborting everything, how long the final `abort` events get to reach their clients
SHUTDOWN_GRACE_S = 2.0


def served_name(path: Path) -> str:
    """The model id callers see: a stable name for the bundled model, else the file/folder stem."""
    return BUNDLED_NAME if path.name == BUNDLED_FILE else path.stem


def _unix_path(listen: str) -> str | None:
    if not listen.startswith("unix:"):
        return None
    path = listen[len("unix:") :]
    return path[2:] if path.startswith("//") else path


def _clear_stale_socket(path: str) -> None:
    """Remove a unix socket file left by a worker that died without cleaning up.

    Why check first: bind() fails on any existing file, but unlinking a socket another live
    worker still listens on would silently steal its address. Only a socket nobody answers on
    (ECONNREFUSED) is removed; anything else is left for bind() to report.
    """
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return
    except FileNotFoundError:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                os.unlink(path)


def _say(message: str) -> None:
    """An operator-facing line ("sluice worker listening on …"), through the log (JSON by default)."""
    (log.error if ": error:" in message else log.warning if ": warning:" in message else log.info)("%s", message)


async def run_worker(
    listen: str,
    model: str | None,
    dtype: str,
    config: EngineConfig,
    progress: bool | None = None,
    grace_s: float = SHUTDOWN_GRACE_S,
    faults: FaultSpec = FaultSpec(),
) -> int:
    """Serve one engine on `listen` until SIGTERM/SIGINT. Returns the process exit code.
    `faults`: a testing aid (worker/faults.py), inactive by default."""
    if faults.active:
        _say(f"sluice worker: warning: fault injection is on ({faults}) — a testing aid")
    servicer = EngineServicer(faults.request_faults())
    health = WorkerHealth()
    server = await _start_server(listen, servicer, health)
    if server is None:
        return 2
    stop = asyncio.Event()
    drain = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, drain.set)

    load = _ModelLoad(model, dtype, config, progress, faults)
    engine = AsyncEngine(factory=load.build).start()
    stop_wait = asyncio.ensure_future(stop.wait())
    await asyncio.wait({asyncio.ensure_future(load.built.wait()), stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        await health.stopped()
        await server.stop(0)
        engine.shutdown(timeout=0.1)  # the daemon load thread dies with the process
        return 0
    try:
        info = await load.info(engine)
    except Exception as exc:  # ModelLoadError and friends: one clear line, exit 2
        servicer.set_failed(str(exc))
        await health.stopped()
        _say(f"sluice worker: error: {exc}")
        await server.stop(0)
        return 2
    if drain.is_set():  # asked to drain while loading: nothing runs, nothing to wait for
        stop.set()
    servicer.set_engine(engine, info)
    freeze_startup_objects()  # the model's and tokenizer's objects out of the collector's full passes (heap.py)
    await health.ready()
    _say(f"sluice worker listening on {listen} (model {info.name})")

    exit_code = await _serve_until_stopped(engine, stop_wait, drain, servicer, health)
    await health.stopped()
    servicer.end_streams()  # each Stream call ends once the shutdown below has aborted its requests
    stopping = asyncio.ensure_future(server.stop(grace_s))  # refuses new calls from here on
    await asyncio.to_thread(engine.shutdown)  # aborts all: every open stream gets its final event
    await stopping
    return exit_code


async def _start_server(listen: str, servicer: EngineServicer, health: WorkerHealth) -> grpc.aio.Server | None:
    """The gRPC server listening on `listen`, Health answering "loading"; None (said why) when
    it cannot bind."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_EngineServicer_to_server(servicer, server)
    health.add_to(server)
    await health.loading()
    unix_path = _unix_path(listen)
    if unix_path:
        _clear_stale_socket(unix_path)
    try:
        server.add_insecure_port(listen)  # grpc raises RuntimeError when it cannot bind
    except RuntimeError:
        _say(f"sluice worker: error: cannot listen on {listen} (address in use, or a bad address)")
        return None
    await server.start()
    return server


class _ModelLoad:
    """The model load, as the engine's factory. The factory runs on the engine thread (all
    torch work on one thread: see AsyncEngine). It reports back through the loop, so waiting
    for it holds no executor thread that asyncio.run() would then have to join at exit (a
    signal during the load must not wait)."""

    def __init__(self, model: str | None, dtype: str, config: EngineConfig, progress: bool | None, faults: FaultSpec):
        self.model, self.dtype, self.config, self.progress, self.faults = model, dtype, config, progress, faults
        self.loop = asyncio.get_running_loop()
        self.built = asyncio.Event()
        self.loaded: LoadedModel | None = None

    def build(self) -> LLMEngine:
        try:
            if self.faults.load_delay_s:
                time.sleep(self.faults.load_delay_s)  # the testing aid: a slow load (worker/faults.py)
            config = self.config
            self.loaded = load_model(
                self.model, self.dtype, device=config.device, progress=self.progress, kernels=config.kernels
            )
            engine = LLMEngine(self.loaded, config)
            if self.faults.active:
                self.faults.install_on_engine(engine)  # the testing aid's engine faults (worker/faults.py)
            return engine
        finally:
            self.loop.call_soon_threadsafe(self.built.set)

    async def info(self, engine: AsyncEngine) -> ModelInfo:
        """What the worker serves, once built; re-raises the load's error."""
        llm = await engine.wait_loaded()  # returns at once now
        assert self.loaded is not None
        return ModelInfo(served_name(self.loaded.path), llm.max_model_len, self.loaded.tokenizer.vocab_size)


async def _serve_until_stopped(
    engine: AsyncEngine,
    stop_wait: asyncio.Future,
    drain: asyncio.Event,
    servicer: EngineServicer,
    health: WorkerHealth,
    poll_s: float = 0.5,
) -> int:
    """Wait for a stop signal or a finished drain (exit 0), or for the engine loop to die (exit 1).

    Why exit on a dead engine: a live process whose engine is gone would answer UNAVAILABLE
    forever; exiting lets whatever supervises it (sluice serve, Kubernetes) notice and restart.
    """
    drain_wait = asyncio.ensure_future(drain.wait())
    try:
        while not stop_wait.done():
            if drain.is_set() and not servicer.draining:
                servicer.start_drain()  # new calls refused from here on
                await health.draining()
                _say("sluice worker: draining (new requests refused; running ones finish)")
            if servicer.draining and servicer.active == 0:
                _say("sluice worker: drained; exiting")
                return 0
            # a drain waits in short steps: the last request's end is seen within poll_s / 5
            timeout = poll_s / 5 if servicer.draining else poll_s
            waits = {stop_wait} if drain.is_set() else {stop_wait, drain_wait}
            await asyncio.wait(waits, timeout=timeout)
            if not stop_wait.done() and not engine.is_running:
                _say("sluice worker: error: the engine loop stopped; exiting")
                return 1
        return 0
    finally:
        drain_wait.cancel()
