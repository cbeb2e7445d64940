"""Message Batches over HTTP (`/v1/messages/batches`, reference §8.3).

Each item is validated at create time like a Messages request, then runs through the same
serving pipeline as live traffic (serving/batches.py runs them): as the batch tier of the
configured tiers — its band, so interactive traffic always goes first, and its queue deadline —
and uncharged by per-minute limits (Anthropic gives batches their own limits); the create call
itself is authenticated and counted like any request. Batches belong to the creating tenant
(another tenant's id is a 404) and are kept `batch_retention_s` after they end.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from sluice.api import openapi_doc as doc
from sluice.api.anthropic.batch_schema import BatchCreate
from sluice.api.anthropic.convert import VERSIONS, describe_validation_error, parse_body, to_serving_request
from sluice.api.anthropic.prompt import to_conversation
from sluice.api.anthropic.render import plan_for, render_message
from sluice.api.anthropic.schema import MessagesRequest
from sluice.api.auth import require_principal
from sluice.api.errors import ApiError, api_error_for, bad_request
from sluice.api.ids import new_id
from sluice.api.pagination import page
from sluice.gateway.principal import Principal
from sluice.gateway.tiers import load_tiers
from sluice.serving.batches import Batch, BatchStore, Result, run_batch
from sluice.serving.errors import ServingError
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.request import Route
from sluice.serving.runtime import ServingRuntime

log = logging.getLogger("sluice.api")
CUSTOM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PER_BATCH_CONCURRENCY = 4
EXPIRY_S = 24 * 3600  # Anthropic's: a batch not done within a day expires


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def batch_json(batch: Batch, base_url: str) -> dict[str, Any]:
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    if batch.ended_at is None:
        counts["processing"] = len(batch.items)  # counts move only when the whole batch ends
    else:
        for r in batch.results.values():
            counts[r["type"]] += 1
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": batch.status.value,
        "request_counts": counts,
        "created_at": _iso(batch.created_at),
        "expires_at": _iso(batch.created_at + EXPIRY_S),
        "ended_at": _iso(batch.ended_at),
        "cancel_initiated_at": _iso(batch.cancel_initiated_at),
        "archived_at": None,
        "results_url": f"{base_url}/v1/messages/batches/{batch.id}/results" if batch.ended_at else None,
    }


def _items(spec: BatchCreate) -> list[tuple[str, Any]]:
    seen: set[str] = set()
    items: list[tuple[str, Any]] = []
    for i, item in enumerate(spec.requests):
        if not CUSTOM_ID.match(item.custom_id):
            raise bad_request(f"requests.{i}.custom_id: must be 1-64 characters of [A-Za-z0-9_-]")
        if item.custom_id in seen:
            raise bad_request(f"requests.{i}.custom_id: {item.custom_id!r} is not unique in the batch")
        seen.add(item.custom_id)
        if item.params.get("stream"):
            raise bad_request(f"requests.{i}.params.stream: batch requests cannot stream")
        try:
            body = MessagesRequest.model_validate(item.params)
            to_conversation(
                body
            )  # the conversation rules too (empty text, roles): a 400 now, not an errored result later
        except ValidationError as exc:  # say which item
            raise bad_request(f"requests.{i}.params.{describe_validation_error(exc)}") from None
        except ServingError as exc:
            raise bad_request(f"requests.{i}.params.{exc.message}") from None
        items.append((item.custom_id, body))
    return items


class BatchExecutor:
    """Runs one batch item through the serving pipeline as the configured batch tier: its band
    and queue deadline, uncharged by per-minute limits."""

    def __init__(self, rt: ServingRuntime, pipeline: ServingPipeline):
        self.rt, self.pipeline = rt, pipeline
        self.tier = load_tiers(rt.settings.tiers)["batch"]

    def runner_for(self, principal: Principal) -> Principal:
        t = self.tier
        return replace(principal, tier=t.name, priority=t.priority, limits=None, queue_deadline_s=t.queue_deadline_s)

    async def execute(self, principal: Principal, body: MessagesRequest) -> Result:
        try:
            sreq = to_serving_request(body, principal, new_id("msg"), VERSIONS[0], self.rt.settings, route=Route.BATCH)
            sreq.band = principal.priority
            gen = await self.pipeline.start(sreq)
            message = render_message(gen, await gen.collect(), plan_for(gen))
            message["usage"]["service_tier"] = "batch"
            return {"type": "succeeded", "message": message}
        except ServingError as exc:
            return {"type": "errored", "error": api_error_for(exc).anthropic_body(None)}
        except ApiError as exc:
            return {"type": "errored", "error": exc.anthropic_body(None)}
        except Exception:  # one item's fault must not end the batch: logged, reported as an error
            log.exception("batch item failed")
            return {"type": "errored", "error": ApiError(500, "Internal server error").anthropic_body(None)}


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def build_router(rt: ServingRuntime, pipeline: ServingPipeline) -> APIRouter:
    router = APIRouter()
    store = BatchStore(rt.settings.batch_retention_s, rt.settings.max_batches)
    _collection_routes(router, rt, store, BatchExecutor(rt, pipeline))
    _batch_routes(router, rt, store)
    return router


def _collection_routes(router: APIRouter, rt: ServingRuntime, store: BatchStore, executor: BatchExecutor) -> None:
    """Create a batch (it starts running at once) and list the tenant's batches."""

    @router.post(
        "/v1/messages/batches",
        openapi_extra=doc.operation(
            doc.Family.ANTHROPIC, body="BatchCreate", ok="MessageBatch", errors=(*doc.ENGINE, 429)
        ),
    )
    async def create(request: Request) -> Any:
        principal = await require_principal(request, rt.authenticator)
        spec = parse_body(await request.body(), BatchCreate, False)
        rt.require_fleet()
        items = _items(spec)
        for _, body in items:
            rt.check_model(body.model)
        batch = Batch(new_id("msgbatch"), principal.tenant, items)
        store.add(batch)
        runner = executor.runner_for(principal)
        batch.task = rt.keep_task(run_batch(batch, lambda body: executor.execute(runner, body), PER_BATCH_CONCURRENCY))
        return batch_json(batch, _base_url(request))

    @router.get("/v1/messages/batches", openapi_extra=doc.operation(doc.Family.ANTHROPIC, ok="MessageBatchList"))
    async def list_batches(
        request: Request, limit: int = doc.limit(), after_id: str | None = None, before_id: str | None = None
    ) -> Any:
        principal = await require_principal(request, rt.authenticator)
        batches = {b.id: b for b in store.for_tenant(principal.tenant)}
        base = _base_url(request)
        return page(list(batches), limit, after_id, before_id, lambda i: batch_json(batches[i], base))


