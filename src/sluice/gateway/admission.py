"""The admission queue: who goes to the engine next, and who is turned away.

- Strict priority between bands (0 first), earliest deadline first within a band.
- Aging: a waiting entry's effective band improves by one every `aging_s`, so a low band is
  never starved forever by a steady stream of higher-band work.
- Late-bound dispatch: an entry leaves the queue only when the engine side has room
  (`max_inflight` requests and `max_inflight_tokens` estimated tokens in flight). The engine
  keeps only a small waiting queue of its own, so this queue — not arrival order — decides who
  runs.
- Bounded in estimated tokens (prompt + max_tokens), not request count: a full queue, or a
  deadline passed while waiting, raises `Overloaded` (the API answers 529 + retry-after before
  any stream starts). A waiter that is cancelled (client gone) leaves the queue at once.

The pick is a linear scan over waiting entries: effective bands change with time, which a heap
cannot track, and queues are hundreds of entries, not millions.

Capacity: the queue's own counters (`max_inflight`, `max_inflight_tokens`, changeable at run time
with `set_capacity`) plus an optional `gate(est_tokens) -> bool` the engine side supplies (e.g.
"the engine's waiting queue is short and KV blocks are free"). The gate's owner calls `poke()`
when its answer may have turned to yes; lease releases re-check by themselves.

Usage:
    async with queue.admit(Ticket(band, est_tokens, deadline)) as lease: ...   # or
    lease = await queue.acquire(ticket); try: ... finally: lease.release()
`Overloaded` (raised before anything streams) → the API's 529 with `retry-after`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field


class Overloaded(Exception):
    """Turned away: the queue is full (reason mentions "full") or the deadline passed."""

    def __init__(self, reason: str, retry_after_s: float):
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Ticket:
    band: int  # 0 is served first
    est_tokens: int  # prompt + max_tokens
    deadline: float  # monotonic time by which it must be dispatched
    tenant: str = ""


@dataclass(slots=True)
class _Entry:
    ticket: Ticket
    enqueued: float
    seq: int
    future: asyncio.Future = field(repr=False)


class Lease:
    """Capacity held by one dispatched request; release it when the request ends."""

    def __init__(self, queue: AdmissionQueue, tokens: int, waited_s: float):
        self._queue = queue
        self.tokens = tokens
        self.waited_s = waited_s
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._queue._release(self.tokens)


class AdmissionQueue:
    def __init__(
        self,
        max_inflight: int = 72,
        max_inflight_tokens: int | None = None,
        max_queued_tokens: int = 200_000,
        aging_s: float = 10.0,
        capacity_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        gate: Callable[[int], bool] | None = None,
    ):
        self.max_inflight = max_inflight
        self.max_inflight_tokens = max_inflight_tokens
        self.max_queued_tokens = max_queued_tokens
        self.aging_s = aging_s
        self.capacity_tokens = capacity_tokens or max_queued_tokens  # for the scaling signal
        self._clock = clock
        self.gate = gate
        self._waiting: list[_Entry] = []
        self._seq = itertools.count()
        self.inflight = 0
        self.inflight_tokens = 0
        self.queued_tokens = 0
        self.rejected = {"queue_full": 0, "deadline": 0}

    # -- the caller's side -------------------------------------------------------------------------
    async def acquire(self, ticket: Ticket) -> Lease:
        now = self._clock()
        if not self._waiting and self._has_room(ticket.est_tokens):
            self._take(ticket.est_tokens)
            return Lease(self, ticket.est_tokens, 0.0)
        if self.queued_tokens + ticket.est_tokens > self.max_queued_tokens:
            self.rejected["queue_full"] += 1
            raise Overloaded("the admission queue is full", self._retry_hint())
        if ticket.deadline <= now:
            self.rejected["deadline"] += 1
            raise Overloaded("the queue deadline passed", self._retry_hint())
        entry = _Entry(ticket, now, next(self._seq), asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        self.queued_tokens += ticket.est_tokens
        self._dispatch()  # room may exist that nobody has offered yet (a gate changed its mind)
        try:
            await asyncio.wait_for(asyncio.shield(entry.future), timeout=ticket.deadline - now)
        except TimeoutError:
            if not entry.future.done():
                self._remove(entry)
                self.rejected["deadline"] += 1
                raise Overloaded("the request waited past its queue deadline", self._retry_hint()) from None
        except asyncio.CancelledError:
            if entry.future.done() and not entry.future.cancelled():
                self._release(ticket.est_tokens)  # dispatched as we were cancelled: give it back
            else:
                self._remove(entry)
            raise
        return Lease(self, ticket.est_tokens, self._clock() - entry.enqueued)

    @contextlib.asynccontextmanager
    async def admit(self, ticket: Ticket) -> AsyncIterator[Lease]:
        """`acquire` + `release` around the block, however it ends."""
        lease = await self.acquire(ticket)
        try:
            yield lease
        finally:
            lease.release()

    # -- the engine's side ------------------------------------------------------------------------
    def set_capacity(self, max_inflight: int | None = None, max_inflight_tokens: int | None = None) -> None:
        """Change the dispatch limits (e.g. from engine stats); more room dispatches at once."""
        if max_inflight is not None:
            self.max_inflight = max_inflight
        if max_inflight_tokens is not None:
            self.max_inflight_tokens = max_inflight_tokens
        self._dispatch()

    def poke(self) -> None:
        """Re-check waiting entries: the gate's answer may have changed."""
        self._dispatch()

    # -- state ------------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self._waiting)

    def scaling_signal(self) -> float:
        """(estimated tokens queued + estimated tokens in flight) / capacity_tokens.

        Gateway-wide (the status page); the exported autoscaling input is per model,
        `sluice_scaling_signal{model}` (routing/scaling/signal.py), and equals this for a fleet
        of one model. In-flight work counts as well as queued work, so a fully busy deployment
        with an empty queue reads ~1, not 0 (a queued-only signal would scale a saturated fleet
        down). Above 1 demand exceeds what the
        engines hold; DESIGN.md scales up at 0.7 and down at 0.2. `queued_tokens` alone is
        exported too."""
        return (self.queued_tokens + self.inflight_tokens) / self.capacity_tokens

    def queued_tokens_from_band(self, band: int) -> int:
        """Estimated tokens waiting in `band` and the bands after it (the autoscaler's batch
        share: work that may wait for a cold start; scaling/policy.py)."""
        return sum(e.ticket.est_tokens for e in self._waiting if e.ticket.band >= band)

    # -- internals --------------------------------------------------------------------------------
    def _has_room(self, tokens: int) -> bool:
        if self.inflight >= self.max_inflight:
            return False
        # with nothing in flight, one entry always goes: a single ticket larger than the token
        # capacity must not wait forever
        if (
            self.max_inflight_tokens is not None
            and self.inflight
            and self.inflight_tokens + tokens > self.max_inflight_tokens
        ):
            return False
        return self.gate is None or self.gate(tokens)

    def _take(self, tokens: int) -> None:
        self.inflight += 1
        self.inflight_tokens += tokens

    def _release(self, tokens: int) -> None:
        self.inflight -= 1
        self.inflight_tokens -= tokens
        self._dispatch()

    def _remove(self, entry: _Entry) -> None:
        if entry in self._waiting:
            self._waiting.remove(entry)
            self.queued_tokens -= entry.ticket.est_tokens
        self._dispatch()  # an entry that blocked the head may be gone

    def _effective(self, e: _Entry, now: float) -> tuple[float, float, int]:
        aged = int((now - e.enqueued) / self.aging_s) if self.aging_s > 0 else 0
        return (e.ticket.band - aged, e.ticket.deadline, e.seq)

    def _dispatch(self) -> None:
        now = self._clock()
        while self._waiting:
            best = min(self._waiting, key=lambda e: self._effective(e, now))
            if not self._has_room(best.ticket.est_tokens):
                return  # head-of-line: nothing smaller overtakes the chosen entry
            self._waiting.remove(best)
            self.queued_tokens -= best.ticket.est_tokens
            if best.future.done():
                continue
            self._take(best.ticket.est_tokens)
            best.future.set_result(None)

    def _retry_hint(self) -> float:
        return 1.0 + min(30.0, self.queued_tokens / 2000.0)
