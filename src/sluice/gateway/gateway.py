"""The gateway: rate limits → admission queue → coalescing/cache → engine, for one request.

`Gateway.open()` does everything that can refuse a request — limits (RateLimited), the queue
(Overloaded) — so the API can answer 429/529 before any stream starts. It returns a `Session`
whose `events()` streams the generation and whose `close()` (always called) returns the
admission lease and settles the output-token reservation with the tokens actually produced,
on success, abort and error alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from sluice.gateway.admission import AdmissionQueue, Lease, Overloaded, Ticket
from sluice.gateway.coalescer import Coalescer, Subscription
from sluice.gateway.limiter import GuardedLimiter
from sluice.gateway.limits import Decision, LimitReason
from sluice.gateway.principal import Principal
from sluice.gateway.response_cache import ResponseCache
from sluice.types import GenerationEvent, GenerationRequest

Producer = Callable[[], AsyncGenerator[GenerationEvent, None]]


class SessionKind(str, enum.Enum):
    """How a session is served: its own engine request, riding an identical one, or the cache."""

    ENGINE = "engine"
    COALESCED = "coalesced"
    CACHED = "cached"


class Outcome(str, enum.Enum):
    """What `Gateway.open` did with a request: served it (one of the session kinds) or refused
    it. The keys of `Gateway.counts`, exported as metrics."""

    ENGINE = "engine"
    COALESCED = "coalesced"
    CACHED = "cached"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"


class RateLimited(Exception):
    def __init__(self, decision: Decision):
        super().__init__(decision.reason)
        self.decision = decision


@dataclass
class Session:
    gateway: Gateway
    principal: Principal
    decision: Decision
    reserved_output: int
    produce: Producer
    key: str | None
    lease: Lease | None = None  # owned by this session (not coalesced)
    subscription: Subscription | None = None
    cached: list[GenerationEvent] | None = None
    queue_time_s: float = 0.0
    kind: SessionKind = SessionKind.ENGINE
    output_tokens: int = 0
    _closed: bool = field(default=False, repr=False)
    _renewing: asyncio.Task | None = field(default=None, repr=False)

    async def events(self) -> AsyncGenerator[GenerationEvent, None]:
        """The generation's events, however it is served; leaving early closes the source (for
        an engine session: aborts the request; for a coalesced one: gives up this seat only)."""
        if self.cached is not None:
            source: AsyncGenerator[GenerationEvent, None] = _replay(self.cached)
        elif self.subscription is not None:
            source = self.subscription.events()
        else:
            source = self.produce()
        async with aclosing(source):
            async for event in source:
                self.output_tokens = event.usage.output_tokens
                yield event

    async def _produce_and_remember(self) -> AsyncGenerator[GenerationEvent, None]:
        events: list[GenerationEvent] = []
        async for event in self.produce():
            events.append(event)
            yield event
        cache = self.gateway.cache
        if cache is not None and self.key is not None:
            cache.put(self.key, events)  # keeps complete replies only

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
        if self.subscription is not None:
            self.subscription.leave()  # the flight's lease is returned when its generation ends
        if self.lease is not None:
            self.lease.release()
        limits = self.principal.limits
        if self.gateway.limiter is not None and limits is not None:
            await self.gateway.limiter.settle(
                self.principal.limit_key, limits, self.reserved_output, self.output_tokens, self.decision.lease
            )


async def _renew_lease(limiter: GuardedLimiter, key: str, lease: str) -> None:
    """Keep a session's concurrency lease alive for as long as the session is open: a request
    may queue (the batch band waits up to a day) or stream longer than the lease's TTL, and an
    expired lease would let the key exceed its concurrency limit. The TTL still frees the slot
    of a gateway that dies."""
    every = limiter.lease_ttl_s / 3
    while True:
        await asyncio.sleep(every)
        await limiter.renew(key, lease)


async def _replay(events: list[GenerationEvent]) -> AsyncGenerator[GenerationEvent, None]:
    for event in events:
        yield event


class Gateway:
    def _join(self, session: Session, key: str, lease: Lease | None) -> None:
        assert self.coalescer is not None
        session.subscription, leader = self.coalescer.join(
            key, session._produce_and_remember, on_done=lease.release if lease is not None else None
        )
        if not leader:
            session.kind = SessionKind.COALESCED
            self.counts[Outcome.COALESCED] += 1
            if lease is not None:
                lease.release()

    def __init__(
        self,
        admission: AdmissionQueue,
        limiter: GuardedLimiter | None = None,
        coalescer: Coalescer | None = None,
        cache: ResponseCache | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.admission = admission
        self.limiter = limiter
        self.coalescer = coalescer
        self.cache = cache
        self._clock = clock
        self.counts: dict[Outcome, int] = dict.fromkeys(Outcome, 0)

    async def open(
        self,
        principal: Principal,
        request: GenerationRequest,
        produce: Producer,
        key: str | None = None,
        use_cache: bool = True,
        deadline_s: float | None = None,
        band: int | None = None,
        limited: asyncio.Event | None = None,
    ) -> Session:
        """`limited`: set once the rate limits have admitted the request (what is left is the
        queue's wait), so a stream opens early only while it queues, never while a limit —
        or a hung limits store — may still refuse it. `request`: what the limits and the queue
        count (its prompt, its max_tokens reserved, its `token_cost`)."""
        max_tokens = request.sampling.max_tokens
        decision = Decision(True)
        if self.limiter is not None and principal.limits is not None:
            decision = await self.limiter.acquire(
                principal.limit_key, principal.limits, len(request.prompt_token_ids), max_tokens
            )
            if not decision.allowed:
                self.counts[
                    Outcome.RATE_LIMITED if decision.reason is not LimitReason.STORE_UNAVAILABLE else Outcome.OVERLOADED
                ] += 1
                raise RateLimited(decision)
        if limited is not None:
            limited.set()
        session = Session(self, principal, decision, max_tokens if decision.allowed else 0, produce, key)
        if decision.lease is not None and self.limiter is not None:
            session._renewing = asyncio.ensure_future(_renew_lease(self.limiter, principal.limit_key, decision.lease))
        try:
            if key is not None and use_cache and self.cache is not None:
                session.cached = self.cache.get(key)
                if session.cached is not None:
                    session.kind = SessionKind.CACHED
                    self.counts[Outcome.CACHED] += 1
                    return session
            if key is not None and self.coalescer is not None and self.coalescer.has(key):
                self._join(session, key, None)  # rides an existing generation: needs no engine capacity
                return session
            wait = principal.queue_deadline_s if deadline_s is None else min(deadline_s, principal.queue_deadline_s)
            ticket = Ticket(
                principal.priority if band is None else band, request.token_cost, self._clock() + wait, principal.tenant
            )
            lease = await self.admission.acquire(ticket)
            session.queue_time_s = lease.waited_s
            if key is not None and self.coalescer is not None:
                if self.coalescer.has(key):  # an identical request started while we queued: join it
                    lease.release()
                    self._join(session, key, None)
                else:  # lead a new flight; its lease lives as long as the generation, not this client
                    self._join(session, key, lease)
                    session.kind = SessionKind.ENGINE
                    self.counts[Outcome.ENGINE] += 1
            else:
                session.lease = lease
                self.counts[Outcome.ENGINE] += 1
            return session
        except Overloaded:
            self.counts[Outcome.OVERLOADED] += 1
            await session.close()
            raise
        except BaseException:
            await session.close()
            raise
