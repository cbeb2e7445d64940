"""Token-bucket arithmetic shared by both limiter stores (limiter_redis.py's Lua mirrors it).

One bucket per (principal, dimension), dimension ∈ requests / input_tokens / output_tokens,
each "per minute" (`window_s`, 60 by default) and refilled continuously:

    level(t) = min(limit, level(t0) + (t − t0) · limit / window)      a new bucket starts full

A request costs 1 request, its prompt's input tokens and `max_tokens` output tokens (reserved;
the unused part is refunded when it ends). `acquire` is all-or-nothing across dimensions.

Admission rule: a cost c passes when level ≥ min(c, limit), and then the full c is deducted.
A request larger than a whole bucket (a 50k-token prompt against 30k ITPM) therefore waits for
a full bucket and leaves it in debt (level < 0) instead of being refused forever with a
retry-after that can never come true; the debt delays the key's next requests exactly as long
as the extra tokens would have. Usage stays exact.

Reported per dimension: remaining = level after the decision (shown floored at 0), reset = the
seconds until the bucket is full again; retry_after = the longest wait among refused dims.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW_S = 60.0  # all limits are per minute


@dataclass(slots=True)
class Bucket:
    level: float
    ts: float  # when `level` was measured (store clock)


def refill(bucket: Bucket | None, limit: int, now: float, window_s: float = WINDOW_S) -> float:
    """The bucket's level at `now`."""
    if bucket is None:
        return float(limit)
    return min(float(limit), bucket.level + max(0.0, now - bucket.ts) * limit / window_s)


def need(cost: float, limit: int) -> float:
    """The level a cost must find in the bucket (see the admission rule above)."""
    return min(float(cost), float(limit))


def wait_s(level: float, cost: float, limit: int, window_s: float = WINDOW_S) -> float:
    """Seconds until `cost` is admissible (0 when it is now)."""
    short = need(cost, limit) - level
    return 0.0 if short <= 0 else short * window_s / limit


def reset_s(level: float, limit: int, window_s: float = WINDOW_S) -> float:
    """Seconds until the bucket is full again."""
    return max(0.0, (limit - level) * window_s / limit)


def ttl_s(level: float, limit: int, window_s: float = WINDOW_S) -> int:
    """How long a store must keep a bucket: once full it equals a missing one, so it may go."""
    return int(reset_s(level, limit, window_s)) + 2
