"""The one mapping of the pipeline's error kinds onto each wire format (api/errors.py), and a
refusal's detail (headers, cause code, param) carried from the pipeline's error to the reply's
unchanged — both are `UserSafeError`s, which states what that detail is once."""

from __future__ import annotations

from sluice.api.errors import (
    ANTHROPIC_TYPES,
    OPENAI_TYPES,
    STATUS_FOR_KIND,
    ApiError,
    anthropic_error_type,
    api_error_for,
    openai_error_type,
)
from sluice.serving.errors import ErrorKind, ServingError, UserSafeError


def test_every_kind_has_a_status_and_a_type_in_each_wire_format():
    assert set(STATUS_FOR_KIND) == set(ErrorKind)
    for kind, status in STATUS_FOR_KIND.items():
        assert status in ANTHROPIC_TYPES and status in OPENAI_TYPES
        assert anthropic_error_type(kind) == ApiError(status, "m").anthropic_body(None)["error"]["type"]
        assert openai_error_type(kind) == ApiError(status, "m").openai_body()["error"]["type"]


def test_the_detail_of_a_refusal_reaches_the_reply_as_it_is():
    headers = {"anthropic-ratelimit-requests-remaining": "0"}
    exc = ServingError(ErrorKind.RATE_LIMITED, "slow down", retry_after_s=2.5, headers=headers, code="rate", param="p")
    headers["late"] = "x"  # the error keeps its own copy
    err = api_error_for(exc)
    assert isinstance(exc, UserSafeError) and isinstance(err, UserSafeError)
    assert (err.status, err.message, err.code, err.param) == (429, "slow down", "rate", "p")
    assert err.headers == {
        "anthropic-ratelimit-requests-remaining": "0",
        "retry-after": "3",
        "retry-after-ms": "2500",
    }
    assert err.anthropic_body("req_1")["error"] == {
        "type": "rate_limit_error",
        "message": "slow down",
        "details": {"error_code": "rate"},
    }
    assert err.openai_body()["error"] == {
        "message": "slow down",
        "type": "rate_limit_exceeded",
        "param": "p",
        "code": "rate",
    }


def test_a_client_error_is_marked_not_retryable_and_its_detail_defaults_to_none():
    err = ApiError(400, "bad")
    assert (err.code, err.param, err.type) == (None, None, None)
    assert err.headers == {"x-should-retry": "false"}
    assert ApiError(429, "later").headers == {}
