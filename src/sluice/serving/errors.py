"""Why a request was refused or failed, in words no wire format owns.

The pipeline raises `ServingError` for everything it refuses before a response starts, and
reports a `Failed` outcome (serving/outcomes.py) with the same `ErrorKind` for a failure after
it started. Each wire format maps a kind onto its own status and error type in exactly one
place (api/errors.py), so the Anthropic and OpenAI routes cannot disagree about what, say, an
engine abort is.
"""

from __future__ import annotations

import enum
from typing import TypedDict, Unpack


class ErrorKind(str, enum.Enum):
    """Why, in words no wire format owns: a kind's HTTP status and error types are stated once, in
    api/errors.py (STATUS_FOR_KIND and each wire format's table)."""

    INVALID_REQUEST = "invalid_request"  # the request itself is wrong
    PERMISSION = "permission"  # refused by policy
    NOT_FOUND = "not_found"  # unknown model, stream, batch
    CONFLICT = "conflict"  # conflicts with an earlier request
    UNPROCESSABLE = "unprocessable"  # well-formed but not acceptable: an idempotency key reused for another body
    RATE_LIMITED = "rate_limited"  # this caller is over a limit
    OVERLOADED = "overloaded"  # the service cannot take it now: queue full, no engine, draining
    TIMEOUT = "timeout"  # took longer than allowed
    INTERNAL = "internal"  # a fault on our side


class Detail(TypedDict, total=False):
    """What a reply may say besides its status and message (the keyword arguments of
    UserSafeError and of each error built on it)."""

    headers: dict[str, str] | None  # extra response headers (the rate-limit headers)
    code: str | None  # a stable machine-readable cause (e.g. `safety.input.weapons`)
    param: str | None  # the request field at fault, when known


class UserSafeError(Exception):
    """An error whose message and `Detail` the caller is shown: the pipeline's ServingError and
    the API's ApiError (api/errors.py), which carries a ServingError's detail over as it is."""

    def __init__(self, message: str, **detail: Unpack[Detail]):
        super().__init__(message)
        self.message = message
        self.headers = dict(detail.get("headers") or {})
        self.code = detail.get("code")
        self.param = detail.get("param")


class ServingError(UserSafeError):
    """A refusal or failure, of a kind no wire format owns. `retry_after_s`: when the caller may
    retry (429 / 529)."""

    def __init__(self, kind: ErrorKind, message: str, *, retry_after_s: float | None = None, **detail: Unpack[Detail]):
        super().__init__(message, **detail)
        self.kind = kind
        self.retry_after_s = retry_after_s


def invalid(message: str, param: str | None = None) -> ServingError:
    return ServingError(ErrorKind.INVALID_REQUEST, message, param=param)


def overloaded(message: str, retry_after_s: float = 1.0) -> ServingError:
    return ServingError(ErrorKind.OVERLOADED, message, retry_after_s=retry_after_s)
