"""Per-model token quotas per tier: the rules, the period calendar and the store interface.

A quota (fleet file: `[models.M.tiers.T] quota = { tokens, period, mode }`) caps the tokens
(prompt + output) one tenant may use on one model per calendar period, UTC: a day resets at
00:00, a month at 00:00 on the 1st. The counter is per (tenant, model): the tenant's tier picks
the limit.

Semantics (both stores, quota/memory_store.py and quota/redis_store.py, implement exactly these):
- `acquire` admits a request while the period's usage is *below* the limit, and reserves the
  request's estimate (prompt + max_tokens) at once, atomically with the check, so concurrent
  requests cannot all pass on the same last tokens. The last admitted request may overshoot
  the limit by at most its own size; a limit that refused any request bigger than what is left
  would lock out long requests near the end of a period for no gain.
- Over the limit: `HARD_EXCEEDED` (the caller answers 429, retry-after = seconds to the reset)
  or `SOFT_EXCEEDED` (the caller tries the next fallback model and adds a warning header).
  Nothing is reserved. `force=True` reserves even when over: a soft quota never refuses, so
  when no fallback can serve, the request runs on the model anyway and is counted.
- `settle` corrects the reservation to the request's actual usage when it ends (success, error
  or abort alike), clamped at zero. A reservation from a period that has since reset changes
  nothing: the new period starts clean.
- A counter lives until its period's reset plus an hour, then expires (memory stays bounded).
"""

from __future__ import annotations

import calendar
import enum
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from sluice.routing.fleet_file.schema import QuotaMode, QuotaPeriod, TokenQuotaSpec

DAY_S = 86400
KEEP_AFTER_RESET_S = 3600


class QuotaStatus(str, enum.Enum):
    OK = "ok"
    SOFT_EXCEEDED = "soft_exceeded"
    HARD_EXCEEDED = "hard_exceeded"


@dataclass(slots=True, frozen=True)
class QuotaReservation:
    tenant: str
    model_id: str
    period_id: str  # which period the tokens were charged to
    tokens: int


@dataclass(slots=True, frozen=True)
class QuotaDecision:
    status: QuotaStatus
    limit: int
    used: int  # tokens used this period, this request's reservation included when made
    reset_at: float  # epoch seconds (UTC) when the period resets
    retry_after_s: float  # seconds until reset_at (what a hard 429 sends as retry-after)
    reservation: QuotaReservation | None = None

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


def period_window(period: QuotaPeriod, now: float) -> tuple[str, float]:
    """(period id, reset time) of the calendar period holding `now` (epoch seconds, UTC).
    The ids ("d<days since epoch>", "m<year·12 + month−1>") match quota/redis_store.py's Lua."""
    day = math.floor(now / DAY_S)
    if period is QuotaPeriod.DAY:
        return f"d{day}", float((day + 1) * DAY_S)
    dt = datetime.fromtimestamp(day * DAY_S, UTC)
    y, m = (dt.year + 1, 1) if dt.month == 12 else (dt.year, dt.month + 1)
    return f"m{dt.year * 12 + dt.month - 1}", float(calendar.timegm((y, m, 1, 0, 0, 0)))


def exceeded_status(quota: TokenQuotaSpec) -> QuotaStatus:
    return QuotaStatus.HARD_EXCEEDED if quota.mode is QuotaMode.HARD else QuotaStatus.SOFT_EXCEEDED


def decide(quota: TokenQuotaSpec, used_before: int, force: bool) -> tuple[QuotaStatus, bool]:
    """(status, whether to reserve) — the rule both stores apply (the Lua spells it out)."""
    if used_before < quota.tokens:
        return QuotaStatus.OK, True
    return exceeded_status(quota), force


class QuotaStore(Protocol):
    """Token-quota counters shared by every gateway that uses the same store."""

    async def acquire(
        self, tenant: str, model_id: str, quota: TokenQuotaSpec, tokens: int, *, force: bool = False
    ) -> QuotaDecision:
        """Check the tenant's usage of the model and reserve `tokens` if it is under the limit
        (or if `force`), atomically. See the module docstring."""
        ...

    async def settle(self, reservation: QuotaReservation, actual_tokens: int) -> None:
        """The request ended: replace its reserved estimate by `actual_tokens`. Once."""
        ...

    async def usage(self, tenant: str, model_id: str, quota: TokenQuotaSpec) -> QuotaDecision:
        """The current period's usage, reserving nothing (for status pages and headers)."""
        ...

    async def close(self) -> None: ...
