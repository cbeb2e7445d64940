"""Search results by (normalized query, top_k, index revision), least recently used out.

The normalized query is the resolved query tree (stemmed, lower-cased, flattened: query_tree.py),
so `Running  Dogs` and `run dog` share an entry. The revision is every shard's newest write-log
entry as the router knows it; a write moves it, so a cached answer is never served after a write
it does not reflect (with several routers, another router's writes are seen at the next health
poll). Partial answers are not cached.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

Key = tuple[Any, ...]  # (normalized query, the request's other fields..., revision)


class ResultCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._d: OrderedDict[Key, Any] = OrderedDict()
        self.hits = 0
        self.lookups = 0

    def get(self, key: Key) -> Any | None:
        if self.capacity <= 0:
            return None
        self.lookups += 1
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
            self.hits += 1
        return v

    def put(self, key: Key, value: Any) -> None:
        if self.capacity <= 0:
            return
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.capacity:
            self._d.popitem(last=False)

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def __len__(self) -> int:
        return len(self._d)
