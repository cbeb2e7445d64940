"""The worker process: gRPC server first (Health answers at once), then the model, then serve.

SIGTERM/SIGINT: stop accepting, give in-flight calls a short grace, abort what is left
(every stream gets a final aborted event), exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from pathlib import Path

import grpc

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import BUNDLED_FILE, load_model
from sluice.worker.channel_options import SERVER_OPTIONS
from sluice.worker.engine_client import ModelInfo
from sluice.worker.grpc_server import EngineServicer
from sluice.worker.proto import engine_pb2_grpc as pb_grpc

log = logging.getLogger("sluice.worker")
BUNDLED_NAME = "smollm2-135m-instruct"


def served_name(path: Path) -> str:
    return BUNDLED_NAME if path.name == BUNDLED_FILE else path.stem


async def run_worker(listen: str, model: str | None, dtype: str, config: EngineConfig, grace_s: float = 5.0) -> int:
    servicer = EngineServicer()
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_EngineServicer_to_server(servicer, server)
    if server.add_insecure_port(listen) == 0 and not listen.startswith("unix:"):
        print(f"sluice worker: error: cannot listen on {listen}", file=sys.stderr)
        return 2
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    started = time.perf_counter()
    holder: dict = {}

    def build() -> LLMEngine:  # runs on the engine thread: all torch work on one thread
        loaded = load_model(model, dtype)
        holder["loaded"] = loaded
        return LLMEngine(loaded, config)

    engine = AsyncEngine(factory=build).start()
    load = asyncio.ensure_future(engine.wait_loaded())
    await asyncio.wait({load, asyncio.ensure_future(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if load.done():
        try:
            llm = load.result()
            loaded = holder["loaded"]
            info = ModelInfo(served_name(loaded.path), llm.max_model_len, loaded.tokenizer.vocab_size)
            servicer.set_engine(engine, info)
            print(
                f"sluice worker listening on {listen} (model {info.name}, loaded in {time.perf_counter() - started:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
        except Exception as exc:  # ModelLoadError and friends: report, keep Health answering "failed"
            servicer.set_failed(str(exc))
            print(f"sluice worker: error: {exc}", file=sys.stderr, flush=True)
            await server.stop(0)
            return 2
    await stop.wait()
    await server.stop(grace_s)
    engine.shutdown()
    return 0
