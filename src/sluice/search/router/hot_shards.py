"""Hot shards: add a replica to a shard that is slower than its peers, remove it when it cools.

The signal is each shard's recent p95 latency (the router's own window of requests to it)
relative to the median shard's. Content sharding plus a skewed query mix makes one shard do
more work per query (more matching postings) and get more of the traffic's cost; more replicas
spread it. Hysteresis keeps it from flapping:
- hot: ratio ≥ `hot_ratio` in `hot_for` consecutive evaluations → add one replica (at most
  `max_added` per shard, then `cooldown` evaluations before the next change to that shard);
- cool: ratio ≤ `cool_ratio` in `cool_for` consecutive evaluations → remove one added replica;
- in between: nothing changes, and both streaks restart.
Only replicas this policy added are removed; the configured ones stay. Pure logic (no clock, no
I/O): the router calls `evaluate` on a timer and carries out the decisions (main.py).
"""

from __future__ import annotations

import dataclasses
import enum
import statistics


class Change(str, enum.Enum):
    ADD = "add"
    REMOVE = "remove"


@dataclasses.dataclass(frozen=True, slots=True)
class HotShardPolicy:
    hot_ratio: float = 2.0
    cool_ratio: float = 1.2
    hot_for: int = 3
    cool_for: int = 10
    max_added: int = 2
    cooldown: int = 5


@dataclasses.dataclass(slots=True)
class _ShardTrack:
    hot_streak: int = 0
    cool_streak: int = 0
    added: int = 0
    quiet: int = 0  # evaluations left before another change


class HotShardTracker:
    def __init__(self, policy: HotShardPolicy | None = None):
        self.policy = policy or HotShardPolicy()
        self._tracks: dict[str, _ShardTrack] = {}

    def added(self, shard: str) -> int:
        return self._tracks.get(shard, _ShardTrack()).added

    def evaluate(self, p95_s: dict[str, float | None]) -> list[tuple[str, Change]]:
        """One evaluation over every shard's p95 (None: too few samples); the changes to make."""
        known = {s: v for s, v in p95_s.items() if v is not None and v > 0}
        if len(known) < 2:
            return []
        median = statistics.median(known.values())
        p = self.policy
        out: list[tuple[str, Change]] = []
        for shard, v in known.items():
            t = self._tracks.setdefault(shard, _ShardTrack())
            ratio = v / median
            if t.quiet > 0:
                t.quiet -= 1
            if ratio >= p.hot_ratio:
                t.hot_streak, t.cool_streak = t.hot_streak + 1, 0
            elif ratio <= p.cool_ratio:
                t.cool_streak, t.hot_streak = t.cool_streak + 1, 0
            else:
                t.hot_streak = t.cool_streak = 0
            if t.quiet > 0:
                continue
            if t.hot_streak >= p.hot_for and t.added < p.max_added:
                t.added += 1
                t.hot_streak, t.quiet = 0, p.cooldown
                out.append((shard, Change.ADD))
            elif t.cool_streak >= p.cool_for and t.added > 0:
                t.added -= 1
                t.cool_streak, t.quiet = 0, p.cooldown
                out.append((shard, Change.REMOVE))
        return out
