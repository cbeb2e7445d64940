"""The health verdict a rollout watches: error rate and TTFT p95 of the new version.

A sliding window (the last `window_s` seconds) of request outcomes on the version being rolled
out. The verdict needs `min_requests` outcomes before it judges anything — one error in the
first request is not a 100 % error rate — then reports a breach when the failure fraction
exceeds `max_error_rate`, or when the 95th percentile (nearest rank) of time-to-first-token
over the successful requests exceeds `max_ttft_p95_s`. Kept apart from the state machine so
that any gateway can keep a window over its own traffic: rolling back is always safe, so a
follower that sees a breach may abort a rollout another gateway drives.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Breach:
    reason: str  # e.g. "error rate 0.40 > 0.05 over 25 requests"


@dataclass(slots=True, frozen=True)
class HealthSnapshot:
    requests: int
    error_rate: float
    ttft_p95_s: float | None


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class HealthWindow:
    def __init__(self, window_s: float, min_requests: int, max_error_rate: float, max_ttft_p95_s: float):
        self.window_s = window_s
        self.min_requests = min_requests
        self.max_error_rate = max_error_rate
        self.max_ttft_p95_s = max_ttft_p95_s
        self._obs: deque[tuple[float, bool, float | None]] = deque()  # (time, ok, ttft)

    def observe(self, now: float, ok: bool, ttft_s: float | None = None) -> None:
        self._obs.append((now, ok, ttft_s))
        self._trim(now)

    def clear(self) -> None:
        self._obs.clear()

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        while self._obs and self._obs[0][0] < horizon:
            self._obs.popleft()

    def snapshot(self, now: float) -> HealthSnapshot:
        self._trim(now)
        n = len(self._obs)
        errors = sum(1 for _, ok, _ in self._obs if not ok)
        ttfts = [t for _, ok, t in self._obs if ok and t is not None]
        return HealthSnapshot(n, errors / n if n else 0.0, p95(ttfts))

    def verdict(self, now: float) -> Breach | None:
        s = self.snapshot(now)
        if s.requests < self.min_requests:
            return None
        if s.error_rate > self.max_error_rate:
            return Breach(f"error rate {s.error_rate:.2f} > {self.max_error_rate:.2f} over {s.requests} requests")
        if s.ttft_p95_s is not None and s.ttft_p95_s > self.max_ttft_p95_s:
            return Breach(f"TTFT p95 {s.ttft_p95_s:.3f} s > {self.max_ttft_p95_s:.3f} s over {s.requests} requests")
        return None
