"""Why a search tool call has no results: the closed vocabulary of its error result.

The values are the error codes of Anthropic's `web_search_tool_result_error` (the wire renders
them as they are); every failure of a search — the service down, slow, refusing the query or
the key — is one of these, returned to the model and the client as a result, never an HTTP error
of the request.
"""

from __future__ import annotations

import enum


class SearchToolError(str, enum.Enum):
    UNAVAILABLE = "unavailable"  # the service is down, timed out, answered 5xx or refused our key
    INVALID_INPUT = "invalid_tool_input"  # the service refused the query (a syntax error)
    QUERY_TOO_LONG = "query_too_long"  # the service's bounds (characters, words)
    TOO_MANY_REQUESTS = "too_many_requests"  # the service answered 429
    MAX_USES_EXCEEDED = "max_uses_exceeded"  # the request's max_uses searches have run already
