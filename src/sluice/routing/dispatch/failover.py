"""One generation on the fleet, surviving its workers: retries before output, migration after.

- **Retry**: a request that has produced no output when its worker refuses it, dies, or is
  given up by the health poller goes to another worker of its version (the failed one is
  excluded, the breaker told), after a short backoff; when the version has none left, the
  router plans again without the workers tried (another version, or a fallback model: the
  caller re-tokenizes for it through `replan`). At most `max_attempts` dispatches; the client
  sees only latency.
- **Migration**: once output has been streamed, the request continues on another worker of the
  *same* version (same weights, same tokenizer) from its prompt plus the tokens already sent
  (`GenerationRequest.resumed_output_ids`): the engine recomputes them as context and goes on
  at the same output position, so greedy decoding continues exactly as an uninterrupted run
  would, and seeded sampling draws the same tokens. At most `max_migrations` times; past that
  (or with no worker left) the failure reaches the client as today's error event.
- A worker that ends a request with ABORT (it is shutting down) counts as a lost worker too.
  A request the engine fails itself (ERROR: a fault in that request's step) is not retried —
  it fails alone, and its neighbours in the batch are unaffected (engine.py).

Events carry the original request id whichever worker produced them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

from opentelemetry.trace import Span

from sluice.errors import EngineRefusedError, EngineTimeoutError, EngineUnavailableError
from sluice.routing.dispatch.circuit_breaker import Outcome
from sluice.routing.dispatch.health_poller import WorkerHandle, take_down
from sluice.routing.dispatch.router import FleetRouter, RoutePlan
from sluice.routing.dispatch.worker_picker import Pick
from sluice.routing.dispatch.worker_pool import Dispatch, WorkerStatus
from sluice.trace_context import inject_metadata
from sluice.types import FinishReason, GenerationEvent, GenerationRequest

log = logging.getLogger("sluice.routing")


@dataclass(slots=True, frozen=True)
class FailoverPolicy:
    max_attempts: int = 3  # dispatches before any output
    max_migrations: int = 2  # continuations after output was streamed
    backoff_s: float = 0.05  # before retry n: backoff_s × 2^(n-1), at most 1 s
    # A stream whose worker was lost waits this long for a worker of its version that can
    # continue it (one restarting, a breaker half-opening, the hung one answering again) before
    # it ends with an error: its output so far was already sent, no other version may take over.
    migration_wait_s: float = 15.0


@dataclass(slots=True)
class Attempted:
    """What the caller learns about a finished generation: where it ran, how often it moved."""

    plan: RoutePlan
    workers: list[str] = dataclasses.field(default_factory=list)
    retries: int = 0
    migrations: int = 0
    # (model id, version) of every dispatch that failed — refused, worker lost — even when a
    # retry elsewhere then served the request: a rollout judges its target by these (a broken
    # version whose every request is rescued on the old one must still look broken)
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)


class WorkerLost(Exception):
    """The worker went away in the middle of a request (its stream ended without a final event,
    or it aborted the request while shutting down)."""


Replan = Callable[[RoutePlan, set[str]], Awaitable[tuple[RoutePlan, GenerationRequest]]]


class _Failover:
    """One generation's dispatches: where it may go next, what it streamed so far, and what a
    failed dispatch leads to (a retry, a migration, or the error the client sees)."""

    def __init__(
        self,
        router: FleetRouter,
        plan: RoutePlan,
        request: GenerationRequest,
        replan: Replan,
        policy: FailoverPolicy,
        track: Attempted,
        span: Span | None,
    ):
        self.router, self.plan, self.request, self.replan = router, plan, request, replan
        self.policy, self.track, self.span = policy, track, span
        self.emitted: list[int] = []  # output token ids streamed, whichever worker produced them
        self.emitted_chars = 0
        self.tried: set[str] = set()
        self.lost_at: dict[str, int] = {}  # worker -> its incarnation when it failed this request
        self.attempts = 0

    async def place(self) -> tuple[Dispatch, Pick]:
        """The next dispatch: a worker of the plan's version (a stream with output waits for one
        that can continue it), or, before any output, a new plan when the version has none."""
        router, policy = self.router, self.policy
        while True:
            avoid = _still_lost(router, self.tried, self.lost_at) if self.emitted else self.tried
            placed = router.dispatch(self.plan, self.request, avoid)
            if placed is None and self.emitted:
                placed = await _wait_for_continuation(
                    router, self.plan, self.request, self.tried, self.lost_at, policy.migration_wait_s
                )
                if placed is None:
                    raise EngineUnavailableError(
                        f"no other worker of {self.plan.version_header} could continue the request within "
                        f"{policy.migration_wait_s:g} s (tried {len(self.tried)})"
                    )
            if placed is not None:
                return placed
            if self.attempts >= policy.max_attempts:
                raise EngineUnavailableError(f"no worker could take the request after {self.attempts} attempts")
            # raises ModelUnavailableError when nothing can
            self.plan, self.request = await self.replan(self.plan, self.tried)
            self.track.plan = self.plan

    def begin(self, dispatch: Dispatch, pick: Pick) -> GenerationRequest:
        """The request as this dispatch sends it: after output, a continuation of what was sent."""
        self.track.workers.append(dispatch.worker_id)
        if self.span is not None:
            self.span.add_event(
                "dispatch",
                {
                    "worker": dispatch.worker_id,
                    "version": self.plan.version_header,
                    "reason": pick.reason.value,
                    "resumed_tokens": len(self.emitted),
                },
            )
        self.attempts += 1
        if not self.emitted:
            return self.request
        return dataclasses.replace(
            self.request,
            request_id=f"{self.request.request_id}.m{self.track.migrations}",
            resumed_output_ids=list(self.emitted),
            resumed_text_chars=self.emitted_chars,
        )

    async def failed(self, dispatch: Dispatch, handle: WorkerHandle, exc: Exception) -> None:
        """The worker refused or was lost (called while `exc` is handled): returns when the
        request may go on elsewhere (after the retry's backoff), raises the client's error when
        it may not."""
        router, track, worker_id = self.router, self.track, dispatch.worker_id
        self.tried.add(worker_id)
        if (entry := router.pool.get(worker_id)) is not None:
            self.lost_at[worker_id] = entry.incarnation
        _lost(router, handle, exc)
        track.failed.append((self.plan.model_id, self.plan.version))
        if not self.emitted:
            if self.attempts >= self.policy.max_attempts:
                raise EngineUnavailableError(
                    f"no worker could take the request after {self.attempts} attempts: {exc}"
                ) from None
            track.retries += 1
            if self.span is not None:
                self.span.add_event("retry", {"worker": worker_id, "error": str(exc)})
            log.warning(
                "request %s: worker %s failed before any output (%s); retrying", self.request.request_id, worker_id, exc
            )
            await asyncio.sleep(min(1.0, self.policy.backoff_s * 2 ** (track.retries - 1)))
            return
        if track.migrations >= self.policy.max_migrations:
            raise EngineUnavailableError(f"the request lost {track.migrations + 1} workers mid-stream: {exc}") from None
        track.migrations += 1
        if self.span is not None:
            self.span.add_event(
                "migration", {"worker": worker_id, "after_tokens": len(self.emitted), "error": str(exc)}
            )
        log.warning(
            "request %s: worker %s lost after %d output tokens (%s); migrating",
            self.request.request_id,
            worker_id,
            len(self.emitted),
            exc,
        )


async def generate_on_fleet(
    router: FleetRouter,
    handles: dict[str, WorkerHandle],
    plan: RoutePlan,
    request: GenerationRequest,
    replan: Replan,
    policy: FailoverPolicy = FailoverPolicy(),
    attempted: Attempted | None = None,
    span: Span | None = None,
) -> AsyncGenerator[GenerationEvent, None]:
    """`replan(plan, tried)`: a new plan without the tried workers, and the request prepared
    for it (re-tokenized when the plan moved to another model); raises when nothing can serve.
    `span`: the generation's trace span: each dispatch, retry and migration is an event on it,
    and the workers' spans are its children (the context travels in the gRPC metadata)."""
    metadata = inject_metadata(span) if span is not None else []
    run = _Failover(router, plan, request, replan, policy, attempted or Attempted(plan), span)
    emitted = run.emitted
    while True:
        dispatch, pick = await run.place()
        handle = handles[dispatch.worker_id]
        attempt_req = run.begin(dispatch, pick)
        request_id = run.request.request_id
        outcome = Outcome.SUCCESS
        try:
            async with aclosing(handle.client.generate(attempt_req, metadata)) as stream:
                async for event in stream:
                    if event.finished and event.finish_reason is FinishReason.ABORT:
                        raise WorkerLost(f"worker {dispatch.worker_id} aborted the request (shutting down?)")
                    emitted.extend(event.token_ids)
                    run.emitted_chars += len(event.text)
                    event.request_id = request_id
                    if event.finished and event.finish_reason is FinishReason.ERROR:
                        outcome = Outcome.FAILURE  # this request's fault; counted against the worker, not retried
                    yield event
                    if event.finished:
                        return
            raise WorkerLost(f"worker {dispatch.worker_id} ended the stream without a final event")
        except (EngineUnavailableError, WorkerLost) as exc:
            outcome = Outcome.FAILURE
            await run.failed(dispatch, handle, exc)
        finally:
            router.finish_dispatch(dispatch, outcome)


def _lost(router: FleetRouter, handle: WorkerHandle, exc: Exception) -> None:
    """A refused or broken call is evidence about the worker now: it leaves routing at once
    (the next request neither goes there nor, if it was the last one, is admitted: it gets 529
    before any stream opens), and a health probe brings it back when it answers again. A call
    that only ran out of time says the worker is slow or hung (the probes judge that); one the
    worker refused for itself alone says it is up (its breaker judges a worker that keeps
    refusing)."""
    entry = router.pool.get(handle.worker_id)
    if isinstance(exc, (EngineTimeoutError, EngineRefusedError)):
        return
    if entry is None or entry.status is not WorkerStatus.WARM:
        return
    if take_down(router.pool, handle):
        log.warning(
            "worker %s (%s/%s) is down: a request to it failed (%s)",
            handle.worker_id,
            handle.model_id,
            handle.version,
            exc,
        )


def _still_lost(router: FleetRouter, tried: set[str], lost_at: dict[str, int]) -> set[str]:
    """The tried workers a migrated stream must still avoid: not those that came up again since
    they failed it (a restart at the same address, a hang that ended: warm again after being
    taken down) — a new incarnation holds none of the lost state and continues the stream as
    well as any other worker of the version."""
    return {w for w in tried if (e := router.pool.get(w)) is None or e.incarnation == lost_at.get(w, e.incarnation)}


async def _wait_for_continuation(
    router: FleetRouter,
    plan: RoutePlan,
    request: GenerationRequest,
    tried: set[str],
    lost_at: dict[str, int],
    wait_s: float,
):
    """Poll for a worker that can continue a migrated stream: any warm worker of its version
    but the lost ones (a lost worker counts again as soon as it is back up: `_still_lost`), and
    after half the wait any warm one, the lost worker included (one that was never taken down:
    a call that ran out of time). None when the wait ran out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    pause = 0.05  # a worker that came back is used within 50 ms (a dispatch attempt is in-memory)
    while loop.time() < deadline:
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        late = loop.time() > deadline - wait_s / 2
        placed = router.dispatch(plan, request, set() if late else _still_lost(router, tried, lost_at))
        if placed is not None:
            return placed
    return None
