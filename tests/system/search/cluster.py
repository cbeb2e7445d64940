"""Real search processes for the system tests: shard replicas and routers on free 127.0.0.1
ports, each started here and stopped here by its own PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.server_process import free_port

START_TIMEOUT_S = 120.0
# TCP_NODELAY, or each POST waits for a delayed ACK (40 ms) between its headers and its body
HTTP = httpx.Client(
    transport=httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]), timeout=120
)


@dataclass
class SearchProc:
    process: subprocess.Popen
    log_path: Path
    url: str
    args: list[str]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # in case a test left it stopped
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _spawn(
    args: list[str], log_path: Path, url: str, ready_path: str, extra_env: dict[str, str] | None = None
) -> SearchProc:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")} | (extra_env or {})
    with open(log_path, "ab") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "search", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    proc = SearchProc(p, log_path, url, args)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"sluice search {args[0]} exited with {p.returncode}:\n{proc.log()}")
        try:
            if httpx.get(url + ready_path, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.stop()
    raise RuntimeError(f"sluice search {args[0]} not ready after {START_TIMEOUT_S}s:\n{proc.log()}")


def start_shard(data_dir: Path, port: int | None = None) -> SearchProc:
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    return _spawn(
        ["shard", "--listen", f"127.0.0.1:{port}", "--data", str(data_dir)],
        data_dir.parent / f"{data_dir.name}.log",
        f"http://127.0.0.1:{port}",
        "/health",
    )


def restart(proc: SearchProc) -> SearchProc:
    return _spawn(proc.args, proc.log_path, proc.url, "/health" if proc.args[0] == "shard" else "/ready")


def start_router(
    tmp: Path, config: str | None = None, name: str = "router", env: dict[str, str] | None = None
) -> SearchProc:
    port = free_port()
    args = ["serve", "--port", str(port), "--data", str(tmp / f"{name}-data")]
    if config is not None:
        cfg = tmp / f"{name}.toml"
        cfg.write_text(config)
        args += ["--config", str(cfg)]
    return _spawn(args, tmp / f"{name}.log", f"http://127.0.0.1:{port}", "/ready", env)


def ingest(url: str, docs: list[dict[str, Any]], batch: int = 500, key: str | None = None) -> None:
    import json

    headers = {"authorization": f"Bearer {key}"} if key else {}
    for i in range(0, len(docs), batch):
        body = "\n".join(json.dumps(d) for d in docs[i : i + batch])
        r = HTTP.post(url + "/v1/search/documents", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert not r.json()["errors"], r.json()["errors"]


def search(url: str, query: str, top_k: int = 10, **kw: Any) -> httpx.Response:
    return HTTP.post(url + "/v1/search", json={"query": query, "top_k": top_k}, timeout=30, **kw)


def status(url: str) -> dict[str, Any]:
    return HTTP.get(url + "/v1/search/status", timeout=10).json()


def wait_for(cond, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def query_load(url: str, queries: list[str], results: list, stop: threading.Event) -> None:
    """A client thread's loop: the queries in turn until `stop`, each outcome recorded as
    (status or the transport error's name, the answer's `partial`)."""
    i = 0
    while not stop.is_set():
        try:
            r = search(url, queries[i % len(queries)])
            results.append((r.status_code, r.json().get("partial")))
        except httpx.HTTPError as exc:
            results.append((type(exc).__name__, None))
        i += 1
