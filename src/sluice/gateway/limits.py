"""Rate-limit values and the answer a limiter gives."""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW_S = 60.0  # all token buckets are "per minute", refilled continuously


@dataclass(slots=True, frozen=True)
class Limits:
    rpm: int | None = None  # requests per minute
    itpm: int | None = None  # input tokens per minute (cache reads excluded)
    otpm: int | None = None  # output tokens per minute (reserved at max_tokens, settled at the end)
    max_concurrent: int | None = None

    def buckets(self) -> dict[str, int]:
        return {k: v for k, v in (("requests", self.rpm), ("input_tokens", self.itpm), ("output_tokens", self.otpm)) if v}


@dataclass(slots=True)
class BucketState:
    limit: int
    remaining: float
    reset_s: float  # seconds until the bucket is full again


@dataclass(slots=True)
class Decision:
    allowed: bool
    retry_after_s: float = 0.0
    buckets: dict[str, BucketState] = field(default_factory=dict)
    reason: str = ""  # "" | "requests" | "input_tokens" | "output_tokens" | "concurrency" | "store_unavailable" | "too_large"
    lease: str | None = None  # concurrency lease to release when the request ends
