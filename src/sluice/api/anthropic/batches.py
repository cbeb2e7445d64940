"""Message Batches (`/v1/messages/batches`, reference §8.3): offline work in the lowest band.

A batch's requests run through the gateway's admission queue in the `batch` tier's band, so
interactive traffic always goes first; a few run at a time per batch. Batches are per tenant
(another tenant's id is a 404) and kept in memory for `batch_retention_s` after they end.
Rate limits are not charged per batch item (Anthropic gives batches their own limits); the
create call itself is authenticated and counted like any request.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from sluice.api.anthropic.routes import (
    ROUTE,
    collect_message,
    describe_validation_error,
    parse_body,
    prepare_message,
)
from sluice.api.anthropic.schema import MessagesRequest
from sluice.api.anthropic.prompt import safety_texts
from sluice.serving.safety_check import check_request_safety
from sluice.api.auth import Principal, require_principal
from sluice.api.errors import ApiError, bad_request
from sluice.serving.generation import generate
from sluice.api.ids import new_id
from sluice.api.pagination import page
from sluice.serving.runtime import ServingRuntime
from sluice.gateway.admission import Overloaded
from sluice.gateway.principal import Principal as GatewayPrincipal
from sluice.gateway.tiers import DEFAULT_TIERS

MAX_REQUESTS = 100_000
CUSTOM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PER_BATCH_CONCURRENCY = 4
EXPIRY_S = 24 * 3600


class BatchItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    custom_id: str
    params: dict[str, Any]


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: list[BatchItem] = Field(min_length=1, max_length=MAX_REQUESTS)


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Batch:
    id: str
    tenant: str
    items: list[tuple[str, MessagesRequest]]
    created_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    cancel_initiated_at: float | None = None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    task: asyncio.Task | None = None

    @property
    def status(self) -> str:
        if self.ended_at is not None:
            return "ended"
        return "canceling" if self.cancel_initiated_at is not None else "in_progress"

    def to_json(self, base_url: str) -> dict[str, Any]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if self.ended_at is None:
            counts["processing"] = len(self.items)  # counts move only when the whole batch ends
        else:
            for r in self.results.values():
                counts[r["type"]] += 1
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.status,
            "request_counts": counts,
            "created_at": _iso(self.created_at),
            "expires_at": _iso(self.created_at + EXPIRY_S),
            "ended_at": _iso(self.ended_at),
            "cancel_initiated_at": _iso(self.cancel_initiated_at),
            "archived_at": None,
            "results_url": f"{base_url}/v1/messages/batches/{self.id}/results" if self.ended_at else None,
        }


class BatchStore:
    def __init__(self) -> None:
        self.batches: dict[str, Batch] = {}

    def get(self, principal: Principal, batch_id: str) -> Batch:
        batch = self.batches.get(batch_id)
        if batch is None or batch.tenant != principal.tenant:  # another tenant's batch does not exist
            raise ApiError(404, f"batch {batch_id} not found", type="not_found_error")
        return batch

    def for_tenant(self, tenant: str) -> list[Batch]:
        return sorted((b for b in self.batches.values() if b.tenant == tenant), key=lambda b: b.created_at, reverse=True)


async def _run_item(rt: ServingRuntime, principal: Principal, body: MessagesRequest) -> dict[str, Any]:
    batch_tier = DEFAULT_TIERS["batch"]
    # batch items run in the batch band, uncharged by per-minute limits, with a day to wait
    runner = GatewayPrincipal(tenant=principal.tenant, tier="batch", key_id=principal.key_id,
                              priority=batch_tier.priority, limits=None, queue_deadline_s=EXPIRY_S)
    try:
        gen, plan = await prepare_message(rt, runner, body, "2023-06-01")
        guard = check_request_safety(rt, runner, safety_texts(body), gen.request_id)
        assert rt.gateway is not None
        session = await rt.gateway.open(runner, len(gen.prompt_token_ids), gen.sampling.max_tokens,
                                        lambda: generate(rt, gen, ROUTE), band=batch_tier.priority)
        try:
            message = await collect_message(rt, session, gen, body.model, plan, guard)
        finally:
            await session.close()
        message["usage"]["service_tier"] = "batch"
        return {"type": "succeeded", "message": message}
    except ApiError as exc:
        return {"type": "errored", "error": exc.anthropic_body(None)}
    except Overloaded as exc:
        return {"type": "errored", "error": ApiError(529, f"Overloaded: {exc.reason}").anthropic_body(None)}


async def _run_batch(rt: ServingRuntime, principal: Principal, batch: Batch) -> None:
    queue: asyncio.Queue = asyncio.Queue()
    for item in batch.items:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty() and batch.cancel_initiated_at is None:
            custom_id, body = queue.get_nowait()
            batch.results[custom_id] = await _run_item(rt, principal, body)

    try:
        await asyncio.gather(*(worker() for _ in range(PER_BATCH_CONCURRENCY)))
    finally:
        for custom_id, _ in batch.items:
            batch.results.setdefault(custom_id, {"type": "canceled"})
        batch.ended_at = time.time()


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def build_router(rt: ServingRuntime, store: BatchStore) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages/batches")
    async def create(request: Request) -> Any:
        principal = await require_principal(request, rt.authenticator)
        spec = parse_body(await request.body(), BatchCreate, False)
        rt.require_ready()
        seen: set[str] = set()
        items: list[tuple[str, MessagesRequest]] = []
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
            except Exception as exc:  # pydantic ValidationError: say which item
                message = describe_validation_error(exc) if hasattr(exc, "errors") else str(exc)
                raise bad_request(f"requests.{i}.params.{message}") from None
            rt.check_model(body.model)
            items.append((item.custom_id, body))
        batch = Batch(new_id("msgbatch"), principal.tenant, items)
        store.batches[batch.id] = batch
        batch.task = asyncio.get_running_loop().create_task(_run_batch(rt, principal, batch))
        return batch.to_json(_base_url(request))

    @router.get("/v1/messages/batches")
    async def list_batches(request: Request, limit: int = 20, after_id: str | None = None, before_id: str | None = None) -> Any:
        principal = await require_principal(request, rt.authenticator)
        ids = [b.id for b in store.for_tenant(principal.tenant)]
        base = _base_url(request)
        return page(ids, limit, after_id, before_id, lambda i: store.batches[i].to_json(base))

    @router.get("/v1/messages/batches/{batch_id}")
    async def retrieve(request: Request, batch_id: str) -> Any:
        principal = await require_principal(request, rt.authenticator)
        return store.get(principal, batch_id).to_json(_base_url(request))

    @router.post("/v1/messages/batches/{batch_id}/cancel")
    async def cancel(request: Request, batch_id: str) -> Any:
        principal = await require_principal(request, rt.authenticator)
        batch = store.get(principal, batch_id)
        if batch.ended_at is None and batch.cancel_initiated_at is None:
            batch.cancel_initiated_at = time.time()  # running items finish; queued ones are canceled
        return batch.to_json(_base_url(request))

    @router.delete("/v1/messages/batches/{batch_id}")
    async def delete(request: Request, batch_id: str) -> Any:
        principal = await require_principal(request, rt.authenticator)
        batch = store.get(principal, batch_id)
        if batch.ended_at is None:
            raise bad_request(f"batch {batch_id} has not ended; cancel it first")
        del store.batches[batch_id]
        return {"id": batch_id, "type": "message_batch_deleted"}

    @router.get("/v1/messages/batches/{batch_id}/results")
    async def results(request: Request, batch_id: str) -> Response:
        principal = await require_principal(request, rt.authenticator)
        batch = store.get(principal, batch_id)
        if batch.ended_at is None:
            raise bad_request(f"batch {batch_id} has not ended yet: its results are not ready")

        def lines():
            for custom_id, _ in batch.items:
                yield json.dumps({"custom_id": custom_id, "result": batch.results[custom_id]}, separators=(",", ":")) + "\n"

        return StreamingResponse(lines(), media_type="application/binary")

    return router

