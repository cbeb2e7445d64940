"""The rate limiter: one Protocol, two stores with the same semantics, and a safety wrapper.

`acquire` takes every dimension (requests, input tokens, output tokens reserved at max_tokens,
a concurrency slot) or none. `settle` returns the unused part of the output reservation when the
request ends — on success, abort or error alike — and releases the concurrency slot.

`GuardedLimiter` decides what happens when the store fails (Redis down, timeout):
- `on_store_error="open"` (default) admits: `Decision(allowed=True, reason=STORE_UNAVAILABLE)`,
  no rate-limit headers. Availability over strictness; limits resume when the store is back.
- `"closed"` refuses: `Decision(allowed=False, reason=STORE_UNAVAILABLE, retry_after_s=5)`;
  the API answers 529 `overloaded_error` with `retry-after` (not 429: the caller is within its
  limits; not 500: nothing crashed). The SDKs retry 529 on their own.
Either way one warning line per 30 s (not one per request), one info line when the store is
back, and never an exception to the caller; `settle` failures are swallowed the same way.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from sluice.gateway.limits import Decision, LimitReason, Limits

log = logging.getLogger("sluice.gateway.limits")

WARN_EVERY_S = 30.0
CLOSED_RETRY_AFTER_S = 5.0


class RateLimiter(Protocol):
    """A rate-limit store. `key` names the principal (Principal.limit_key)."""

    async def acquire(self, key: str, limits: Limits, input_tokens: int, output_tokens: int) -> Decision:
        """Take 1 request, `input_tokens` and `output_tokens` (max_tokens, reserved) and a
        concurrency slot — all of them or none. Allowed decisions carry `lease` when
        limits.max_concurrent is set."""
        ...

    async def settle(
        self, key: str, limits: Limits, reserved_output: int, actual_output: int, lease: str | None
    ) -> None:
        """The request ended (success, abort or error): refund reserved − actual output tokens
        and release the concurrency lease. Call exactly once per allowed acquire."""
        ...

    async def renew(self, key: str, lease: str) -> None:
        """Extend a live concurrency lease by the store's `lease_ttl_s` (the holder is still
        running: queued for hours in the batch band, or streaming). A gone lease stays gone."""
        ...

    async def close(self) -> None: ...


class GuardedLimiter:
    def __init__(self, inner: RateLimiter, on_store_error: str = "open"):
        if on_store_error not in ("open", "closed"):
            raise ValueError("on_store_error must be 'open' or 'closed'")
        self.inner = inner
        self.on_store_error = on_store_error
        self._last_warning = 0.0
        self._failing = False
        self.store_errors = 0

    def _warn(self, exc: Exception) -> None:
        self.store_errors += 1
        self._failing = True
        now = time.monotonic()
        if now - self._last_warning > WARN_EVERY_S:
            self._last_warning = now
            # the exception's class and text only: they name the store, never a key
            log.warning(
                "rate-limit store unavailable (%s: %s); failing %s", type(exc).__name__, exc, self.on_store_error
            )

    def _ok(self) -> None:
        if self._failing:
            self._failing = False
            self._last_warning = 0.0
            log.info("rate-limit store reachable again; limits enforced")

    async def acquire(self, key: str, limits: Limits, input_tokens: int, output_tokens: int) -> Decision:
        try:
            decision = await self.inner.acquire(key, limits, input_tokens, output_tokens)
        except Exception as exc:  # the store is down: the configured policy, never a 500
            self._warn(exc)
            if self.on_store_error == "open":
                return Decision(True, reason=LimitReason.STORE_UNAVAILABLE)
            return Decision(False, retry_after_s=CLOSED_RETRY_AFTER_S, reason=LimitReason.STORE_UNAVAILABLE)
        self._ok()
        return decision

    async def settle(
        self, key: str, limits: Limits, reserved_output: int, actual_output: int, lease: str | None
    ) -> None:
        try:
            await self.inner.settle(key, limits, reserved_output, actual_output, lease)
        except Exception as exc:  # a lost refund costs the key some tokens until refill; a lost
            self._warn(exc)  # release frees itself when the lease expires

    @property
    def lease_ttl_s(self) -> float:
        return float(getattr(self.inner, "lease_ttl_s", 900.0))

    async def renew(self, key: str, lease: str) -> None:
        try:
            await self.inner.renew(key, lease)
        except Exception as exc:  # the next renewal tries again; the lease outlives a short outage
            self._warn(exc)

    async def close(self) -> None:
        await self.inner.close()


def make_limiter(store: Any, redis_url: str | None = None, on_store_error: str | None = None) -> GuardedLimiter:
    """`make_limiter(settings)` (reads limits_store, redis_url, on_store_error) or
    `make_limiter("memory" | "redis", redis_url, on_store_error)`."""
    if not isinstance(store, str):  # a Settings object
        settings = store
        store = settings.limits_store
        redis_url = redis_url or settings.redis_url
        on_store_error = on_store_error or settings.on_store_error
    on_store_error = on_store_error or "open"
    if store == "memory":
        from sluice.gateway.limiter_memory import MemoryLimiter

        return GuardedLimiter(MemoryLimiter(), on_store_error)
    if store == "redis":
        from sluice.gateway.limiter_redis import RedisLimiter

        return GuardedLimiter(RedisLimiter(redis_url or "redis://127.0.0.1:6379/0"), on_store_error)
    raise ValueError(f"unknown limits store {store!r}: use 'memory' or 'redis'")
