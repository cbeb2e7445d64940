"""POST /v1/search, answered the same way by each of the router's entry points: the protocol's
fast path (search_protocol.py), the ASGI front (front.py) and the FastAPI route (app.py).

Order matters: the key is checked from the headers before any of the body is read (an
unauthenticated client cannot make the router read a large body: 401, not 400 or 413), then the
body is read up to its small bound (request_body.py) and decoded through the contract
(search/contract.py), then searched. Every refusal is a SearchError; the caller renders it
(responses.py). The three steps are separate functions because the protocol runs them from its
parser's callbacks, as the headers and the body arrive, rather than from one coroutine.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request

from sluice.search.contract import MAX_SEARCH_BODY_BYTES, SearchRequest
from sluice.search.errors import QuerySyntaxError, SearchError, SearchErrorKind
from sluice.search.router.http.request_body import read_bounded
from sluice.search.router.runtime import RouterRuntime


def check_key(rt: RouterRuntime, headers: Mapping[str, str]) -> None:
    """SearchError(AUTHENTICATION) unless the headers carry a key that may search."""
    if not rt.auth.may_search(headers):
        raise SearchError(SearchErrorKind.AUTHENTICATION, "a valid API key is required")


def decode(rt: RouterRuntime, body: bytes) -> SearchRequest:
    return SearchRequest.decode(body, rt.cfg.search.max_top_k, rt.schema.ranges)


async def searched(rt: RouterRuntime, req: SearchRequest) -> bytes:
    """The answer's JSON (SearchResponse.json_bytes: the hits' stored fields spliced as stored)."""
    try:
        result = await rt.search(req)
    except QuerySyntaxError as exc:
        raise exc.as_search_error() from None
    return result.json_bytes()


async def answer_search(rt: RouterRuntime, request: Request) -> bytes:
    check_key(rt, request.headers)
    body = await read_bounded(request.scope["headers"], request.receive, MAX_SEARCH_BODY_BYTES, "a search body")
    return await searched(rt, decode(rt, body))
