"""An optional exact-match cache of finished deterministic replies (off by default).

Keyed by the coalescing key (coalescer.coalesce_key), which already scopes by tenant, model and
canonical body, so one tenant never reads another's replies unless coalescing across tenants is
switched on. Bounded three ways: a TTL, a number of entries and a byte estimate, evicting the
least recently used. Only complete replies go in (finish reason eos / length / stop_sequence);
a hit replays the same events, so a cached stream looks like a live one, chunk for chunk.
The API's `sluice-cache: bypass` request header skips it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sluice.types import GenerationEvent

CACHEABLE_FINISH = ("eos", "length", "stop_sequence")


@dataclass(slots=True)
class _Cached:
    events: list[GenerationEvent]
    expires: float
    size: int


def _size(events: list[GenerationEvent]) -> int:
    # an estimate, not sys.getsizeof: text bytes + token ids + per-event overhead
    return sum(len(e.text.encode()) + 8 * len(e.token_ids) + 64 for e in events)


class ResponseCache:
    """Finished replies by flight key, with TTL + LRU bounds on entries and bytes."""

    def __init__(
        self,
        ttl_s: float = 300.0,
        max_entries: int = 1000,
        max_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ttl_s, self.max_entries, self.max_bytes = ttl_s, max_entries, max_bytes
        self._clock = clock
        self._items: OrderedDict[str, _Cached] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> list[GenerationEvent] | None:
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        if item.expires < self._clock():
            self._drop(key)
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item.events

    def put(self, key: str, events: list[GenerationEvent]) -> bool:
        """Store a complete reply; False when it is not complete or is too large to keep."""
        last = events[-1] if events else None
        if last is None or last.finish_reason is None or last.finish_reason.value not in CACHEABLE_FINISH:
            return False
        size = _size(events)
        if size > self.max_bytes:
            return False
        if key in self._items:
            self._drop(key)
        self._items[key] = _Cached(list(events), self._clock() + self.ttl_s, size)
        self._bytes += size
        while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._items)))
        return True

    def _drop(self, key: str) -> None:
        item = self._items.pop(key)
        self._bytes -= item.size
