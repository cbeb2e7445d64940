"""POST /v1/search, answered the same way by both of the router's entry points.

Order matters: the key is checked from the headers before any of the body is read (an
unauthenticated client cannot make the router read a large body: 401, not 400 or 413), then the
body is read up to its small bound (request_body.py) and decoded through the contract
(search/contract.py), then searched. Every refusal is a SearchError; the caller renders it (responses.py).
"""

from __future__ import annotations

from starlette.requests import Request

from sluice.search.contract import MAX_SEARCH_BODY_BYTES, SearchRequest
from sluice.search.errors import QuerySyntaxError, SearchError, SearchErrorKind
from sluice.search.router.http.request_body import read_bounded
from sluice.search.router.runtime import RouterRuntime


async def answer_search(rt: RouterRuntime, request: Request) -> bytes:
    """The answer's JSON (SearchResponse.json_bytes: the hits' stored fields spliced as stored)."""
    if not rt.auth.may_search(request):
        raise SearchError(SearchErrorKind.AUTHENTICATION, "a valid API key is required")
    body = await read_bounded(request.scope["headers"], request.receive, MAX_SEARCH_BODY_BYTES, "a search body")
    req = SearchRequest.decode(body, rt.cfg.search.max_top_k, rt.schema.ranges)
    try:
        result = await rt.search(req)
    except QuerySyntaxError as exc:
        raise exc.as_search_error() from None
    return result.json_bytes()
