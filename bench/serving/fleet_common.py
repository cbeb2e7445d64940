"""Shared pieces of the fleet benchmarks: streamed requests with their timings, percentiles,
the CPU a process used, fleet files and the admin API."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import aconnect_sse

ADMIN = "bench-admin-key-0123456789"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN}"}
MODEL = "smollm2-135m-instruct"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    return os.getloadavg()[0]


@dataclass
class Reply:
    started: float
    first: float | None = None  # first content delta
    ended: float | None = None
    deltas: list[float] = field(default_factory=list)  # arrival time of every content delta
    message_id: str = ""
    version: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    status: int = 0

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.started

    @property
    def ok(self) -> bool:
        return (
            self.status == 200
            and bool(self.events)
            and self.events[-1] == "message_stop"
            and "error" not in self.events
        )


async def stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Reply:
    reply = Reply(time.perf_counter())
    h = {"sluice-cache": "bypass", **(headers or {})}
    async with aconnect_sse(client, "POST", url + "/v1/messages", json={**body, "stream": True}, headers=h) as es:
        reply.status = es.response.status_code
        reply.version = es.response.headers.get("sluice-model-version", "")
        if reply.status != 200:
            return reply
        async for sse in es.aiter_sse():
            reply.events.append(sse.event)
            data = json.loads(sse.data)
            if sse.event == "message_start":
                reply.message_id = data["message"]["id"]
            elif sse.event == "content_block_delta":
                now = time.perf_counter()
                reply.first = reply.first or now
                reply.deltas.append(now)
            elif sse.event == "message_delta":
                reply.usage = data.get("usage", {})
    reply.ended = time.perf_counter()
    return reply


def fleet_status(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/admin/fleet", headers=ADMIN_HEADERS, timeout=30)
    r.raise_for_status()
    return r.json()


def wait_warm(url: str, n: int, timeout: float = 600.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        warm = [w for w in fleet_status(url)["workers"] if w["status"] == "warm"]
        if len(warm) >= n:
            return warm
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {n} warm workers after {timeout:g} s")
        time.sleep(0.5)
