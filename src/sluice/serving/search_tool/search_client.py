"""One search tool call → the fleet's search service (`POST /v1/search`) → its results.

Serving never imports the search package: the service is reached over HTTP only, with the
fleet's own key (`[search].api_key_env`), never a client's, so a tenant reaches the index only
through this tool and only as the fleet allows. Every failure — the service down, slower than
`timeout_s` (connect to answer), answering an error, answering nonsense — becomes a
`SearchToolError` the model and the client read as the call's result; nothing here raises into
the request. Logs name the failure, never the query (it is prompt text).
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from typing import Any

import httpx

from sluice.routing.fleet_file.search_service import SearchServiceSpec
from sluice.serving.search_tool.domains import DomainRules
from sluice.serving.search_tool.search_error import SearchToolError
from sluice.tool_types import SearchResult

log = logging.getLogger(__name__)
SOURCE_SCHEME = "sluice-search:"  # a hit's source when its document has no `url` field
TITLE_FIELD, URL_FIELD, AGE_FIELD = "title", "url", "page_age"
MAX_SNIPPET_CHARS = 2000  # the search API's bound on `snippet_chars` (docs/SEARCH.md)
# the hybrid ranking that won on Debian's descriptions (docs/BENCHMARKS.md, bench/search/search_dense_quality.py):
# recall@10 and MRR@10 above both lexical and dense alone
_HYBRID_WINDOW = 50
HYBRID = {"fusion": "weighted", "dense_weight": 0.3, "window": _HYBRID_WINDOW}
_MARK = re.compile(r"</?b>")


def snippet_chars(service: SearchServiceSpec) -> int:
    return min(service.max_result_chars, MAX_SNIPPET_CHARS)


def _fields(hit: dict[str, Any]) -> dict[str, Any]:
    """A hit's stored fields ({} when it has none or they are not an object)."""
    fields = hit.get("fields")
    return fields if isinstance(fields, dict) else {}


def hit_result(hit: dict[str, Any], max_chars: int) -> SearchResult:
    """A hit `{id, score, fields, snippet}` as the model reads it: its `title` field (else its
    id), its `url` field (else `sluice-search:<id>`), its `page_age` field, and its snippet —
    the passage where the query matched, as plain text (the service marks matched words and
    escapes the text for HTML; the model reads neither) — cut to `max_chars`. Never the
    document's whole stored text."""
    doc_id = str(hit.get("id", ""))
    fields = _fields(hit)
    title, url, age = fields.get(TITLE_FIELD), fields.get(URL_FIELD), fields.get(AGE_FIELD)
    snippet = hit.get("snippet")
    return SearchResult(
        source=url if isinstance(url, str) and url else SOURCE_SCHEME + doc_id,
        title=title if isinstance(title, str) and title else doc_id,
        text=html.unescape(_MARK.sub("", snippet))[:max_chars] if isinstance(snippet, str) else "",
        page_age=age if isinstance(age, str) and age else None,
    )


def _refusal(status: int, body: Any) -> SearchToolError:
    if status == 429:
        return SearchToolError.TOO_MANY_REQUESTS
    if status != 400:
        return SearchToolError.UNAVAILABLE  # 5xx, or 401/403: our key is the fleet's problem, not the model's
    message = str((body.get("error") or {}).get("message", "")) if isinstance(body, dict) else ""
    bounded = any(w in message for w in ("at most", "too long", "too many"))
    return SearchToolError.QUERY_TOO_LONG if bounded else SearchToolError.INVALID_INPUT


def search_body(service: SearchServiceSpec, query: str, rules: DomainRules) -> dict[str, Any]:
    """`POST /v1/search`'s body: the fleet's top_k, snippet length and mode (hybrid: the measured
    winner's fusion), and the domain part of the rules as a filter (with rules on paths, which only
    the check after can apply, a few more hits are asked for so that the page stays full)."""
    top_k = max(service.top_k, min(4 * service.top_k, 50)) if rules.has_paths else service.top_k
    body: dict[str, Any] = {
        "query": query,
        "top_k": top_k,
        "snippet_chars": snippet_chars(service),
        "mode": service.mode,
    }
    if service.mode == "hybrid":
        body["hybrid"] = {**HYBRID, "window": max(_HYBRID_WINDOW, top_k)}
    flt = rules.service_filter()
    if flt is not None:
        body["filter"] = flt
    return body


def _permitted(hits: list[Any], rules: DomainRules, service: SearchServiceSpec) -> list[SearchResult]:
    out = []
    for h in hits:
        if not isinstance(h, dict):
            continue
        fields = _fields(h)
        url = fields.get(URL_FIELD)
        if rules and not rules.permits(url if isinstance(url, str) else None):
            continue  # the service's filter is not trusted alone: a blocked hit never reaches the model
        out.append(hit_result(h, service.max_result_chars))
    return out[: service.top_k]


async def search(
    service: SearchServiceSpec,
    query: str,
    transport: httpx.AsyncBaseTransport | None = None,
    rules: DomainRules = DomainRules(),
) -> list[SearchResult] | SearchToolError:
    """The service's top hits for `query` that `rules` permit, or why there are none
    (`transport`: tests')."""
    key = service.api_key()
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        async with (
            asyncio.timeout(service.timeout_s),
            httpx.AsyncClient(timeout=service.timeout_s, transport=transport) as client,
        ):
            r = await client.post(f"{service.url}/v1/search", json=search_body(service, query, rules), headers=headers)
    except (TimeoutError, httpx.TimeoutException):  # the whole call, however the time went
        log.warning("search tool: the search service did not answer within %.1fs", service.timeout_s)
        return SearchToolError.UNAVAILABLE
    except httpx.HTTPError as exc:
        log.warning("search tool: the search service is unreachable (%s)", type(exc).__name__)
        return SearchToolError.UNAVAILABLE
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code != 200:
        log.warning("search tool: the search service answered %d", r.status_code)
        return _refusal(r.status_code, body)
    hits = body.get("hits") if isinstance(body, dict) else None
    if not isinstance(hits, list):
        log.warning("search tool: the search service's answer has no hits list")
        return SearchToolError.UNAVAILABLE
    return _permitted(hits, rules, service)
