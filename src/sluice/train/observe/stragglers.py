"""Step-time outliers per rank: every rank's forward + backward seconds (less the communication
it waited for) travel in the step's closing all-reduce, one slot per rank, so rank 0 sees them
all without another collective. A rank whose time is above `factor` x the median is a straggler
(a slow core, a throttled GPU, a noisy neighbour); metrics.jsonl names it every step it is one."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any


@dataclass(frozen=True, slots=True)
class Spread:
    slowest: float
    median: float
    stragglers: list[int]

    def columns(self) -> dict[str, Any]:
        """The spread by its metrics.jsonl columns (train/metrics.py)."""
        return {"rank_compute_max": self.slowest, "rank_compute_median": self.median, "stragglers": self.stragglers}


def spread(times: list[float], factor: float) -> Spread:
    if not times:
        return Spread(0.0, 0.0, [])
    mid = median(times)
    return Spread(max(times), mid, [r for r, t in enumerate(times) if mid > 0 and t > factor * mid])
