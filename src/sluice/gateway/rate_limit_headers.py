"""`anthropic-ratelimit-*` and `retry-after` headers from a limiter Decision (reference §7)."""

from __future__ import annotations

import math

from sluice.gateway.limits import Decision, rfc3339

_NAMES = {"requests": "requests", "input_tokens": "input-tokens", "output_tokens": "output-tokens"}


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """Headers for any response under limits: `anthropic-ratelimit-{requests,input-tokens,
    output-tokens}-{limit,remaining,reset}` per limited dimension (remaining floored at 0, reset
    = when the bucket is full again, RFC 3339 UTC), the combined `-tokens-` family, and on a
    refusal `retry-after` (whole seconds, at least 1) and `retry-after-ms`. A fail-open decision
    has no buckets, hence no ratelimit headers."""
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
