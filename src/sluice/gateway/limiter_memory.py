"""Token buckets and concurrency slots in this process's memory (one gateway process).

asyncio runs one coroutine at a time and nothing here awaits, so each call is atomic.
"""

from __future__ import annotations

import time
import uuid

from sluice.gateway.limits import WINDOW_S, BucketState, Decision, Limits


class MemoryLimiter:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # (key, dim) -> (tokens, ts)
        self._leases: dict[str, set[str]] = {}

    def _level(self, key: str, dim: str, limit: int, now: float) -> float:
        tokens, ts = self._buckets.get((key, dim), (float(limit), now))
        return min(float(limit), tokens + (now - ts) * limit / WINDOW_S)

    async def acquire(self, key: str, limits: Limits, input_tokens: int, output_tokens: int) -> Decision:
        now = self._clock()
        costs = {"requests": 1, "input_tokens": input_tokens, "output_tokens": output_tokens}
        levels = {dim: self._level(key, dim, limit, now) for dim, limit in limits.buckets().items()}
        retry, reason = 0.0, ""
        for dim, limit in limits.buckets().items():
            if costs[dim] > levels[dim]:
                wait = (costs[dim] - levels[dim]) * WINDOW_S / limit
                if wait > retry:
                    retry, reason = wait, dim
        leases = self._leases.setdefault(key, set())
        if not reason and limits.max_concurrent is not None and len(leases) >= limits.max_concurrent:
            retry, reason = 1.0, "concurrency"
        allowed = not reason
        states: dict[str, BucketState] = {}
        for dim, limit in limits.buckets().items():
            left = levels[dim] - (costs[dim] if allowed else 0)
            self._buckets[(key, dim)] = (left, now)
            states[dim] = BucketState(limit, left, (limit - left) * WINDOW_S / limit)
        lease = None
        if allowed and limits.max_concurrent is not None:
            lease = uuid.uuid4().hex
            leases.add(lease)
        return Decision(allowed, retry, states, reason, lease)

    async def settle(self, key: str, limits: Limits, reserved_output: int, actual_output: int, lease: str | None) -> None:
        refund = reserved_output - actual_output
        if refund > 0 and limits.otpm:
            now = self._clock()
            level = self._level(key, "output_tokens", limits.otpm, now)
            self._buckets[(key, "output_tokens")] = (min(float(limits.otpm), level + refund), now)
        if lease is not None:
            self._leases.get(key, set()).discard(lease)

    async def close(self) -> None:
        return None
