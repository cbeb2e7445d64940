"""Start a `sluice worker` child process on a private unix socket and wait until it is ready.

`sluice serve` uses this so the model runs in its own process (not sharing the GIL with the
HTTP event loop). The child inherits stderr (its load progress shows), dies with its parent
(PR_SET_PDEATHSIG on Linux), and is stopped by PID: SIGTERM, then SIGKILL after a grace.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from sluice.errors import EngineUnavailableError
from sluice.worker.grpc_client import GrpcEngineClient


ENGINE_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "kv_cache_gib": "--kv-cache-gib",
    "max_model_len": "--max-model-len",
    "scheduling_policy": "--scheduling-policy",
    "admission_policy": "--admission-policy",
}


def engine_argv(values: dict) -> list[str]:
    """Flags for a `sluice worker` child from resolved settings values."""
    argv: list[str] = []
    for name, flag in ENGINE_FLAGS.items():
        if values.get(name) is not None:
            argv += [flag, str(values[name])]
    if values.get("enable_prefix_caching") is False:
        argv.append("--no-prefix-caching")
    return argv


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class LocalWorker:
    process: subprocess.Popen
    address: str
    socket_dir: str

    def stop(self, grace_s: float = 10.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        return self.process.returncode


def start_local_worker(model: str | None, dtype: str, engine_args: list[str]) -> LocalWorker:
    socket_dir = tempfile.mkdtemp(prefix="sluice-worker-")
    address = f"unix:{os.path.join(socket_dir, 'worker.sock')}"
    argv = [sys.executable, "-m", "sluice.cli", "worker", "--listen", address, "--dtype", dtype, *engine_args]
    if model:
        argv += ["--model", model]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    return LocalWorker(process, address, socket_dir)


async def wait_ready(worker: LocalWorker, client: GrpcEngineClient, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        code = worker.process.poll()
        if code is not None:
            raise EngineUnavailableError(f"the engine worker exited with code {code} while starting (see its output above)")
        try:
            ready, detail = await client.health(timeout=1.0)
        except EngineUnavailableError:
            ready, detail = False, "not listening yet"
        if ready:
            return
        if detail.startswith("failed"):
            raise EngineUnavailableError(f"the engine worker {detail}")
        if time.monotonic() > deadline:
            raise EngineUnavailableError(f"the engine worker was not ready after {timeout_s:.0f}s ({detail})")
        await asyncio.sleep(0.2)
