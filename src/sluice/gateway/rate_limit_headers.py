"""`anthropic-ratelimit-*` and `retry-after` headers from a limiter Decision (reference §7)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from sluice.gateway.limits import Decision

_NAMES = {"requests": "requests", "input_tokens": "input-tokens", "output_tokens": "output-tokens"}


def rfc3339(seconds_from_now: float) -> str:
    t = datetime.now(timezone.utc) + timedelta(seconds=max(0.0, seconds_from_now))
    return t.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    headers: dict[str, str] = {}
    for dim, state in decision.buckets.items():
        name = _NAMES[dim]
        headers[f"anthropic-ratelimit-{name}-limit"] = str(state.limit)
        headers[f"anthropic-ratelimit-{name}-remaining"] = str(max(0, math.floor(state.remaining)))
        headers[f"anthropic-ratelimit-{name}-reset"] = rfc3339(state.reset_s)
    tokens = [s for d, s in decision.buckets.items() if d != "requests"]
    if tokens:  # the most restrictive token bucket, as Anthropic's combined "tokens" family
        tight = min(tokens, key=lambda s: s.remaining / s.limit)
        headers["anthropic-ratelimit-tokens-limit"] = str(tight.limit)
        headers["anthropic-ratelimit-tokens-remaining"] = str(max(0, math.floor(tight.remaining)))
        headers["anthropic-ratelimit-tokens-reset"] = rfc3339(tight.reset_s)
    if not decision.allowed:
        headers["retry-after"] = str(max(1, math.ceil(decision.retry_after_s)))
        headers["retry-after-ms"] = str(max(1, int(decision.retry_after_s * 1000)))
    return headers