def _batch_routes(router: APIRouter, rt: ServingRuntime, store: BatchStore) -> None:
    """One batch of the tenant's: retrieve, cancel, delete, its results. Each looks the id up
    among the caller's own batches (another tenant's id is a 404, as an unknown one), and its
    document says so."""

    def one_batch(ok: str | None = None, media: str | None = None) -> dict[str, Any]:
        return doc.operation(doc.Family.ANTHROPIC, ok=ok, media=media, errors=doc.LOOKUP)

    async def tenant_batch(request: Request, batch_id: str) -> Batch:
        principal = await require_principal(request, rt.authenticator)
        return store.get(principal.tenant, batch_id)

    @router.get("/v1/messages/batches/{batch_id}", openapi_extra=one_batch(ok="MessageBatch"))
    async def retrieve(request: Request, batch_id: str) -> Any:
        return batch_json(await tenant_batch(request, batch_id), _base_url(request))

    @router.post("/v1/messages/batches/{batch_id}/cancel", openapi_extra=one_batch(ok="MessageBatch"))
    async def cancel(request: Request, batch_id: str) -> Any:
        batch = await tenant_batch(request, batch_id)
        batch.cancel(time.time())
        return batch_json(batch, _base_url(request))

    @router.delete("/v1/messages/batches/{batch_id}", openapi_extra=one_batch(ok="DeletedBatch"))
    async def delete(request: Request, batch_id: str) -> Any:
        principal = await require_principal(request, rt.authenticator)
        store.delete(principal.tenant, batch_id)
        return {"id": batch_id, "type": "message_batch_deleted"}

    @router.get("/v1/messages/batches/{batch_id}/results", openapi_extra=one_batch(media="application/binary"))
    async def results(request: Request, batch_id: str) -> Response:
        batch = await tenant_batch(request, batch_id)
        if batch.ended_at is None:
            raise bad_request(f"batch {batch_id} has not ended yet: its results are not ready")

        def lines() -> Iterator[str]:
            for custom_id, _ in batch.items:
                yield (
                    json.dumps({"custom_id": custom_id, "result": batch.results[custom_id]}, separators=(",", ":"))
                    + "\n"
                )

        return StreamingResponse(lines(), media_type="application/binary")
