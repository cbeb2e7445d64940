"""Start a `sluice worker` child process on a private unix socket and wait until it is ready.

`sluice serve` uses this so the model runs in its own process (not sharing the GIL with the
HTTP event loop). Decisions:
- The child's stderr goes through a pipe that a thread copies to our stderr as it arrives, so
  its output (and load bar: we pass `--progress always` when our stderr is a terminal) still
  shows, while we keep the last few KiB to quote when it fails to start.
- It runs in its own session: a Ctrl-C on the terminal reaches only the parent, which then
  stops the child in order (drain HTTP first, then the worker); otherwise both would get
  SIGINT at once and the worker would abort streams the parent is still draining.
- It dies with its parent (PR_SET_PDEATHSIG on Linux), and is stopped by its own PID only:
  SIGTERM, then SIGKILL after a grace.
- `sluice serve` may start its worker *before* importing its HTTP stack (`prestart_local_worker`,
  called by cli/serve.py), so that the worker's torch import and model load overlap the
  gateway's own start-up on the other core instead of following it; the supervisor's first
  `start_local_worker` with exactly the same arguments then adopts that child instead of
  starting another, and `discard_prestarted` stops one nobody adopted. No grpc import here
  until a client is needed, so the prestart costs the gateway nothing it does not import anyway.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.engine.config import EngineConfig
from sluice.errors import EngineUnavailableError
from sluice.parent_death import tied_to_this_process

if TYPE_CHECKING:
    from sluice.worker.grpc_client import GrpcEngineClient

log = logging.getLogger("sluice.worker")
TAIL_BYTES = 8192  # how much of the child's stderr we keep for error messages
# Health is asked this often while a worker starts: a unary call on a local socket, so cheap
# enough to tell "ready" within 50 ms of it (/ready follows at once, after one warm-up request)
READY_POLL_S = 0.05


def engine_argv(config: EngineConfig, faults: str | None = None) -> list[str]:
    """`sluice worker` flags carrying a whole EngineConfig (`--engine-config JSON`: every field,
    per-version overrides included, without a flag per field) and its fault injection."""
    argv = ["--engine-config", json.dumps(dataclasses.asdict(config), separators=(",", ":"))]
    if faults:
        argv += ["--fault-injection", faults]
    return argv


class _StderrTee:
    """Copies the child's stderr pipe to our stderr and keeps its tail.

    `echo=False` (a prestarted worker) holds the output back until `release()`: a worker nobody
    adopts (start-up failed early) then prints nothing, so the operator sees one error, ours."""

    def __init__(self, pipe, echo: bool = True) -> None:
        self._pipe = pipe
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self._echo = echo
        self._held: list[bytes] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, name="sluice-worker-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        fd = self._pipe.fileno()
        while chunk := os.read(fd, 4096):
            with self._lock:
                self._tail.append(chunk)
                self._tail_len += len(chunk)
                while self._tail_len - len(self._tail[0]) >= TAIL_BYTES:
                    self._tail_len -= len(self._tail.popleft())
                if self._echo:
                    self._write(chunk)
                else:
                    self._held.append(chunk)
        self._pipe.close()

    def _write(self, chunk: bytes) -> None:  # under the lock: chunks leave in order
        try:
            sys.stderr.write(self._decoder.decode(chunk))
            sys.stderr.flush()
        except (OSError, ValueError):  # our stderr is closed: keep draining the pipe
            pass

    def release(self) -> None:
        """Print what was held back, then copy as it arrives."""
        with self._lock:
            for chunk in self._held:
                self._write(chunk)
            self._held.clear()
            self._echo = True

    def tail(self, lines: int) -> str:
        with self._lock:
            text = b"".join(self._tail).decode("utf-8", errors="replace")
        # a progress bar redraws with \r: keep only each line's last drawing
        kept = [drawn for line in text.split("\n") if (drawn := line.rsplit("\r", 1)[-1]).strip()]
        return "\n".join(kept[-lines:])

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


@dataclass
class LocalWorker:
    """A `sluice worker` child started by `start_local_worker` / `spawn_local_worker`."""

    process: subprocess.Popen
    address: str  # unix:<socket_dir>/worker.sock
    socket_dir: str
    _tee: _StderrTee | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr_tail(self, lines: int = 20) -> str:
        """The last lines the worker wrote to stderr (empty when not captured)."""
        return self._tee.tail(lines) if self._tee is not None else ""

    def stop(self, grace_s: float = 10.0, keep_socket_dir: bool = False) -> int | None:
        """SIGTERM, wait `grace_s`, then SIGKILL; returns the exit code. Idempotent."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # Popen never signals a reaped PID
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self._tee is not None:
            self._tee.join(2.0)
        if not keep_socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        return self.process.returncode


