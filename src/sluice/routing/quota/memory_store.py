"""Token quotas in this process's memory (one gateway, or tests).

Nothing here awaits, so each call is atomic under asyncio, the guarantee the Redis store gets
from Lua. One counter per (tenant, model) remembers its period id; a request in a new period
starts the counter over, exactly like the Redis hash. The clock is wall time (quota periods
are calendar days and months, UTC) and injected for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.routing.fleet_file.schema import TokenQuotaSpec
from sluice.routing.quota.semantics import KEEP_AFTER_RESET_S, QuotaDecision, QuotaReservation, decide, period_window

PRUNE_EVERY = 4096


@dataclass(slots=True)
class _Counter:
    period_id: str
    used: int
    expires_at: float


class MemoryQuotaStore:
    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._counters: dict[tuple[str, str], _Counter] = {}
        self._calls = 0

    def _used(self, key: tuple[str, str], period_id: str) -> int:
        c = self._counters.get(key)
        return c.used if c is not None and c.period_id == period_id else 0

    async def acquire(
        self, tenant: str, model_id: str, quota: TokenQuotaSpec, tokens: int, *, force: bool = False
    ) -> QuotaDecision:
        now = self._clock()
        period_id, reset_at = period_window(quota.period, now)
        key = (tenant, model_id)
        used = self._used(key, period_id)
        status, reserve = decide(quota, used, force)
        reservation = None
        if reserve:
            used += tokens
            self._counters[key] = _Counter(period_id, used, reset_at + KEEP_AFTER_RESET_S)
            reservation = QuotaReservation(tenant, model_id, period_id, tokens)
        self._calls += 1
        if self._calls % PRUNE_EVERY == 0:
            self._prune(now)
        return QuotaDecision(status, quota.tokens, used, reset_at, max(0.0, reset_at - now), reservation)

    async def settle(self, reservation: QuotaReservation, actual_tokens: int) -> None:
        c = self._counters.get((reservation.tenant, reservation.model_id))
        if c is not None and c.period_id == reservation.period_id:
            c.used = max(0, c.used + actual_tokens - reservation.tokens)

    async def usage(self, tenant: str, model_id: str, quota: TokenQuotaSpec) -> QuotaDecision:
        now = self._clock()
        period_id, reset_at = period_window(quota.period, now)
        used = self._used((tenant, model_id), period_id)
        status, _ = decide(quota, used, False)
        return QuotaDecision(status, quota.tokens, used, reset_at, max(0.0, reset_at - now))

    async def close(self) -> None:
        return None

    def _prune(self, now: float) -> None:
        for key in [k for k, c in self._counters.items() if c.expires_at <= now]:
            del self._counters[key]
