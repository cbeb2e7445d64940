"""Singleflight for identical deterministic requests.

Requests coalesce only when their output is a function of their input: temperature 0, top_k 1
or a fixed seed, the same model, the same canonical body (the `stream` flag, stream options,
metadata and the like excluded), and — by default — the same tenant (`shared_across_tenants`
widens it; the key hashes the tenant, so tenants never see each other's flights otherwise).

The first request starts the producer (the real generation) as its own task; every subscriber,
early or late, reads the flight's event log from the start, so each gets the whole reply —
late joiners get the buffered events, then live ones. A subscriber that leaves does not stop
the others; when the last one leaves before the end, the producer is cancelled (which aborts
the engine request). A producer error reaches every subscriber.

A seat on a flight is taken synchronously at admission (`join`), so a request that decided to
ride an existing flight cannot find it gone — finished or cancelled — by the time it starts
streaming: the subscription holds the flight's event log itself. The flight, not any one
client, owns the engine capacity (`on_done` returns it when the generation ends).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.streaming.event_log import EventLog
from sluice.types import GenerationEvent

Producer = Callable[[], AsyncGenerator[GenerationEvent, None]]

# body fields that do not change the reply
_IGNORED = ("stream", "stream_options", "metadata", "background", "user", "service_tier")


def coalesce_key(tenant: str, model: str, body: dict[str, Any], shared_across_tenants: bool = False) -> str | None:
    """The flight key, or None when the request is not deterministic."""
    temperature = body.get("temperature", 1.0)
    if not (temperature == 0 or body.get("seed") is not None or body.get("top_k") == 1):
        return None
    canonical = {k: v for k, v in body.items() if k not in _IGNORED}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    scope = "*" if shared_across_tenants else "t:" + tenant
    return hashlib.sha256(f"{scope}\x00{model}\x00{text}".encode()).hexdigest()


@dataclass(slots=True)
class _Flight:
    log: EventLog[GenerationEvent] = field(default_factory=EventLog)
    subscribers: int = 0
    task: asyncio.Task | None = None


class Subscription:
    """One subscriber's seat on a flight: taken at join time (before the response starts), so
    a request that is still opening its stream already counts as a subscriber, and a flight that
    ends or is abandoned meanwhile still hands it the whole event log. `leave()` always
    (idempotent); iterate `events()` at most once."""

    __slots__ = ("_coalescer", "_key", "_flight", "_left")

    def __init__(self, coalescer: Coalescer, key: str, flight: _Flight):
        self._coalescer, self._key, self._flight = coalescer, key, flight
        self._left = False
        flight.subscribers += 1

    def events(self) -> AsyncGenerator[GenerationEvent, None]:
        """The whole generation from its first event; raises the producer's error, if any."""
        return self._flight.log.follow()

    def leave(self) -> None:
        if self._left:
            return
        self._left = True
        flight = self._flight
        flight.subscribers -= 1
        if flight.subscribers == 0 and not flight.log.done:
            self._coalescer._abandon(self._key, flight)


class Coalescer:
    def __init__(self) -> None:
        self._flights: dict[str, _Flight] = {}
        self.leaders = 0  # flights started (= engine requests)
        self.coalesced = 0  # subscribers that rode an existing flight (the "coalesced hits")
        self.abandoned = 0  # flights cancelled because every subscriber left

    def in_flight(self) -> int:
        return len(self._flights)

    def has(self, key: str) -> bool:
        return key in self._flights

    def join(self, key: str, produce: Producer, on_done: Callable[[], None] | None = None) -> tuple[Subscription, bool]:
        """A seat on the flight for `key`, starting it with `produce` if there is none.
        Returns (subscription, is_leader). `on_done` runs when a started producer ends (however
        it ends) — e.g. to return the admission lease the generation holds."""
        flight = self._flights.get(key)
        leader = flight is None
        if flight is None:
            flight = _Flight()
            self._flights[key] = flight
            flight.task = asyncio.get_running_loop().create_task(self._produce(key, flight, produce, on_done))
            self.leaders += 1
        else:
            self.coalesced += 1
        return Subscription(self, key, flight), leader

    async def run(self, key: str, produce: Producer) -> AsyncIterator[GenerationEvent]:
        """Lead or join the flight for `key` and stream all of its events."""
        sub, _ = self.join(key, produce)
        try:
            async for event in sub.events():
                yield event
        finally:
            sub.leave()

    def _abandon(self, key: str, flight: _Flight) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]  # a new identical request starts afresh
        if flight.task is not None and not flight.task.done():
            flight.task.cancel()  # the last subscriber left: stop the generation
            self.abandoned += 1

    async def _produce(self, key: str, flight: _Flight, produce: Producer, on_done: Callable[[], None] | None) -> None:
        error: BaseException | None = None
        try:
            async for event in produce():
                flight.log.append(event)
        except asyncio.CancelledError:
            error = asyncio.CancelledError()
            raise
        except Exception as exc:  # every subscriber sees the producer's failure
            error = exc
        finally:
            flight.log.finish(error)
            if self._flights.get(key) is flight:
                del self._flights[key]
            if on_done is not None:
                on_done()
