"""The search router's HTTP API (FastAPI; the OpenAPI document is at /openapi.json, /docs).

    POST   /v1/search                   {"query", "top_k"} → hits, shards answered, partial, took_ms
    POST   /v1/search/documents         NDJSON bulk upsert → accepted, per-line errors, shard entries
    DELETE /v1/search/documents/{id}    delete on the shard(s) that may hold it
    GET    /health, /ready, /metrics, /v1/search/status (JSON), /status (the status page)

Errors are `{"error": {"type", "message"}}` with the status of their kind (errors.py: one map),
FastAPI's own refusals (validation, 404, 405) and any unexpected exception (500, with
`connection: close`) included. A write that reaches the shards answers its own body: 200, or
503 naming the shards whose part was not written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path as Path_
from typing import Any

from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.search.errors import DocumentError, QuerySyntaxError, SearchError, SearchErrorKind
from sluice.search.router.http.openapi_models import BulkResponse, SearchResponseModel, errors, search_body_schema
from sluice.search.router.http.request_body import read_bounded
from sluice.search.router.http.responses import error_response as render_error
from sluice.search.router.http.responses import internal_error
from sluice.search.router.http.search_endpoint import answer_search
from sluice.search.router.runtime import RouterRuntime
from sluice.search.router.writes.bulk import MAX_BULK_BYTES

STATUS_PAGE = Path_(__file__).with_name("static") / "status.html"
log = logging.getLogger("sluice.search.router")


def create_router_app(rt: RouterRuntime) -> FastAPI:
    app = FastAPI(
        title="sluice search",
        version="1",
        description="Distributed full-text search: sharded Xapian indexes, exact merged BM25 scores. "
        "See docs/SEARCH.md.",
    )
    _add_error_handlers(app, rt.metrics.refused)
    _add_service_routes(app, rt)
    _add_search_route(app, rt)
    _add_write_routes(app, rt)
    return app


def _add_error_handlers(app: FastAPI, count: Callable[[str], None]) -> None:
    """Every refusal in the one error shape (errors.py), FastAPI's own included, and counted by
    its type (sluice_search_errors_total, the status JSON)."""

    def error_response(err: SearchError) -> Response:
        count(err.kind.value)
        return render_error(err)

    @app.exception_handler(SearchError)
    async def _search_error(request: Request, exc: SearchError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid')}" if where else "invalid body"
        return error_response(SearchError(SearchErrorKind.INVALID_REQUEST, message))

    @app.exception_handler(QuerySyntaxError)
    async def _syntax(request: Request, exc: QuerySyntaxError) -> Response:
        return error_response(exc.as_search_error())

    @app.exception_handler(DocumentError)
    async def _document(request: Request, exc: DocumentError) -> Response:
        return error_response(SearchError(SearchErrorKind.INVALID_REQUEST, str(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        kind = {404: SearchErrorKind.NOT_FOUND, 405: SearchErrorKind.METHOD_NOT_ALLOWED}.get(
            exc.status_code, SearchErrorKind.INVALID_REQUEST
        )
        return error_response(SearchError(kind, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this answer; the ASGI front logs it (http/front.py)
        return error_response(internal_error())


def _add_service_routes(app: FastAPI, rt: RouterRuntime) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", responses={503: {"description": 'starting, or a shard has no replica up ({"status": why})'}})
    async def ready() -> JSONResponse:
        why = rt.not_ready_reason()
        return JSONResponse({"status": "ready" if why is None else why}, status_code=200 if why is None else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(generate_latest(rt.metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/status", response_class=HTMLResponse, include_in_schema=False)
    async def status_page() -> HTMLResponse:
        return HTMLResponse(STATUS_PAGE.read_text())

    @app.get("/v1/search/status")
    async def status() -> dict[str, Any]:
        return rt.status()


def _add_search_route(app: FastAPI, rt: RouterRuntime) -> None:
    @app.post(
        "/v1/search",
        response_model=SearchResponseModel,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": search_body_schema(rt.cfg.search.max_top_k)}},
            }
        },
        responses=errors(
            s400="invalid request, or a query syntax error (with its position)",
            s401="an API key is configured and none or a wrong one was sent",
            s413="a body over 64 KiB (refused before it is read whole)",
        ),
    )
    async def search(request: Request) -> Any:
        # the protocol (search_protocol.py) or the ASGI front answers this in production; all
        # three decode through search_endpoint.py.
        # A Response as is: FastAPI would otherwise re-validate it against SearchResponse
        return Response(await answer_search(rt, request), media_type="application/json")


def _add_write_routes(app: FastAPI, rt: RouterRuntime) -> None:
    def writable(request: Request, what: str) -> None:
        if not rt.cfg.search.accept_writes:
            raise SearchError(
                SearchErrorKind.QUERY_ONLY,
                f"this router is query-only (accept_writes = false); send {what} to the writing router",
            )
        if not rt.auth.may_write(request):
            raise SearchError(SearchErrorKind.AUTHENTICATION, "a valid ingest key is required")

    @app.post(
        "/v1/search/documents",
        response_model=BulkResponse,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/x-ndjson": {
                        "schema": {"type": "string", "description": 'one JSON object per line: {"id": ..., fields...}'}
                    }
                },
            }
        },
        responses={
            **errors(
                s400="more than 100,000 lines",
                s401="an ingest key is configured and none or a wrong one was sent",
                s405="a query-only router",
                s413="a body over 64 MiB (refused as soon as it passes that, never read whole)",
            ),
            503: {
                "model": BulkResponse,
                "description": "a shard had no replica to take its part (`written` and `failed` say which)",
            },
        },
    )
    async def upsert(request: Request) -> Any:
        writable(request, "writes")  # before the body is read
        body = await read_bounded(request.scope["headers"], request.receive, MAX_BULK_BYTES, "a bulk request")
        answer = await rt.write(body)
        return JSONResponse(answer.to_json(), status_code=503 if answer.outcome.failed else 200)

    @app.delete(
        "/v1/search/documents/{doc_id:path}",
        responses={
            **errors(
                s400="an id that is not 1-200 bytes",
                s401="an ingest key is configured and none or a wrong one was sent",
                s404="a path with a line break, which no id holds (no route matches it)",
                s405="a query-only router",
            ),
            503: {"description": "a shard had no replica to take the delete"},
        },
    )
    async def delete(request: Request, doc_id: str = Path(..., max_length=200)) -> Any:
        writable(request, "deletes")
        answer = await rt.delete(doc_id)
        return JSONResponse(answer.to_json(), status_code=503 if answer.outcome.failed else 200)
