"""The body of POST /v1/search: its bounds, its decoding, and its model for the OpenAPI document.

Both of the router's entry points — the ASGI front (front.py) and the FastAPI route (app.py) —
decode through `decode_search`, so a body is refused with the same status, type and message
whichever one reads it, and nothing but a `SearchError` ever comes out of it (no FastAPI
`{"detail": ...}`, no 500 from text `json` accepts and the rest of the path cannot carry).
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict, Field

from sluice.search import strict_json
from sluice.search.errors import SearchError, SearchErrorKind
from sluice.search.index.query_syntax import MAX_QUERY_CHARS

DEFAULT_TOP_K = 10
MIN_TOP_K = 0  # the upper bound is the config's search.max_top_k
# a query of MAX_QUERY_CHARS characters, each escaped as \uXXXX (6 bytes), and room to spare;
# a body over it is refused as soon as it passes it, never read whole
MAX_SEARCH_BODY_BYTES = 64 << 10


class SearchRequest(BaseModel):
    """The OpenAPI document's model of the body (decode_search is what checks it)."""

    model_config = ConfigDict(extra="forbid")
    query: str = Field(..., description="Query text (docs/SEARCH.md: words, \"phrases\", +must -not, AND/OR/NOT, "
                                        "field:word, trailing wildcards word*)", max_length=MAX_QUERY_CHARS)
    top_k: int = Field(DEFAULT_TOP_K, ge=MIN_TOP_K, description="How many hits (at most the configured max_top_k)")


SEARCH_FIELDS = frozenset(SearchRequest.model_fields)


@dataclasses.dataclass(frozen=True, slots=True)
class SearchQuery:
    query: str
    top_k: int


def _invalid(message: str) -> SearchError:
    return SearchError(SearchErrorKind.INVALID_REQUEST, message)


def decode_search(body: bytes, max_top_k: int) -> SearchQuery:
    """A search body → SearchQuery, or SearchError (400 invalid_request_error) saying why."""
    try:
        data = strict_json.loads(body)
    except strict_json.JsonError as exc:
        raise _invalid(f"invalid body: {exc}") from None
    if not isinstance(data, dict):
        raise _invalid("the body must be a JSON object")
    extra = sorted(set(data) - SEARCH_FIELDS)
    if extra:
        raise _invalid(f"extra fields not permitted: {', '.join(repr(k[:40]) for k in extra[:5])}")
    query, top_k = data.get("query"), data.get("top_k", DEFAULT_TOP_K)
    if not isinstance(query, str):
        raise _invalid("query: a string is required")
    if len(query) > MAX_QUERY_CHARS:
        raise _invalid(f"query: at most {MAX_QUERY_CHARS} characters")
    if type(top_k) is not int:
        raise _invalid("top_k: an integer is required")
    if top_k < MIN_TOP_K:
        raise _invalid(f"top_k is at least {MIN_TOP_K}")
    if top_k > max_top_k:
        raise _invalid(f"top_k is at most {max_top_k}")
    return SearchQuery(query, top_k)
