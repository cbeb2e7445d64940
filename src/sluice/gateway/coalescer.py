"""Singleflight for identical deterministic requests, and an optional exact-match cache.

Requests coalesce only when their output is a function of their input: temperature 0 or a
fixed seed, the same model, the same canonical body (the `stream` flag and the client's own
ids excluded), and — by default — the same tenant (`shared_across_tenants` widens it).

The first request starts the producer (the real generation) as its own task; every subscriber,
early or late, reads the flight's event log from the start, so each gets the whole reply. A
subscriber that leaves does not stop the others; when the last one leaves before the end, the
producer is cancelled (which aborts the engine request).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.types import GenerationEvent


def coalesce_key(tenant: str, model: str, body: dict[str, Any], shared_across_tenants: bool = False) -> str | None:
    """The flight key, or None when the request is not deterministic."""
    temperature = body.get("temperature", 1.0)
    if not (temperature == 0 or body.get("seed") is not None or body.get("top_k") == 1):
        return None
    canonical = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "metadata", "background")}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    scope = "" if shared_across_tenants else tenant
    return hashlib.sha256(f"{scope}\x00{model}\x00{text}".encode()).hexdigest()


@dataclass
class _Flight:
    events: list[GenerationEvent] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    subscribers: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class Subscription:
    """One subscriber's seat on a flight: taken at join time (before the response starts), so
    a request that is still opening its stream already counts as a subscriber."""

    def __init__(self, coalescer: "Coalescer", key: str, flight: _Flight):
        self._coalescer, self._key, self._flight = coalescer, key, flight
        self._left = False

    async def events(self) -> AsyncIterator[GenerationEvent]:
        flight, i = self._flight, 0
        while True:
            while i < len(flight.events):
                yield flight.events[i]
                i += 1
            if flight.done:
                if flight.error is not None:
                    raise flight.error
                return
            flight.changed.clear()
            if i < len(flight.events) or flight.done:
                continue
            await flight.changed.wait()

    def leave(self) -> None:
        if self._left:
            return
        self._left = True
        flight = self._flight
        flight.subscribers -= 1
        if flight.subscribers == 0 and not flight.done and flight.task is not None:
            flight.task.cancel()  # the last subscriber left: stop the generation
            if self._coalescer._flights.get(self._key) is flight:
                del self._coalescer._flights[self._key]


class Coalescer:
    def __init__(self) -> None:
        self._flights: dict[str, _Flight] = {}
        self.leaders = 0
        self.coalesced = 0

    def in_flight(self) -> int:
        return len(self._flights)

    def has(self, key: str) -> bool:
        return key in self._flights

    def join(
        self, key: str, produce: Callable[[], AsyncIterator[GenerationEvent]], on_done: Callable[[], None] | None = None
    ) -> tuple[Subscription, bool]:
        """A seat on the flight for `key`, starting it with `produce` if there is none.
        Returns (subscription, is_leader). `on_done` runs when a started producer ends."""
        flight = self._flights.get(key)
        leader = flight is None
        if flight is None:
            flight = _Flight()
            self._flights[key] = flight
            flight.task = asyncio.get_running_loop().create_task(self._produce(key, flight, produce, on_done))
            self.leaders += 1
        else:
            self.coalesced += 1
        flight.subscribers += 1
        return Subscription(self, key, flight), leader

    async def run(self, key: str, produce: Callable[[], AsyncIterator[GenerationEvent]]) -> AsyncIterator[GenerationEvent]:
        sub, _ = self.join(key, produce)
        try:
            async for event in sub.events():
                yield event
        finally:
            sub.leave()

    async def _produce(
        self, key: str, flight: _Flight, produce: Callable[[], AsyncIterator[GenerationEvent]], on_done: Callable[[], None] | None
    ) -> None:
        try:
            async for event in produce():
                flight.events.append(event)
                flight.changed.set()
        except asyncio.CancelledError:
            flight.error = asyncio.CancelledError()
            raise
        except BaseException as exc:  # every subscriber sees the producer's failure
            flight.error = exc
        finally:
            flight.done = True
            flight.changed.set()
            if self._flights.get(key) is flight:
                del self._flights[key]
            if on_done is not None:
                on_done()


@dataclass(slots=True)
class _Cached:
    events: list[GenerationEvent]
    expires: float
    size: int


class ResponseCache:
    """Finished deterministic replies by flight key (per tenant by construction), TTL + LRU."""

    def __init__(self, ttl_s: float = 300.0, max_entries: int = 1000, max_bytes: int = 64 * 1024 * 1024, clock=time.monotonic):
        self.ttl_s, self.max_entries, self.max_bytes = ttl_s, max_entries, max_bytes
        self._clock = clock
        self._items: OrderedDict[str, _Cached] = OrderedDict()
        self._bytes = 0
        self.hits = 0

    def get(self, key: str) -> list[GenerationEvent] | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item.expires < self._clock():
            self._drop(key)
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item.events

    def put(self, key: str, events: list[GenerationEvent]) -> None:
        size = sum(len(e.text) + 8 * len(e.token_ids) + 64 for e in events)
        if size > self.max_bytes:
            return
        if key in self._items:
            self._drop(key)
        self._items[key] = _Cached(events, self._clock() + self.ttl_s, size)
        self._bytes += size
        while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._items)))

    def _drop(self, key: str) -> None:
        item = self._items.pop(key)
        self._bytes -= item.size
