"""Batches of requests run offline: the store (per tenant, with retention) and the runner.

Items are opaque here (a wire format parses them and renders their results); the runner runs a
few of each batch at a time through `execute`, which takes them down the same serving pipeline
as live requests — in the batch tier's band, so interactive traffic always goes first.

Retention: a batch is kept `retention_s` after it ends (then evicted), and the store holds at
most `max_batches`; when it is full, the oldest ended batch is evicted first, and when every
batch is still running a new one is refused (RATE_LIMITED) rather than forgetting work.
Batches live in memory: a restart forgets them (documented).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.serving.errors import ErrorKind, ServingError

Result = dict[str, Any]  # a rendered per-item result: {"type": "succeeded" | "errored" | "canceled", …}


class BatchStatus(str, enum.Enum):
    IN_PROGRESS = "in_progress"
    CANCELING = "canceling"
    ENDED = "ended"


@dataclass
class Batch:
    id: str
    tenant: str
    items: list[tuple[str, Any]]  # (custom_id, parsed item)
    created_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    cancel_initiated_at: float | None = None
    results: dict[str, Result] = field(default_factory=dict)
    task: asyncio.Task | None = None

    @property
    def status(self) -> BatchStatus:
        if self.ended_at is not None:
            return BatchStatus.ENDED
        return BatchStatus.CANCELING if self.cancel_initiated_at is not None else BatchStatus.IN_PROGRESS

    def cancel(self, now: float) -> None:
        """Running items finish; those not started end as canceled."""
        if self.ended_at is None and self.cancel_initiated_at is None:
            self.cancel_initiated_at = now


class BatchStore:
    def __init__(
        self, retention_s: float = 86_400.0, max_batches: int = 10_000, clock: Callable[[], float] = time.time
    ):
        self.retention_s, self.max_batches = retention_s, max_batches
        self._clock = clock
        self._batches: dict[str, Batch] = {}  # insertion order = creation order

    def _evict(self) -> None:
        now = self._clock()
        for bid in [
            b.id for b in self._batches.values() if b.ended_at is not None and b.ended_at + self.retention_s <= now
        ]:
            del self._batches[bid]

    def add(self, batch: Batch) -> None:
        self._evict()
        if len(self._batches) >= self.max_batches:
            oldest_ended = next((b for b in self._batches.values() if b.ended_at is not None), None)
            if oldest_ended is None:
                raise ServingError(
                    ErrorKind.RATE_LIMITED,
                    f"too many batches in progress (at most {self.max_batches})",
                    retry_after_s=60,
                )
            del self._batches[oldest_ended.id]
        self._batches[batch.id] = batch

    def get(self, tenant: str, batch_id: str) -> Batch:
        self._evict()
        batch = self._batches.get(batch_id)
        if batch is None or batch.tenant != tenant:  # another tenant's batch does not exist
            raise ServingError(ErrorKind.NOT_FOUND, f"batch {batch_id} not found")
        return batch

    def for_tenant(self, tenant: str) -> list[Batch]:
        """The tenant's batches, newest first."""
        self._evict()
        return sorted(
            (b for b in self._batches.values() if b.tenant == tenant), key=lambda b: b.created_at, reverse=True
        )

    def delete(self, tenant: str, batch_id: str) -> None:
        batch = self.get(tenant, batch_id)
        if batch.ended_at is None:
            raise ServingError(ErrorKind.INVALID_REQUEST, f"batch {batch_id} has not ended; cancel it first")
        del self._batches[batch_id]


async def run_batch(
    batch: Batch, execute: Callable[[Any], Awaitable[Result]], concurrency: int, clock: Callable[[], float] = time.time
) -> None:
    """Run the items `concurrency` at a time; stops starting items once the batch is canceled."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    for item in batch.items:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty() and batch.cancel_initiated_at is None:
            custom_id, item = queue.get_nowait()
            batch.results[custom_id] = await execute(item)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        for custom_id, _ in batch.items:
            batch.results.setdefault(custom_id, {"type": "canceled"})
        batch.ended_at = clock()
