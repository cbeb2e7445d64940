"""Why a request was refused or failed, in words no wire format owns.

The pipeline raises `ServingError` for everything it refuses before a response starts, and
reports a `Failed` outcome (serving/outcomes.py) with the same `ErrorKind` for a failure after
it started. Each wire format maps a kind onto its own status and error type in exactly one
place (api/errors.py), so the Anthropic and OpenAI routes cannot disagree about what, say, an
engine abort is.
"""

from __future__ import annotations

import enum


class ErrorKind(str, enum.Enum):
    INVALID_REQUEST = "invalid_request"  # the request itself is wrong (400)
    PERMISSION = "permission"  # refused by policy (403)
    NOT_FOUND = "not_found"  # unknown model, stream, batch (404)
    CONFLICT = "conflict"  # conflicts with an earlier request (409)
    UNPROCESSABLE = "unprocessable"  # well-formed but not acceptable: an idempotency key reused for another body (422)
    RATE_LIMITED = "rate_limited"  # this caller is over a limit (429)
    OVERLOADED = "overloaded"  # the service cannot take it now: queue full, no engine, draining (529)
    TIMEOUT = "timeout"  # took longer than allowed (504 / timeout_error)
    INTERNAL = "internal"  # a fault on our side (500)


class ServingError(Exception):
    """A refusal or failure with a user-safe message.

    `retry_after_s`: when the caller may retry (429 / 529). `headers`: extra response headers
    the refusal carries (the rate-limit headers). `code`: a stable machine-readable cause
    (e.g. `safety.input.weapons`). `param`: the request field at fault, when known."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})
        self.code = code
        self.param = param


def invalid(message: str, param: str | None = None) -> ServingError:
    return ServingError(ErrorKind.INVALID_REQUEST, message, param=param)


def overloaded(message: str, retry_after_s: float = 1.0) -> ServingError:
    return ServingError(ErrorKind.OVERLOADED, message, retry_after_s=retry_after_s)
