"""Helpers for the fleet's real-process tests: fleet files, keys, the admin API, bounded waits.

Every wait is bounded and generous (a busy CI machine is slow, never wrong); none of them is a
speed assertion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import connect_sse

from tests.server_process import MODEL, Proc

ADMIN = "admin-test-key-0123456789"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN}"}
SMALL_ENGINE = "kv_cache_gib = 0.1\nmax_num_seqs = 8"


def local_version(model: str, name: str, traffic: float, replicas: int = 1, extra: str = "") -> str:
    """A version of the bundled model served by local replicas with a small KV pool."""
    t = f'models."{model}".versions.{name}'
    return (
        f'[{t}]\nweights = "bundled"\ntraffic = {traffic:g}\nreplicas = {replicas}\n{extra}\n'
        f"[{t}.engine]\n{SMALL_ENGINE}\n"
    )


def remote_version(model: str, name: str, traffic: float, address: str) -> str:
    return f'[models."{model}".versions.{name}]\nweights = "bundled"\ntraffic = {traffic:g}\nworkers = ["{address}"]\n'


def make_key(data_dir: Path, tenant: str, tier: str) -> str:
    from sluice.gateway.key_store import SQLiteKeyStore

    data_dir.mkdir(parents=True, exist_ok=True)
    return SQLiteKeyStore(data_dir / "keys.db").create(tenant, tier)[0]


def status(proc: Proc) -> dict[str, Any]:
    r = httpx.get(proc.base_url + "/admin/fleet", headers=ADMIN_HEADERS, timeout=30)
    r.raise_for_status()
    return r.json()


def admin(proc: Proc, method: str, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.request(method, proc.base_url + path, headers=ADMIN_HEADERS, json=body, timeout=60)


def wait_until(check: Callable[[], Any], what: str, timeout: float = 600.0, every: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(every)


def warm_workers(proc: Proc, model: str = MODEL, version: str | None = None) -> list[dict]:
    return [
        w
        for w in status(proc)["workers"]
        if w["status"] == "warm" and w["model"] == model and (version is None or w["version"] == version)
    ]


def rollout_of(proc: Proc, model: str = MODEL) -> dict | None:
    return status(proc)["models"][model]["rollout"]


def ask(
    proc: Proc,
    key: str | None,
    user: str | None = None,
    model: str = MODEL,
    headers: dict | None = None,
    max_tokens: int = 1,
    text: str = "Say hello.",
) -> httpx.Response:
    """One non-streaming Messages call (response cache bypassed: every call is routed)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": text}],
    }
    if user is not None:
        body["metadata"] = {"user_id": user}
    h = {"sluice-cache": "bypass", **(headers or {})}
    if key is not None:
        h["x-api-key"] = key
    return httpx.post(proc.base_url + "/v1/messages", json=body, headers=h, timeout=300)


def stream(proc: Proc, key: str | None, user: str, max_tokens: int, text: str) -> dict[str, Any]:
    """One streamed Messages call: its events, text, version header and final usage."""
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "metadata": {"user_id": user},
        "messages": [{"role": "user", "content": text}],
    }
    h = {"sluice-cache": "bypass", **({"x-api-key": key} if key else {})}
    events, parts, final = [], [], {}
    began = time.monotonic()
    with (
        httpx.Client(timeout=300) as c,
        connect_sse(c, "POST", proc.base_url + "/v1/messages", json=body, headers=h) as es,
    ):
        version = es.response.headers.get("sluice-model-version")
        status_code = es.response.status_code
        if status_code == 200:
            for sse in es.iter_sse():
                events.append(sse.event)
                data = json.loads(sse.data)
                if sse.event == "content_block_delta":
                    parts.append(data["delta"]["text"])
                elif sse.event == "message_delta":
                    final = data
                elif sse.event == "error":
                    final = data  # what went wrong, for the assertion's message
    return {
        "status": status_code,
        "events": events,
        "text": "".join(parts),
        "final": final,
        "version": version,
        "began": began,
        "at": time.monotonic(),
    }


def complete(reply: dict[str, Any], max_tokens: int) -> bool:
    """A stream that ended properly and was not cut short: message_stop, no error, and either
    the model's own end of turn or exactly max_tokens tokens."""
    final = reply["final"]
    if (
        reply["status"] != 200
        or "error" in reply["events"]
        or not reply["events"]
        or reply["events"][-1] != "message_stop"
    ):
        return False
    reason = final.get("delta", {}).get("stop_reason")
    tokens = final.get("usage", {}).get("output_tokens")
    return bool(reply["text"]) and (reason == "end_turn" or (reason == "max_tokens" and tokens == max_tokens))


def sluice_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, timeout=timeout)


def alive(pid: int) -> bool:
    """Whether a process we started still exists (signal 0 probes without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
