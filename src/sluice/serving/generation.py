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

from anyio import CancelScope

from sluice.errors import EngineUnavailableError, InvalidRequestError
from sluice.routing.dispatch.failover import Attempted, FailoverPolicy, generate_on_fleet
from sluice.routing.dispatch.router import RoutePlan
from sluice.serving.errors import ServingError, invalid, overloaded
from sluice.serving.planning import Planner
from sluice.serving.runtime import ServingRuntime
from sluice.trace_context import tracer
from sluice.types import FinishReason, GenerationEvent, GenerationRequest


def to_serving_error(exc: InvalidRequestError | EngineUnavailableError) -> ServingError:
    if isinstance(exc, InvalidRequestError):  # ContextWindowExceededError included
        return invalid(str(exc))
    return overloaded(f"no engine is available: {exc}", retry_after_s=2)


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
    started = time.perf_counter()
    first: float | None = None
    last: float | None = None
    final: GenerationEvent | None = None
    output_tokens = 0
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
                now = time.perf_counter()
                if event.queue_time_s is not None:
                    m.queue_time.observe(event.queue_time_s)
                if event.token_ids:
                    if last is None:
                        first = now
                        m.ttft.labels(route, attempted.plan.version_header, tier).observe(now - started)
                        m.recent.record("ttft", now - started)
                    else:
                        m.itl.observe((now - last) / len(event.token_ids))
                        m.recent.record("itl", (now - last) / len(event.token_ids))
                    last = now
                    m.output_tokens.inc(len(event.token_ids))
                output_tokens = event.usage.output_tokens
                if event.finished:
                    final = event
                    m.e2e.labels(route).observe(now - started)
                    if event.finish_reason is FinishReason.ABORT:
                        m.aborted.labels("engine").inc()
                yield event
                if final is not None:
                    return
    except (InvalidRequestError, EngineUnavailableError) as exc:
        failed = isinstance(exc, EngineUnavailableError)
        raise to_serving_error(exc) from None
    finally:
        m.inflight.dec()
        if final is None:
            m.aborted.labels("client").inc()
        span.set_attributes(
            {
                "sluice.output_tokens": output_tokens,
                "sluice.workers": ",".join(attempted.workers),
                "sluice.retries": attempted.retries,
                "sluice.migrations": attempted.migrations,
                "sluice.finish_reason": final.finish_reason.value
                if final is not None and final.finish_reason
                else "none",
            }
        )
        if first is not None:
            span.set_attribute("sluice.ttft_s", first - started)
        span.end()
        with CancelScope(shield=True):  # accounting survives the response's cancellation
            plan = attempted.plan
            adapter = fleet.adapter_ref(plan.model_id, plan.version)
            if adapter is not None and (final is not None or failed):
                m.count_lora(adapter.name, plan.version_header, len(request.prompt_token_ids), output_tokens)
            await fleet.router.settle(plan, len(request.prompt_token_ids) + output_tokens)
            # a rollout's target is judged once per request: failed if any attempt on it failed
            # (even when a retry on another version rescued the request), else by the end
            judged = set(attempted.failed)
            for model_id, version in judged:
                await fleet.driver.observe(model_id, version, False)
            if (final is not None or failed) and (plan.model_id, plan.version) not in judged:
                # a client that left says nothing about the version
                ok = final is not None and final.finish_reason is not FinishReason.ERROR
                await fleet.driver.observe(plan.model_id, plan.version, ok, None if first is None else first - started)
