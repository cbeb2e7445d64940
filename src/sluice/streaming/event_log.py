"""An append-only log of one stream's events that any number of followers read, live.

Two parts of sluice need exactly this: a coalesced flight (every subscriber reads the whole
generation from its first event, gateway/coalescer.py) and a stream's replay log (a resumed
client reads what it missed, then follows, replay_log.py). One implementation, so both get the
same guarantees:

- a follower sees every event after its position exactly once, in order, and then the end —
  also events appended, and `finish()` called, while it was paused at a `yield` (the follower
  re-reads the log's live state after every event; it never iterates a stale copy);
- no lost wake-up: between checking for new events and waiting there is no `await`;
- optional trimming by size: the oldest events go first, and a follower that asks for a
  position before what is kept gets `LogGap` instead of a silent hole.

Positions are 1-based sequence numbers: the first event appended is 1; `follow(after=n)`
yields the events numbered n+1, n+2, …
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LogGap(Exception):
    """The events after the requested position are no longer kept."""


class EventLog(Generic[T]):
    def __init__(self, max_bytes: int | None = None, size_of: Callable[[T], int] | None = None):
        # a list read by index (O(1) for followers) from `_head` on; trimmed slots are dropped in
        # bulk once they are half of the list
        self._items: list[T] = []
        self._head = 0
        self._sizes: deque[int] = deque()
        self.first_seq = 1  # the sequence number of the oldest event kept
        self.bytes = 0
        self.max_bytes = max_bytes
        self._size_of = size_of
        self.done = False
        self.error: BaseException | None = None
        self._changed = asyncio.Event()

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest event (0 before the first)."""
        return self.first_seq + len(self._items) - self._head - 1

    def __len__(self) -> int:
        return len(self._items) - self._head

    def append(self, item: T) -> int:
        """Add an event; returns its sequence number."""
        if self.done:
            raise RuntimeError("append to a finished event log")
        self._items.append(item)
        if self._size_of is not None:
            n = self._size_of(item)
            self._sizes.append(n)
            self.bytes += n
            while self.max_bytes is not None and self.bytes > self.max_bytes and len(self) > 1:
                self._head += 1
                self.bytes -= self._sizes.popleft()
                self.first_seq += 1
            if self._head > 64 and self._head * 2 > len(self._items):
                del self._items[: self._head]
                self._head = 0
        self._changed.set()
        return self.last_seq

    def finish(self, error: BaseException | None = None) -> None:
        """No more events; followers end (raising `error` if given) once they have read the rest."""
        if not self.done:
            self.done, self.error = True, error
            self._changed.set()

    async def follow(self, after: int = 0) -> AsyncGenerator[T, None]:
        if after + 1 < self.first_seq:
            raise LogGap(f"events after {after} are no longer kept (oldest kept: {self.first_seq})")
        seq = after
        while True:
            while seq < self.last_seq:
                if seq + 1 < self.first_seq:  # trimmed while this follower was paused
                    raise LogGap(f"events after {seq} were dropped before this reader caught up")
                seq += 1
                yield self._items[self._head + seq - self.first_seq]
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            self._changed.clear()  # no await between the check above and this wait
            await self._changed.wait()
