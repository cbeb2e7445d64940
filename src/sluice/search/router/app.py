"""The search router's HTTP API (FastAPI; the OpenAPI document is at /openapi.json, /docs).

    POST   /v1/search                   {"query", "top_k"} → hits, shards answered, partial, took_ms
    POST   /v1/search/documents         NDJSON bulk upsert → accepted, per-line errors, shard entries
    DELETE /v1/search/documents/{id}    delete on the shard(s) that may hold it
    GET    /health, /ready, /metrics, /v1/search/status (JSON), /status (the status page)

Errors are `{"error": {"type", "message"}}`: 400 invalid (a query syntax error names its
position), 401 no or wrong key, 413 too large, 503 a shard cannot take a write.
"""

from __future__ import annotations

import time
from pathlib import Path as Path_
from typing import Any

from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import generate_latest
from pydantic import BaseModel, Field

from sluice.search.errors import DocumentError, QuerySyntaxError
from sluice.search.index.schema import check_id
from sluice.search.router.bulk import plan_bulk
from sluice.search.router.runtime import RouterRuntime
from sluice.search.router.search_request import SearchRequest

MAX_BULK_BYTES = 64 << 20
STATUS_PAGE = Path_(__file__).with_name("static") / "status.html"


class SearchHit(BaseModel):
    id: str
    score: float
    fields: dict[str, Any]


class SearchResponse(BaseModel):
    hits: list[SearchHit]
    shards: int
    shards_answered: int
    partial: bool = Field(..., description="true when a shard missed its deadline or had no replica")
    failed_shards: dict[str, str]
    took_ms: float
    cached: bool


class BulkError(BaseModel):
    line: int
    message: str


class BulkResponse(BaseModel):
    accepted: int
    errors: list[BulkError]
    written: dict[str, int] = Field(..., description="shard → the write-log entry holding this batch")
    failed: dict[str, str]


def _err(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message, **extra}}, status_code=status)


def create_router_app(rt: RouterRuntime) -> FastAPI:
    app = FastAPI(title="sluice search", version="1",
                  description="Distributed full-text search: sharded Xapian indexes, exact merged BM25 scores. "
                              "See docs/SEARCH.md.")

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _err(400, "invalid_request_error", f"{where}: {first.get('msg', 'invalid')}" if where else "invalid body")

    @app.exception_handler(QuerySyntaxError)
    async def _syntax(request: Request, exc: QuerySyntaxError) -> JSONResponse:
        return _err(400, "query_syntax_error", str(exc), position=exc.position)

    @app.exception_handler(DocumentError)
    async def _document(request: Request, exc: DocumentError) -> JSONResponse:
        return _err(400, "invalid_request_error", str(exc))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        why = rt.not_ready_reason()
        return JSONResponse({"status": "ready"} if why is None else {"status": why}, status_code=200 if why is None else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(rt.metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/status", response_class=HTMLResponse, include_in_schema=False)
    async def status_page() -> HTMLResponse:
        return HTMLResponse(STATUS_PAGE.read_text())

    @app.get("/v1/search/status")
    async def status() -> dict[str, Any]:
        return rt.status()

    @app.post("/v1/search", response_model=SearchResponse,
              responses={400: {"description": "invalid request or query syntax error (with its position)"},
                         401: {"description": "an API key is configured and none or a wrong one was sent"}})
    async def search(req: SearchRequest, request: Request) -> Any:
        if not rt.auth.may_search(request):
            return _err(401, "authentication_error", "a valid API key is required")
        if req.top_k > rt.cfg.search.max_top_k:
            return _err(400, "invalid_request_error", f"top_k is at most {rt.cfg.search.max_top_k}")
        result = await rt.searcher.search(req.query, req.top_k)
        # a Response as is: FastAPI would otherwise re-validate it against SearchResponse (the
        # model documents it), which cost as much router CPU as a shard round trip
        return JSONResponse(result.to_json())

    @app.post("/v1/search/documents", response_model=BulkResponse,
              openapi_extra={"requestBody": {"required": True, "content": {"application/x-ndjson": {
                  "schema": {"type": "string", "description": "one JSON object per line: {\"id\": ..., fields...}"}}}}},
              responses={401: {"description": "an ingest key is configured and none or a wrong one was sent"},
                         413: {"description": "body too large"},
                         503: {"description": "a shard had no replica to take its part (the body says which)"}})
    async def upsert(request: Request) -> Any:
        if not rt.cfg.search.accept_writes:
            return _err(405, "query_only_router", "this router is query-only (accept_writes = false); "
                                                  "send writes to the writing router")
        if not rt.auth.may_write(request):
            return _err(401, "authentication_error", "a valid ingest key is required")
        body = await request.body()
        if len(body) > MAX_BULK_BYTES:
            return _err(413, "request_too_large", f"a bulk request is at most {MAX_BULK_BYTES} bytes")
        plan = plan_bulk(body, rt.topo)
        rt.metrics.bad_lines.inc(len(plan.errors))
        out = await rt.writer.write(plan.batches)
        rt.metrics.documents.labels("upsert").inc(plan.accepted if not out["failed"] else 0)
        payload = {"accepted": plan.accepted, "errors": plan.errors, **out}
        return JSONResponse(payload, status_code=503 if out["failed"] else 200)

    @app.delete("/v1/search/documents/{doc_id:path}",
                responses={401: {"description": "an ingest key is configured and none or a wrong one was sent"},
                           503: {"description": "a shard had no replica to take the delete"}})
    async def delete(request: Request, doc_id: str = Path(..., max_length=200)) -> Any:
        if not rt.cfg.search.accept_writes:
            return _err(405, "query_only_router", "this router is query-only (accept_writes = false)")
        if not rt.auth.may_write(request):
            return _err(401, "authentication_error", "a valid ingest key is required")
        check_id(doc_id)
        shards = ([i for i, s in enumerate(rt.topo.shards) if s.cold_url is None] if rt.topo.moves_documents
                  else [rt.topo.shard_for_id(doc_id)])
        out = await rt.writer.write({i: [{"op": "delete", "id": doc_id}] for i in shards})
        rt.metrics.documents.labels("delete").inc(0 if out["failed"] else 1)
        return JSONResponse({"deleted": doc_id, **out}, status_code=503 if out["failed"] else 200)

    return app