# children started by prestart_local_worker and not yet adopted: (model, dtype, engine args) -> child
_prestarted: dict[tuple[str | None, str, tuple[str, ...]], LocalWorker] = {}


def prestart_local_worker(model: str | None, dtype: str, engine_args: Sequence[str] = ()) -> LocalWorker:
    """Start the worker a later `start_local_worker(model, dtype, engine_args)` will ask for, now.
    Call it from the thread that will run the event loop (see sluice/parent_death.py)."""
    key = (model, dtype, tuple(engine_args))
    if key not in _prestarted:
        _prestarted[key] = _launch(model, dtype, engine_args, tempfile.mkdtemp(prefix="sluice-worker-"), echo=False)
    return _prestarted[key]


def discard_prestarted(grace_s: float = 10.0) -> None:
    """Stop the prestarted workers nobody adopted (start-up failed early, or the fleet asked for
    other workers)."""
    while _prestarted:
        _, worker = _prestarted.popitem()
        worker.stop(grace_s)


def start_local_worker(
    model: str | None, dtype: str, engine_args: Sequence[str] = (), socket_dir: str | None = None
) -> LocalWorker:
    """Start the child and return at once (it listens before its model is loaded); or hand over
    the one prestarted with the same arguments (it may be loaded already, or have failed: the
    caller's wait_ready reports either as for a fresh child).

    `socket_dir`: reuse this directory (a restarted worker keeps its address, so the clients'
    channels reconnect to it); default: a new private temporary directory."""
    if socket_dir is None and (adopted := _prestarted.pop((model, dtype, tuple(engine_args)), None)) is not None:
        log.info("adopted the engine worker started before the gateway's imports (pid %d)", adopted.pid)
        if adopted._tee is not None:
            adopted._tee.release()
        return adopted
    if socket_dir is None:
        socket_dir = tempfile.mkdtemp(prefix="sluice-worker-")
    else:
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
    return _launch(model, dtype, engine_args, socket_dir)


def _launch(
    model: str | None, dtype: str, engine_args: Sequence[str], socket_dir: str, echo: bool = True
) -> LocalWorker:
    address = f"unix:{os.path.join(socket_dir, 'worker.sock')}"
    progress = "always" if sys.stderr.isatty() else "never"
    argv = [sys.executable, "-m", "sluice.cli", "worker", "--listen", address, "--dtype", dtype, "--progress", progress]
    argv += list(engine_args)
    if model:
        argv += ["--model", str(model)]
    process = subprocess.Popen(
        tied_to_this_process() + argv,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    return LocalWorker(process, address, socket_dir, _StderrTee(process.stderr, echo))


def _failure(worker: LocalWorker, what: str) -> EngineUnavailableError:
    tail = worker.stderr_tail()
    return EngineUnavailableError(f"{what}; its last output:\n{tail}" if tail else what)


async def wait_ready(worker: LocalWorker, client: GrpcEngineClient, timeout_s: float) -> None:
    """Poll Health until ready. Raises EngineUnavailableError (quoting the worker's stderr tail)
    if it exits, reports a failed load, or is not ready within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = worker.process.poll()
        if code is not None:
            await asyncio.to_thread(worker.stop, 0, True)  # let the tee read to EOF first
            raise _failure(worker, f"the engine worker exited with code {code} while starting")
        try:
            ready, detail = await client.health(timeout_s=1.0)
        except EngineUnavailableError:
            ready, detail = False, "not listening yet"
        if ready:
            return
        if detail.startswith("failed"):
            raise _failure(worker, f"the engine worker {detail}")
        if time.monotonic() > deadline:
            raise _failure(worker, f"the engine worker was not ready after {timeout_s:.0f}s ({detail})")
        await asyncio.sleep(READY_POLL_S)


async def spawn_local_worker(
    model: str | None = None, dtype: str = "float32", engine_args: Sequence[str] = (), timeout_s: float = 180.0
) -> LocalWorker:
    """Start a worker child and wait until its Health says ready; stop it again on failure."""
    from sluice.worker.grpc_client import GrpcEngineClient

    worker = start_local_worker(model, dtype, engine_args)
    probe = GrpcEngineClient(worker.address)
    try:
        await wait_ready(worker, probe, timeout_s)
    except BaseException:
        await asyncio.to_thread(worker.stop, 2.0)
        raise
    finally:
        await probe.close()
    return worker
