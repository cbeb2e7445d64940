"""What the router knows about each replica: load, latency, health, how far it has applied.

Latency is tracked two ways: an EWMA (the load signal replica choice uses) and a window of
recent samples per shard (its p95 is the hedging delay). A request that fails or times out
counts as a sample of its elapsed time, so a stalled (SIGSTOPped) replica's EWMA rises while it
is being avoided, not only after it answers.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

EWMA_ALPHA = 0.2
DOWN_AFTER_FAILURES = 1  # a refused connection or a timeout marks it down for down_for_s
DOWN_FOR_S = 1.0


@dataclasses.dataclass(slots=True)
class ReplicaState:
    url: str
    name: str  # "<shard>/<index>", the metrics label
    local: bool = False
    in_flight: int = 0
    ewma_s: float = 0.002
    failures: int = 0
    down_until: float = 0.0
    applied_seq: int = 0  # last known (from its answers and the health poll)
    log_base: int = 0  # its write log holds entries after this one (compaction)
    applied_ts: float = 0.0  # when its newest applied entry was sequenced (0: unknown)
    reachable: bool = True
    serving: bool = True  # False for a replica added while it catches up (queries skip it)
    added: bool = False  # added by the hot-shard policy (hot_shards.py), removable

    def cost(self) -> float:
        """Expected wait: the EWMA latency scaled by the queue in front of a new request."""
        return self.ewma_s * (self.in_flight + 1)

    def available(self, now: float) -> bool:
        return now >= self.down_until

    def observe_lower_bound(self, elapsed_s: float) -> None:
        """A request cancelled after elapsed_s (it lost a hedge): its latency is at least that."""
        if elapsed_s > self.ewma_s:
            self.ewma_s += EWMA_ALPHA * (elapsed_s - self.ewma_s)

    def observe(self, elapsed_s: float, ok: bool, now: float | None = None) -> None:
        self.ewma_s += EWMA_ALPHA * (elapsed_s - self.ewma_s)
        if ok:
            self.failures = 0
            self.reachable = True
        else:
            self.failures += 1
            if self.failures >= DOWN_AFTER_FAILURES:
                self.down_until = (now if now is not None else time.monotonic()) + DOWN_FOR_S


class LatencyWindow:
    """The last `size` latencies of a shard's requests; quantiles for the hedge delay."""

    def __init__(self, size: int = 512):
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)

    def quantile(self, q: float) -> float | None:
        if len(self._samples) < 20:
            return None  # too few to say; no hedging yet
        ordered = sorted(self._samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def __len__(self) -> int:
        return len(self._samples)
