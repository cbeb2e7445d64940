"""Why the search service refused or failed a request, and the one map onto HTTP statuses.

As serving's `ErrorKind` (serving/errors.py) does for the model APIs: every refusal the router
answers carries a `SearchErrorKind`, whose value is the wire `type` of the error body
`{"error": {"type", "message"}}` and whose status comes from `STATUS` — written once, so no
route can answer the same refusal with another status or type.
"""

from __future__ import annotations

import enum
from typing import Any

from sluice.errors import InvalidRequestError, SluiceError


class SearchErrorKind(str, enum.Enum):
    INVALID_REQUEST = "invalid_request_error"  # the body or a parameter is wrong
    QUERY_SYNTAX = "query_syntax_error"  # the query does not parse (with its position)
    AUTHENTICATION = "authentication_error"  # no key, or a wrong one, where keys are configured
    NOT_FOUND = "not_found_error"  # no such route
    METHOD_NOT_ALLOWED = "method_not_allowed_error"  # a route without that method
    QUERY_ONLY = "query_only_router"  # a write sent to a router with accept_writes = false
    TOO_LARGE = "request_too_large"  # a body over its bound (refused as soon as it passes it)
    INTERNAL = "api_error"  # a fault on our side (the log has the details)
    # the shard protocol's own (the router is a shard's only client)
    LOG_GAP = "log_gap"  # an append after a missing entry: the replica is behind (with last_seq)
    LOG_COMPACTED = "log_compacted"  # entries asked for were compacted away (with log_base)
    CATCH_UP_FAILED = "catch_up_failed"  # the peer to copy from failed


STATUS: dict[SearchErrorKind, int] = {
    SearchErrorKind.INVALID_REQUEST: 400,
    SearchErrorKind.QUERY_SYNTAX: 400,
    SearchErrorKind.AUTHENTICATION: 401,
    SearchErrorKind.NOT_FOUND: 404,
    SearchErrorKind.METHOD_NOT_ALLOWED: 405,
    SearchErrorKind.QUERY_ONLY: 405,
    SearchErrorKind.TOO_LARGE: 413,
    SearchErrorKind.INTERNAL: 500,
    SearchErrorKind.LOG_GAP: 409,
    SearchErrorKind.LOG_COMPACTED: 410,
    SearchErrorKind.CATCH_UP_FAILED: 502,
}


class SearchError(SluiceError):
    """A refusal with a user-safe message; `extra` joins the error body (e.g. `position`)."""

    def __init__(self, kind: SearchErrorKind, message: str, **extra: Any):
        super().__init__(message)
        self.kind, self.message, self.extra = kind, message, extra

    @property
    def status(self) -> int:
        return STATUS[self.kind]

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.kind.value, "message": self.message, **self.extra}}


class QuerySyntaxError(InvalidRequestError):
    """A query that does not parse; `position` is the 0-based character offset of the problem."""

    def __init__(self, position: int, message: str):
        super().__init__(f"query syntax error at position {position}: {message}")
        self.position = position
        self.reason = message

    def as_search_error(self) -> SearchError:
        return SearchError(SearchErrorKind.QUERY_SYNTAX, str(self), position=self.position)


class DocumentError(InvalidRequestError):
    """A document that cannot be indexed (no id, a bad field name, too large)."""


class SearchConfigError(SluiceError):
    """A search config file with problems; each reads `FILE:LINE: field: problem`."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid search config:\n  " + "\n  ".join(problems))
        self.problems = problems


class ShardFailure(str, enum.Enum):
    """Why a shard is missing from an answer (the values of `failed_shards`, and metric labels)."""

    TIMEOUT = "timeout"  # no replica answered within the round's deadline
    UNAVAILABLE = "unavailable"  # no replica up, every one failed, or its answer was malformed
    BAD_QUERY = "bad_query"  # a replica refused the request (4xx): the request's fault, never retried


class ShardCallError(SluiceError):
    """One request to one shard failed, after failover and hedging (router/query/shard_call.py)."""

    def __init__(self, shard: str, failure: ShardFailure, message: str, status: int = 503):
        super().__init__(f"shard {shard}: {message}")
        self.failure, self.status, self.message = failure, status, message
