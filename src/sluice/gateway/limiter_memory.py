"""Token buckets and concurrency leases in this process's memory (one gateway process).

asyncio runs one coroutine at a time and nothing here awaits, so each call is atomic — the
same all-or-nothing guarantee the Redis store gets from Lua. Concurrency slots are leases with
an expiry, like Redis's, so a request whose `settle` never comes (a bug) cannot pin a slot
forever. Same semantics as limiter_redis.py; see token_bucket.py for the bucket rules.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from sluice.gateway.limits import BucketState, Decision, LimitReason, Limits
from sluice.gateway.token_bucket import WINDOW_S, Bucket, refill, reset_s, wait_s


class MemoryLimiter:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S, lease_ttl_s: float = 900.0
    ) -> None:
        self._clock = clock
        self.window_s = window_s
        self.lease_ttl_s = lease_ttl_s
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._leases: dict[str, dict[str, float]] = {}  # key -> lease id -> expiry
        self._acquires = 0

    async def acquire(self, key: str, limits: Limits, input_tokens: int, output_tokens: int) -> Decision:
        now = self._clock()
        costs = {"requests": 1, "input_tokens": input_tokens, "output_tokens": output_tokens}
        dims = limits.buckets()
        levels = {dim: refill(self._buckets.get((key, dim)), limit, now, self.window_s) for dim, limit in dims.items()}
        retry, reason = 0.0, LimitReason.NONE
        for dim, limit in dims.items():
            wait = wait_s(levels[dim], costs[dim], limit, self.window_s)
            if wait > retry:
                retry, reason = wait, LimitReason(dim)
        leases = self._live_leases(key, now)
        if not reason and limits.max_concurrent is not None and len(leases) >= limits.max_concurrent:
            retry, reason = 1.0, LimitReason.CONCURRENCY  # no way to know when a slot frees: a short hint
        allowed = reason is LimitReason.NONE
        states: dict[str, BucketState] = {}
        for dim, limit in dims.items():
            left = levels[dim] - (costs[dim] if allowed else 0)
            self._buckets[(key, dim)] = Bucket(left, now)
            states[dim] = BucketState(limit, left, reset_s(left, limit, self.window_s))
        lease = None
        if allowed and limits.max_concurrent is not None:
            lease = uuid.uuid4().hex
            leases[lease] = now + self.lease_ttl_s
        self._acquires += 1
        if self._acquires % 4096 == 0:
            self._prune(now)
        return Decision(allowed, retry, states, reason, lease)

    async def settle(
        self, key: str, limits: Limits, reserved_output: int, actual_output: int, lease: str | None
    ) -> None:
        refund = reserved_output - actual_output
        if refund > 0 and limits.otpm:
            now = self._clock()
            level = refill(self._buckets.get((key, "output_tokens")), limits.otpm, now, self.window_s)
            self._buckets[(key, "output_tokens")] = Bucket(min(float(limits.otpm), level + refund), now)
        if lease is not None:
            self._leases.get(key, {}).pop(lease, None)

    async def renew(self, key: str, lease: str) -> None:
        leases = self._leases.get(key, {})
        if lease in leases:  # an expired or released lease stays gone
            leases[lease] = self._clock() + self.lease_ttl_s

    async def close(self) -> None:
        return None

    def _live_leases(self, key: str, now: float) -> dict[str, float]:
        leases = self._leases.setdefault(key, {})
        for lease in [lease for lease, expiry in leases.items() if expiry <= now]:
            del leases[lease]
        return leases

    def _prune(self, now: float) -> None:
        """Forget full buckets and empty lease sets: they equal missing ones (memory stays
        bounded with many keys; Redis gets the same from TTLs). A bucket at level ≥ 0 untouched
        for a whole window is full whatever its limit; one in debt is kept until it is not."""
        for bk in [bk for bk, b in self._buckets.items() if b.level >= 0 and now - b.ts >= self.window_s]:
            del self._buckets[bk]
        for key in [k for k, v in self._leases.items() if not v]:
            del self._leases[key]
