"""Rate-limit values and the answer a limiter gives (bucket semantics: token_bucket.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

DIMENSIONS = ("requests", "input_tokens", "output_tokens")


@dataclass(slots=True, frozen=True)
class Limits:
    rpm: int | None = None  # requests per minute
    itpm: int | None = None  # input tokens per minute (cache reads excluded)
    otpm: int | None = None  # output tokens per minute (reserved at max_tokens, settled at the end)
    max_concurrent: int | None = None

    def buckets(self) -> dict[str, int]:
        """The limited dimensions and their per-minute limits (None / 0 = unlimited)."""
        return {
            k: v for k, v in (("requests", self.rpm), ("input_tokens", self.itpm), ("output_tokens", self.otpm)) if v
        }


def rfc3339(seconds_from_now: float, now: datetime | None = None) -> str:
    t = (now or datetime.now(UTC)) + timedelta(seconds=max(0.0, seconds_from_now))
    return t.replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class BucketState:
    limit: int
    remaining: float  # may be negative: a request larger than the bucket left it in debt
    reset_s: float  # seconds until the bucket is full again

    @property
    def reset_at(self) -> str:
        """The reset as an RFC 3339 UTC time (what the `…-reset` headers carry)."""
        return rfc3339(self.reset_s)


class LimitReason(str, enum.Enum):
    """Why a limiter refused (or, STORE_UNAVAILABLE, could not decide). The serving layer maps a
    dimension or CONCURRENCY onto 429 rate_limit_error; STORE_UNAVAILABLE (refused only with
    on_store_error="closed") onto 529 overloaded_error — the caller did nothing wrong and a retry
    soon may work, which is what 529 tells the SDKs (they retry it)."""

    NONE = ""
    REQUESTS = "requests"
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    CONCURRENCY = "concurrency"
    STORE_UNAVAILABLE = "store_unavailable"


@dataclass(slots=True)
class Decision:
    allowed: bool
    retry_after_s: float = 0.0
    buckets: dict[str, BucketState] = field(default_factory=dict)
    reason: LimitReason = LimitReason.NONE
    lease: str | None = None  # concurrency lease to release (settle) when the request ends
