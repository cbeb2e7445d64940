"""Recent latency, for the status page: the last few minutes of TTFT and inter-token samples,
summarized per time bucket (p50 / p95 / count). Prometheus holds the history; this is what one
gateway saw lately, plotted live without a metrics server."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class RecentLatency:
    def __init__(self, window_s: float = 300.0, max_samples: int = 20_000, clock: Callable[[], float] = time.time):
        self.window_s = window_s
        self._clock = clock
        self._samples: dict[str, deque[tuple[float, float]]] = {
            "ttft": deque(maxlen=max_samples),
            "itl": deque(maxlen=max_samples),
        }

    def record(self, kind: str, seconds: float) -> None:
        self._samples[kind].append((self._clock(), seconds))

    def series(self, bucket_s: float = 5.0) -> list[dict[str, float | int | None]]:
        """Oldest bucket first: {t (bucket start, unix s), <kind>_p50, <kind>_p95, <kind>_n}."""
        now = self._clock()
        start = now - self.window_s
        n_buckets = int(self.window_s // bucket_s)
        rows: list[dict[str, float | int | None]] = []
        buckets: dict[str, list[list[float]]] = {k: [[] for _ in range(n_buckets)] for k in self._samples}
        for kind, samples in self._samples.items():
            while samples and samples[0][0] < start:
                samples.popleft()
            for t, v in samples:
                i = min(n_buckets - 1, int((t - start) // bucket_s))
                buckets[kind][i].append(v)
        for i in range(n_buckets):
            row: dict[str, float | int | None] = {"t": start + i * bucket_s}
            for kind in self._samples:
                vals = buckets[kind][i]
                row[f"{kind}_p50"] = _quantile(vals, 0.5) if vals else None
                row[f"{kind}_p95"] = _quantile(vals, 0.95) if vals else None
                row[f"{kind}_n"] = len(vals)
            rows.append(row)
        return rows
