"""API errors and their two wire shapes (Anthropic's and OpenAI's).

Every error the server returns goes through `ApiError`: a status, a type from the route's
vocabulary, and a user-safe message. Unexpected exceptions become a 500 `api_error` with a
generic message (the details go to the log, with the request id, never to the client).
"""

from __future__ import annotations

from typing import Any, Unpack

from sluice.serving.errors import Detail, ErrorKind, ServingError, UserSafeError

# The one mapping of wire-neutral error kinds onto HTTP statuses (both wire formats use it).
STATUS_FOR_KIND: dict[ErrorKind, int] = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.PERMISSION: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.UNPROCESSABLE: 422,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.OVERLOADED: 529,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.INTERNAL: 500,
}

# Anthropic's status ↔ type table (reference §5.2).
ANTHROPIC_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    431: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

# OpenAI's error "type" values by status.
OPENAI_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
    504: "timeout",
    529: "server_error",
}


class ApiError(UserSafeError):
    """A reply's error: its HTTP status, and its `type` where the status alone does not say it
    (else the wire format's table above). Its `code` is Anthropic's `error.details.error_code`
    and OpenAI's `code`."""

    def __init__(self, status: int, message: str, *, type: str | None = None, **detail: Unpack[Detail]):
        super().__init__(message, **detail)
        self.status = status
        self.type = type
        if status < 500 and status not in (408, 409, 429):
            # Anthropic marks client errors as not retryable; the SDKs obey this header.
            self.headers.setdefault("x-should-retry", "false")

    def anthropic_body(self, request_id: str | None) -> dict[str, Any]:
        error: dict[str, Any] = {
            "type": self.type or ANTHROPIC_TYPES.get(self.status, "api_error"),
            "message": self.message,
        }
        if self.code:
            error["details"] = {"error_code": self.code}
        return {"type": "error", "error": error, "request_id": request_id}

    def openai_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": OPENAI_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, **kw: Any) -> ApiError:
    return ApiError(400, message, **kw)


def overloaded(message: str = "Overloaded", retry_after: float = 1.0) -> ApiError:
    return ApiError(529, message, headers=retry_headers(retry_after))


def retry_headers(seconds: float) -> dict[str, str]:
    """Integer `retry-after` (rounded up, ≥ 1) plus exact `retry-after-ms` (reference §7)."""
    whole = max(1, int(-(-seconds // 1)))
    return {"retry-after": str(whole), "retry-after-ms": str(max(1, int(seconds * 1000)))}


def is_openai_path(path: str) -> bool:
    return path.startswith(
        (
            "/v1/chat/",
            "/v1/completions",
            "/openai/",
            "/tokenize",
            "/detokenize",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
        )
    )


def api_error_for(exc: ServingError) -> ApiError:
    """A pipeline refusal as an HTTP error (status from its kind, retry headers, code, param)."""
    headers = dict(exc.headers)
    if exc.retry_after_s is not None and "retry-after" not in headers:
        headers.update(retry_headers(exc.retry_after_s))
    return ApiError(STATUS_FOR_KIND[exc.kind], exc.message, headers=headers, code=exc.code, param=exc.param)


def anthropic_error_type(kind: ErrorKind) -> str:
    """The `error.type` of an in-stream Anthropic `error` event for a failure of this kind."""
    return ANTHROPIC_TYPES[STATUS_FOR_KIND[kind]]


def openai_error_type(kind: ErrorKind) -> str:
    return OPENAI_TYPES[STATUS_FOR_KIND[kind]]
