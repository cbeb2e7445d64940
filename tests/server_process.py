"""Start real `sluice serve` / `sluice worker` processes on free 127.0.0.1 ports for tests.

Every process is started here and stopped here, by its own PID (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sluice.common.ports import free_port  # re-exported: the tests' helpers import it from here

MODEL = "smollm2-135m-instruct"


@dataclass
class Proc:
    process: subprocess.Popen
    log_path: Path
    base_url: str = ""
    extra: dict = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def _spawn(args: list[str], env: dict[str, str] | None, name: str) -> Proc:
    log_path = Path(tempfile.mkdtemp(prefix=f"sluice-{name}-")) / "out.log"
    # the test decides every setting: nothing leaks in from the caller's SLUICE_* environment
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    full_env.update(env or {})
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
        )
    return Proc(process, log_path)


def start_server(args: Sequence[str] = (), env: dict[str, str] | None = None, timeout: float = 180.0) -> Proc:
    port = free_port()
    proc = _spawn(["serve", "--host", "127.0.0.1", "--port", str(port), *args], env, "serve")
    proc.base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.process.poll() is not None:
            raise RuntimeError(f"sluice serve exited with {proc.process.returncode}:\n{proc.log()}")
        try:
            if httpx.get(proc.base_url + "/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.stop()
    raise RuntimeError(f"sluice serve was not ready after {timeout}s:\n{proc.log()}")


def start_worker(address: str, args: Sequence[str] = (), timeout: float = 180.0) -> Proc:
    proc = _spawn(["worker", "--listen", address, *args], None, "worker")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "sluice worker listening" in proc.log():
            return proc
        if proc.process.poll() is not None:
            raise RuntimeError(f"sluice worker exited with {proc.process.returncode}:\n{proc.log()}")
        time.sleep(0.2)
    proc.stop()
    raise RuntimeError(f"sluice worker was not ready after {timeout}s:\n{proc.log()}")


def metric(base_url: str, name: str) -> float:
    """A metric's value from /metrics: summed over its series (the engine gauges carry model and
    version labels; a fleet of one version has one series). KeyError when it has none."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(base_url + "/metrics", timeout=5).text.splitlines()
        if line.startswith((name + " ", name + "{"))
    ]
    if not values:
        raise KeyError(name)
    return sum(values)


SETTLE_S = 120.0  # a generous bound for something that must happen "soon" on a busy machine


def wait_engine_idle(base_url: str, outputs_before: float, max_outputs: float, timeout: float = SETTLE_S) -> float:
    """Wait until the engine runs nothing; return the output tokens generated since
    `outputs_before` and assert they stayed below `max_outputs`. How a test proves an abort
    without timing it: an aborted request stops generating, one run to the end reaches its
    max_tokens — whatever the machine's speed."""
    deadline = time.monotonic() + timeout
    while metric(base_url, "sluice_engine_running_requests") != 0:
        assert time.monotonic() < deadline, "the engine never went idle"
        time.sleep(0.05)
    produced = metric(base_url, "sluice_output_tokens_total") - outputs_before
    assert produced < max_outputs, f"{produced:.0f} tokens generated: the request was not aborted"
    return produced
