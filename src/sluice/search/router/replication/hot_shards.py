"""Hot shards: add a replica to a shard whose replicas are busy, remove it when they cool.

The signal is each shard's utilization per replica over the last interval: the time its
answers spent inside the index (every shard answer reports it) divided by the interval and by
the number of serving replicas. That is the work replicas share — more replicas lower it — and,
unlike round-trip latency, it is not hidden by per-hop network or scheduling delay (the first
version compared round-trip p95s; on a loaded 2-core machine a 3,000 vs 1 document skew did
not show). Content sharding plus a skewed query mix makes one shard's utilization climb.
Hysteresis keeps it from flapping:
- hot: utilization ≥ `hot_at` in `hot_for` consecutive evaluations → add one replica (at most
  `hot_max_added` per shard, then `cooldown` evaluations before the next change to that shard);
- cool: ≤ `cool_at` in `cool_for` consecutive evaluations → remove one replica it added;
- in between: nothing changes, and both streaks restart.
Only replicas this policy added are removed; the configured ones stay. Pure logic (no clock, no
I/O): the router calls `evaluate` on a timer and carries out the decisions (hot_shard_scaler.py).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Protocol


class Change(str, enum.Enum):
    ADD = "add"
    REMOVE = "remove"


class HotShardPolicy(Protocol):
    """The thresholds, read from the router's settings (`SearchSettings`: hot_at, cool_at,
    hot_for, cool_for, hot_max_added; their defaults and bounds live there, once). Read-only
    properties: the settings are frozen."""

    @property
    def hot_at(self) -> float: ...
    @property
    def cool_at(self) -> float: ...
    @property
    def hot_for(self) -> int: ...
    @property
    def cool_for(self) -> int: ...
    @property
    def hot_max_added(self) -> int: ...


COOLDOWN = 5  # evaluations after a change before the next one to the same shard


@dataclasses.dataclass(slots=True)
class _ShardTrack:
    hot_streak: int = 0
    cool_streak: int = 0
    added: int = 0
    quiet: int = 0  # evaluations left before another change


def utilization(busy_s: float, interval_s: float, replicas: int) -> float:
    """Index-busy seconds in an interval → the average busy fraction of one serving replica."""
    return busy_s / (interval_s * max(1, replicas)) if interval_s > 0 else 0.0


class HotShardTracker:
    def __init__(self, policy: HotShardPolicy, cooldown: int = COOLDOWN):
        self.policy = policy
        self.cooldown = cooldown
        self._tracks: dict[str, _ShardTrack] = {}

    def added(self, shard: str) -> int:
        return self._tracks.get(shard, _ShardTrack()).added

    def evaluate(self, util: dict[str, float]) -> list[tuple[str, Change]]:
        """One evaluation over every shard's utilization per replica; the changes to make."""
        p = self.policy
        out: list[tuple[str, Change]] = []
        for shard, u in util.items():
            t = self._tracks.setdefault(shard, _ShardTrack())
            if t.quiet > 0:
                t.quiet -= 1
            if u >= p.hot_at:
                t.hot_streak, t.cool_streak = t.hot_streak + 1, 0
            elif u <= p.cool_at:
                t.cool_streak, t.hot_streak = t.cool_streak + 1, 0
            else:
                t.hot_streak = t.cool_streak = 0
            if t.quiet > 0:
                continue
            if t.hot_streak >= p.hot_for and t.added < p.hot_max_added:
                t.added += 1
                t.hot_streak, t.quiet = 0, self.cooldown
                out.append((shard, Change.ADD))
            elif t.cool_streak >= p.cool_for and t.added > 0:
                t.added -= 1
                t.cool_streak, t.quiet = 0, self.cooldown
                out.append((shard, Change.REMOVE))
        return out
