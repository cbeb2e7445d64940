"""The FastAPI application: routes, error mapping, health/readiness and metrics endpoints."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from sluice import __version__
from sluice.api import admin, openapi_doc, status_page
from sluice.api.anthropic import batches, resume
from sluice.api.anthropic import routes as anthropic_routes
from sluice.api.auth import TIER_STATE
from sluice.api.errors import ApiError, api_error_for
from sluice.api.middleware import RequestContextMiddleware, error_response
from sluice.api.openai import completions_routes, lora_routes, tokenize_routes
from sluice.api.openai import routes as openai_routes
from sluice.gateway.authenticator import OpenAccess
from sluice.serving.errors import ServingError
from sluice.serving.metrics_scrape import scrape
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.request import VERSION_HEADER
from sluice.serving.runtime import ServingRuntime

log = logging.getLogger("sluice.api")
VERSION_HEADER_B = VERSION_HEADER.encode()
DESCRIPTION = (
    "Anthropic Messages and OpenAI chat completions, served by sluice. Errors use each wire format's own "
    "shape (`AnthropicError`, `OpenAIError`); streams are `text/event-stream`. See docs/API.md."
)


def _count_response(scope: Scope, status: int, rt: ServingRuntime, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """One count per response: route, status, the model version that served it (its response
    header; "none" when nothing was generated) and the caller's tier ("none" before auth) — all
    bounded label sets (no per-key or per-request labels)."""
    route = getattr(scope.get("route"), "path", "unmatched")
    version = next((v.decode() for k, v in headers if k == VERSION_HEADER_B), "none")
    tier = scope.get("state", {}).get(TIER_STATE, "none")
    rt.metrics.requests.labels(route, str(status), version, tier).inc()


def create_app(rt: ServingRuntime) -> FastAPI:
    docs = rt.settings.openapi
    app = FastAPI(
        title="sluice",
        version=__version__,
        description=DESCRIPTION,
        openapi_url="/openapi.json" if docs else None,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
    )
    app.state.runtime = rt
    openapi_doc.install(app, rt.settings, isinstance(rt.authenticator, OpenAccess))

    def respond(request: Request, err: ApiError) -> JSONResponse:
        return error_response(err, request.url.path, getattr(request.state, "request_id", None))

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return respond(request, exc)

    @app.exception_handler(ServingError)
    async def _refused(request: Request, exc: ServingError) -> JSONResponse:
        return respond(request, api_error_for(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = {404: f"Not found: {request.method} {request.url.path}", 405: "method not allowed"}.get(
            exc.status_code, str(exc.detail)
        )
        return respond(request, ApiError(exc.status_code, message, headers=dict(exc.headers or {})))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        path = ".".join(str(p) for p in err["loc"][1:]) or "request"
        return respond(request, ApiError(400, f"{path}: {err['msg']}"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Never a stack trace on the wire; the log has it, keyed by the request id.
        log.exception("unhandled error in %s (request %s)", request.url.path, getattr(request.state, "request_id", "?"))
        _count_response(request.scope, 500, rt)  # this response bypasses the inner middleware
        return respond(request, ApiError(500, "Internal server error"))

    @app.get("/health", openapi_extra=openapi_doc.HEALTH)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", openapi_extra=openapi_doc.READY)
    async def ready() -> JSONResponse:
        if rt.ready:
            return JSONResponse({"status": "ready", "model": rt.model_ids[0]})
        return JSONResponse({"status": rt.not_ready_reason()}, status_code=503)

    @app.get("/metrics", openapi_extra=openapi_doc.METRICS)
    async def metrics() -> Response:
        return Response(await scrape(rt), media_type="text/plain; version=0.0.4; charset=utf-8")

    pipeline = ServingPipeline(rt)
    app.include_router(batches.build_router(rt, pipeline))  # before /v1/messages/{...} routes
    app.include_router(anthropic_routes.build_router(rt, pipeline))
    app.include_router(resume.build_router(rt))
    app.include_router(openai_routes.build_router(rt, pipeline))
    app.include_router(completions_routes.build_router(rt, pipeline))
    app.include_router(tokenize_routes.build_router(rt, pipeline))
    admin_guard = admin.guard_for(rt)
    app.include_router(admin.build_router(rt, admin_guard))
    app.include_router(lora_routes.build_router(rt, admin_guard))
    app.include_router(status_page.build_router(rt, admin_guard))
    app.add_middleware(
        RequestContextMiddleware,
        max_body_bytes=rt.settings.max_body_bytes,
        body_timeout_s=rt.settings.body_timeout_s,
        on_response=lambda scope, status, headers: _count_response(scope, status, rt, headers),
    )
    return app
