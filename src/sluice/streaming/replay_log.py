"""Per-stream replay logs: what lets a client that lost its connection resume a stream.

Every content event of a Messages stream is appended as (seq, event name, JSON data) under the
message id. `follow(after)` replays everything after `after`, then follows live events until the
stream is done — no gap, no duplicate. Bounded: a byte cap per stream (the oldest events go
first; a resume that starts before what is kept is refused) and a TTL after the stream ends.

Two stores, one behaviour: in memory (default, one gateway process) and Redis streams (XADD /
XREAD), so a client may resume through a different gateway replica than the one generating.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sluice.redis_client import redis_client
from sluice.streaming.event_log import EventLog, LogGap

POLL_BLOCK_MS = 1000


@dataclass(slots=True, frozen=True)
class ReplayEvent:
    seq: int
    name: str
    data: str


def _size(event: ReplayEvent) -> int:
    return len(event.data) + len(event.name) + 16


class ReplayLog(Protocol):
    """Where a stream's rendered events are kept for resume. `follow(after)` yields the events
    numbered after `after`, live until the stream is finished; raises LogGap when they are
    no longer kept; yields nothing for an unknown or expired stream."""

    async def open(self, stream_id: str, tenant: str) -> None: ...
    async def append(self, stream_id: str, event: ReplayEvent) -> None: ...
    async def finish(self, stream_id: str) -> None: ...
    async def owner(self, stream_id: str) -> str | None: ...
    def follow(self, stream_id: str, after: int) -> AsyncIterator[ReplayEvent]: ...
    async def close(self) -> None: ...


@dataclass(slots=True)
class _Stream:
    tenant: str
    log: EventLog[ReplayEvent]
    expires: float = float("inf")


class MemoryReplayLog:
    """One gateway process: an EventLog per stream, capped at `max_bytes` (oldest events go
    first), kept `ttl_s` after the stream ends, at most `max_streams` streams (oldest go first)."""

    def __init__(self, ttl_s: float = 600.0, max_bytes: int = 1 << 20, max_streams: int = 10_000, clock=time.monotonic):
        self.ttl_s, self.max_bytes, self.max_streams = ttl_s, max_bytes, max_streams
        self._clock = clock
        self._streams: OrderedDict[str, _Stream] = OrderedDict()

    def _get(self, stream_id: str) -> _Stream | None:
        s = self._streams.get(stream_id)
        if s is not None and s.expires < self._clock():
            del self._streams[stream_id]
            return None
        return s

    async def open(self, stream_id: str, tenant: str) -> None:
        self._streams[stream_id] = _Stream(tenant, EventLog(self.max_bytes, _size))
        while len(self._streams) > self.max_streams:
            self._streams.popitem(last=False)

    async def append(self, stream_id: str, event: ReplayEvent) -> None:
        s = self._get(stream_id)
        if s is not None and not s.log.done:
            s.log.append(event)

    async def finish(self, stream_id: str) -> None:
        s = self._get(stream_id)
        if s is not None:
            s.log.finish()
            s.expires = self._clock() + self.ttl_s

    async def owner(self, stream_id: str) -> str | None:
        s = self._get(stream_id)
        return None if s is None else s.tenant

    async def follow(self, stream_id: str, after: int) -> AsyncIterator[ReplayEvent]:
        s = self._get(stream_id)
        if s is None:
            return
        # the log numbers events 1, 2, … as they are appended, and the recorder appends them in
        # their own seq order from 1: log position == event seq
        async for event in s.log.follow(after):
            yield event

    async def close(self) -> None:
        return None


class RedisReplayLog:
    """A Redis stream per message (`<prefix>:sse:<id>`) plus a small meta hash; both expire."""

    def __init__(self, url: str, ttl_s: float = 600.0, max_events: int = 20_000, prefix: str = "sluice"):
        self.redis = redis_client(url, max_connections=32)
        self.ttl_s, self.max_events, self.prefix = ttl_s, max_events, prefix

    def _keys(self, stream_id: str) -> tuple[str, str]:
        return f"{self.prefix}:sse:{{{stream_id}}}", f"{self.prefix}:sse:{{{stream_id}}}:meta"

    async def open(self, stream_id: str, tenant: str) -> None:
        events, meta = self._keys(stream_id)
        live_ttl = int(self.ttl_s) + 3600  # while live, outlive any reasonable stream
        pipe = self.redis.pipeline()
        pipe.hset(meta, mapping={"tenant": tenant, "done": "0"})
        pipe.expire(meta, live_ttl)
        await pipe.execute()

    async def append(self, stream_id: str, event: ReplayEvent) -> None:
        events, meta = self._keys(stream_id)
        pipe = self.redis.pipeline()
        pipe.xadd(
            events, {"seq": event.seq, "name": event.name, "data": event.data}, maxlen=self.max_events, approximate=True
        )
        pipe.expire(events, int(self.ttl_s) + 3600)
        await pipe.execute()

    async def finish(self, stream_id: str) -> None:
        events, meta = self._keys(stream_id)
        pipe = self.redis.pipeline()
        pipe.hset(meta, "done", "1")
        pipe.xadd(events, {"seq": 0, "name": "", "data": ""})  # wakes followers blocked in XREAD
        pipe.expire(meta, int(self.ttl_s))
        pipe.expire(events, int(self.ttl_s))
        await pipe.execute()

    async def owner(self, stream_id: str) -> str | None:
        tenant = await self.redis.hget(self._keys(stream_id)[1], "tenant")
        return tenant.decode() if isinstance(tenant, bytes) else tenant

    async def follow(self, stream_id: str, after: int) -> AsyncIterator[ReplayEvent]:
        events, meta = self._keys(stream_id)
        position = "0-0"
        checked_gap = False
        while True:
            # the client decodes responses over RESP2: [[stream, [(id, fields), ...]]] of str;
            # redis-py's annotation is the union of every protocol's and decoding's shapes
            reply = cast(
                list[list[Any]] | None, await self.redis.xread({events: position}, block=POLL_BLOCK_MS, count=500)
            )
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    position = entry_id
                    seq = int(fields["seq"])
                    if not checked_gap:
                        checked_gap = True
                        if seq > after + 1 and seq != 0:
                            raise LogGap(f"events after {after} are no longer kept")
                    if seq == 0:  # the end marker
                        return
                    if seq > after:
                        yield ReplayEvent(seq, fields["name"], fields["data"])
                        after = seq
            if not reply and await self.redis.hget(meta, "done") == "1":
                return
            if not reply and await self.redis.exists(meta) == 0:
                return

    async def close(self) -> None:
        await self.redis.aclose()
