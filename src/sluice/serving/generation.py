"""One generation on the fleet: dispatch (with retries and mid-stream migration, routing/
dispatch/failover.py), time it, and account for it.

It owns the latency metrics (TTFT, ITL, end to end), settles the plan's quota reservation with
the tokens actually used, and feeds a rollout's health window with the outcome and TTFT of each
request the rollout's target served. Engine errors become serving errors here.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from anyio import CancelScope
from opentelemetry.trace import Span

from sluice.errors import EngineUnavailableError, InvalidRequestError
from sluice.observability.metrics import ServingMetrics
from sluice.routing.dispatch.failover import Attempted, FailoverPolicy, generate_on_fleet
from sluice.routing.dispatch.router import RoutePlan
from sluice.routing.fleet.fleet import Fleet
from sluice.serving.errors import ServingError, invalid, overloaded
from sluice.serving.planning import Planner
from sluice.serving.runtime import ServingRuntime
from sluice.trace_context import tracer
from sluice.types import FinishReason, GenerationEvent, GenerationRequest


def to_serving_error(exc: InvalidRequestError | EngineUnavailableError) -> ServingError:
    if isinstance(exc, InvalidRequestError):  # ContextWindowExceededError included
        return invalid(str(exc))
    return overloaded(f"no engine is available: {exc}", retry_after_s=2)


@dataclass(slots=True)
class _Meter:
    """One generation's timing as its events arrive: it feeds the latency metrics and keeps what
    the span and the accounting need at the end."""

    metrics: ServingMetrics
    route: str
    tier: str
    started: float = field(default_factory=time.perf_counter)
    first: float | None = None  # when the first token came
    last: float | None = None  # when the latest tokens came
    final: GenerationEvent | None = None
    output_tokens: int = 0

    def observe(self, event: GenerationEvent, version_header: str) -> None:
        m, now = self.metrics, time.perf_counter()
        if event.queue_time_s is not None:
            m.queue_time.observe(event.queue_time_s)
        if event.token_ids:
            if self.last is None:
                self.first = now
                m.ttft.labels(self.route, version_header, self.tier).observe(now - self.started)
                m.recent.record("ttft", now - self.started)
            else:
                m.itl.observe((now - self.last) / len(event.token_ids))
                m.recent.record("itl", (now - self.last) / len(event.token_ids))
            self.last = now
            m.output_tokens.inc(len(event.token_ids))
        self.output_tokens = event.usage.output_tokens
        if event.finished:
            self.final = event
            m.e2e.labels(self.route).observe(now - self.started)
            if event.finish_reason is FinishReason.ABORT:
                m.aborted.labels("engine").inc()

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.started


def _end_span(span: Span, attempted: Attempted, meter: _Meter) -> None:
    final = meter.final
    span.set_attributes(
        {
            "sluice.output_tokens": meter.output_tokens,
            "sluice.workers": ",".join(attempted.workers),
            "sluice.retries": attempted.retries,
            "sluice.migrations": attempted.migrations,
            "sluice.finish_reason": final.finish_reason.value if final is not None and final.finish_reason else "none",
        }
    )
    if meter.ttft_s is not None:
        span.set_attribute("sluice.ttft_s", meter.ttft_s)
    span.end()


async def _account(
    fleet: Fleet, metrics: ServingMetrics, request: GenerationRequest, attempted: Attempted, meter: _Meter, failed: bool
) -> None:
    """After the generation: LoRA counts, the plan's quota settled with the tokens used, and the
    rollout's health window fed."""
    plan, final = attempted.plan, meter.final
    prompt_tokens = len(request.prompt_token_ids)
    adapter = fleet.adapter_ref(plan.model_id, plan.version)
    if adapter is not None and (final is not None or failed):
        metrics.count_lora(adapter.name, plan.version_header, prompt_tokens, meter.output_tokens)
    await fleet.router.settle(plan, prompt_tokens + meter.output_tokens)
    # a rollout's target is judged once per request: failed if any attempt on it failed
    # (even when a retry on another version rescued the request), else by the end
    judged = set(attempted.failed)
    for model_id, version in judged:
        await fleet.driver.observe(model_id, version, False)
    if (final is not None or failed) and (plan.model_id, plan.version) not in judged:
        # a client that left says nothing about the version
        ok = final is not None and final.finish_reason is not FinishReason.ERROR
        await fleet.driver.observe(plan.model_id, plan.version, ok, meter.ttft_s)


async def generate(
    rt: ServingRuntime, planner: Planner, plan: RoutePlan, request: GenerationRequest, route: str, tier: str
) -> AsyncGenerator[GenerationEvent, None]:
    """The engine's events for the planned request (`route` and `tier` label its metrics);
    leaving early closes the worker stream
    (an abort: the worker frees the request's KV blocks within a step)."""
    fleet = planner.fleet
    routing = fleet.registry.fleet.routing
    policy = FailoverPolicy(routing.max_attempts, routing.max_migrations, migration_wait_s=routing.migration_wait_s)
    attempted = Attempted(plan)
    m = rt.metrics
    meter = _Meter(m, route, tier)
    failed = False
    m.inflight.inc()
    m.prompt_tokens.inc(len(request.prompt_token_ids))
    # not the current span: this generator's frames run in its consumer's context, so the span
    # is passed down explicitly (its context reaches the worker in the gRPC metadata)
    span = tracer().start_span(
        "generate",
        attributes={
            "sluice.request_id": request.request_id,
            "sluice.version": plan.version_header,
            "sluice.prompt_tokens": len(request.prompt_token_ids),
            "sluice.max_tokens": request.sampling.max_tokens,
        },
    )
    try:
        stream = generate_on_fleet(fleet.router, fleet.handles, plan, request, planner.replan, policy, attempted, span)
        async with aclosing(stream):
            async for event in stream:
                meter.observe(event, attempted.plan.version_header)
                yield event
                if meter.final is not None:
                    return
    except (InvalidRequestError, EngineUnavailableError) as exc:
        failed = isinstance(exc, EngineUnavailableError)
        raise to_serving_error(exc) from None
    finally:
        m.inflight.dec()
        if meter.final is None:
            m.aborted.labels("client").inc()
        _end_span(span, attempted, meter)
        with CancelScope(shield=True):  # accounting survives the response's cancellation
            await _account(fleet, m, request, attempted, meter, failed)
