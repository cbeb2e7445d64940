"""The rate limiter: one Protocol, two stores with the same semantics, and a safety wrapper.

`acquire` takes every dimension (requests, input tokens, output tokens reserved at max_tokens,
a concurrency slot) or none. `settle` returns the unused part of the output reservation when the
request ends — on success, abort or error alike — and releases the concurrency slot.

`GuardedLimiter` decides what happens when the store fails (Redis down): `on_store_error="open"`
admits (and logs), `"closed"` refuses with reason `store_unavailable` (the API answers 529, not
500). Either way one warning per 30 s, never an exception to the caller.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from sluice.gateway.limits import Decision, Limits

log = logging.getLogger("sluice.gateway.limits")


class RateLimiter(Protocol):
    async def acquire(self, key: str, limits: Limits, input_tokens: int, output_tokens: int) -> Decision: ...

    async def settle(self, key: str, limits: Limits, reserved_output: int, actual_output: int, lease: str | None) -> None: ...

    async def close(self) -> None: ...


class GuardedLimiter:
    def __init__(self, inner: RateLimiter, on_store_error: str = "open"):
        if on_store_error not in ("open", "closed"):
            raise ValueError("on_store_error must be 'open' or 'closed'")
        self.inner = inner
        self.on_store_error = on_store_error
        self._last_warning = 0.0
        self.store_errors = 0

    def _warn(self, exc: Exception) -> None:
        self.store_errors += 1
        now = time.monotonic()
        if now - self._last_warning > 30:
            self._last_warning = now
            log.warning(
                "rate-limit store unavailable (%s: %s); failing %s", type(exc).__name__, exc, self.on_store_error
            )

    async def acquire(self, key: str, limits: Limits, input_tokens: int, output_tokens: int) -> Decision:
        try:
            return await self.inner.acquire(key, limits, input_tokens, output_tokens)
        except Exception as exc:  # the store is down: the configured policy, never a 500
            self._warn(exc)
            if self.on_store_error == "open":
                return Decision(True, reason="store_unavailable")
            return Decision(False, retry_after_s=5.0, reason="store_unavailable")

    async def settle(self, key: str, limits: Limits, reserved_output: int, actual_output: int, lease: str | None) -> None:
        try:
            await self.inner.settle(key, limits, reserved_output, actual_output, lease)
        except Exception as exc:
            self._warn(exc)

    async def close(self) -> None:
        await self.inner.close()


def make_limiter(store: str, redis_url: str | None = None, on_store_error: str = "open") -> GuardedLimiter:
    if store == "memory":
        from sluice.gateway.limiter_memory import MemoryLimiter

        return GuardedLimiter(MemoryLimiter(), on_store_error)
    if store == "redis":
        from sluice.gateway.limiter_redis import RedisLimiter

        return GuardedLimiter(RedisLimiter(redis_url or "redis://127.0.0.1:6379/0"), on_store_error)
    raise ValueError(f"unknown limits store {store!r}: use 'memory' or 'redis'")
