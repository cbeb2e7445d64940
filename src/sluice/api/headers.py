"""sluice's own request headers, read the same way by both wire formats."""

from __future__ import annotations

from starlette.requests import Request

from sluice.api.errors import bad_request
from sluice.serving.request import VERSION_HEADER

QUEUE_TIMEOUT_HEADER = "sluice-queue-timeout"  # seconds a request may wait for admission
CACHE_HEADER = "sluice-cache"  # "bypass": skip the response cache
BACKGROUND_HEADER = "sluice-background"  # "true": keep generating after a disconnect (resume)
IDEMPOTENCY_HEADER = "Idempotency-Key"  # IETF httpapi draft: a retry of the same request is not run twice
MAX_IDEMPOTENCY_KEY = 255  # Stripe's bound; a UUID is 36


def queue_timeout(request: Request) -> float | None:
    raw = request.headers.get(QUEUE_TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise bad_request(f"{QUEUE_TIMEOUT_HEADER}: must be a number of seconds") from None
    if not value > 0:
        raise bad_request(f"{QUEUE_TIMEOUT_HEADER}: must be positive")
    return value


def wants_cache(request: Request) -> bool:
    return request.headers.get(CACHE_HEADER, "").lower() != "bypass"


def wants_background(request: Request, body_flag: bool) -> bool:
    return body_flag or request.headers.get(BACKGROUND_HEADER, "").lower() in ("1", "true", "yes")


def pinned_version(request: Request) -> str | None:
    """`sluice-model-version: <model>/<version>` (or just `<version>`): serve exactly that version
    (allowed per tier; docs/FLEET.md). Responses carry the same header."""
    value = request.headers.get(VERSION_HEADER, "").strip()
    return value or None


def idempotency_key(request: Request) -> str | None:
    """The key of an `Idempotency-Key` header: the draft's structured-field string (`"abc"`) or,
    as Stripe and most clients send it, the bare value — 1 to 255 printable ASCII characters."""
    raw = request.headers.get(IDEMPOTENCY_HEADER)
    if raw is None:
        return None
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if not 1 <= len(value) <= MAX_IDEMPOTENCY_KEY or not all(" " <= c <= "~" for c in value):
        raise bad_request(
            f"{IDEMPOTENCY_HEADER}: must be 1-{MAX_IDEMPOTENCY_KEY} printable ASCII characters (a UUID is a good key)"
        )
    return value
