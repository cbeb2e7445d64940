"""Where idempotency keys are kept: one record per (tenant, key), two stores with one behaviour.

A record is claimed atomically by the first attempt (phase RUNNING, with a short lease that the
attempt renews while it runs, so a gateway that dies mid-request frees its keys within a lease),
then either completed (phase DONE: the reply is kept for the TTL) or released (deleted: a retry
runs again). Only the attempt holding the claim token may complete, renew or release it.

- `MemoryIdempotencyStore` (default): one gateway process; bounded by entries and bytes, the
  least recently completed replies go first (a running claim is never evicted).
- `RedisIdempotencyStore` (serving/idempotency/redis_store.py): shared by every gateway replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sluice.streaming.replay_log import ReplayEvent

MB = 1024 * 1024


class Phase(str, enum.Enum):
    RUNNING = "running"  # claimed: the first attempt is generating
    DONE = "done"  # completed: the reply is kept for replay


@dataclass(slots=True)
class StoredReply:
    """A completed reply as it was sent: a JSON body, or a stream's recorded events (seq 1, 2, …)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    events: list[ReplayEvent] | None = None

    def size(self) -> int:
        n = len(self.body or "") + sum(len(k) + len(v) for k, v in self.headers.items())
        return n + sum(len(e.name) + len(e.data) + 16 for e in self.events or ())

    def to_json(self) -> str:
        events = None if self.events is None else [[e.seq, e.name, e.data] for e in self.events]
        return json.dumps({"status": self.status, "headers": self.headers, "body": self.body, "events": events})

    @classmethod
    def from_json(cls, raw: str) -> StoredReply:
        d: dict[str, Any] = json.loads(raw)
        events = None if d["events"] is None else [ReplayEvent(int(s), n, data) for s, n, data in d["events"]]
        return cls(int(d["status"]), dict(d["headers"]), d["body"], events)


@dataclass(slots=True)
class Record:
    fingerprint: str  # the request it was claimed for (route + canonical body)
    token: str  # the claiming attempt's secret: only it completes, renews or releases
    phase: Phase = Phase.RUNNING
    stream_id: str | None = None  # a stream: its replay log id (followable while it runs)
    reply: StoredReply | None = None  # DONE only


class IdempotencyStore(Protocol):
    """Records by scoped key (the tenant is part of the key). Times in seconds."""

    async def claim(self, key: str, record: Record, lease_s: float) -> Record | None:
        """Store `record` (RUNNING, expiring after `lease_s`) unless `key` holds one — atomically.
        Returns None when claimed, else the record that holds the key."""
        ...

    async def renew(self, key: str, token: str, lease_s: float) -> None:
        """Extend a RUNNING claim held by `token` (a gone or completed one is left alone)."""
        ...

    async def complete(self, key: str, token: str, reply: StoredReply, ttl_s: float) -> bool:
        """Turn the claim into DONE with `reply`, kept `ttl_s`; False when `token` no longer holds it."""
        ...

    async def release(self, key: str, token: str) -> None:
        """Delete the RUNNING claim held by `token`: a retry runs again (a completed one stays)."""
        ...

    async def changed(self, key: str, timeout_s: float) -> None:
        """Return once `key`'s record may have changed, at the latest after `timeout_s` (a hint:
        the caller reads the record again)."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Entry:
    record: Record
    expires: float
    size: int = 0


class MemoryIdempotencyStore:
    def __init__(
        self, max_entries: int = 10_000, max_bytes: int = 256 * MB, clock: Callable[[], float] = time.monotonic
    ):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._clock = clock
        self._items: OrderedDict[str, _Entry] = OrderedDict()  # completed ones in completion order
        self._bytes = 0
        self._waiters: dict[str, asyncio.Event] = {}

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _live(self, key: str) -> _Entry | None:
        entry = self._items.get(key)
        if entry is not None and entry.expires <= self._clock():
            self._drop(key)
            return None
        return entry

    def _drop(self, key: str) -> None:
        entry = self._items.pop(key)
        self._bytes -= entry.size
        self._notify(key)

    def _notify(self, key: str) -> None:
        waiter = self._waiters.pop(key, None)
        if waiter is not None:
            waiter.set()

    async def claim(self, key: str, record: Record, lease_s: float) -> Record | None:
        self._sweep()
        entry = self._live(key)
        if entry is not None:
            return entry.record
        self._items[key] = _Entry(record, self._clock() + lease_s)
        self._items.move_to_end(key, last=False)  # running claims stay out of the eviction order's way
        return None

    def _held(self, key: str, token: str) -> _Entry | None:
        entry = self._live(key)
        return entry if entry is not None and entry.record.token == token else None

    async def renew(self, key: str, token: str, lease_s: float) -> None:
        entry = self._held(key, token)
        if entry is not None and entry.record.phase is Phase.RUNNING:
            entry.expires = self._clock() + lease_s

    async def complete(self, key: str, token: str, reply: StoredReply, ttl_s: float) -> bool:
        entry = self._held(key, token)
        if entry is None:
            return False
        entry.record.phase, entry.record.reply = Phase.DONE, reply
        entry.expires, entry.size = self._clock() + ttl_s, reply.size()
        self._bytes += entry.size
        self._items.move_to_end(key)
        self._evict()
        self._notify(key)
        return True

    def _sweep(self) -> None:
        """Drop expired replies, oldest first (one TTL for all: completion order is expiry order)."""
        now = self._clock()
        expired = []
        for k, e in self._items.items():
            if e.record.phase is Phase.DONE:
                if e.expires > now:
                    break
                expired.append(k)
        for k in expired:
            self._drop(k)

    def _evict(self) -> None:
        while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
            oldest = next((k for k, e in self._items.items() if e.record.phase is Phase.DONE), None)
            if oldest is None:
                return
            self._drop(oldest)

    async def release(self, key: str, token: str) -> None:
        entry = self._held(key, token)
        if entry is not None and entry.record.phase is Phase.RUNNING:
            self._drop(key)

    async def changed(self, key: str, timeout_s: float) -> None:
        waiter = self._waiters.setdefault(key, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await waiter.wait()

    async def close(self) -> None:
        return None
