"""One generation on the engine: submit, time it, and turn engine errors into serving errors.

It owns the latency metrics (TTFT, ITL, end to end) and reports a vanished engine to the health
monitor at once, so the next requests are refused with 529 before their streams open instead of
finding out one by one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from sluice.errors import EngineUnavailableError, InvalidRequestError
from sluice.serving.errors import ServingError, invalid, overloaded
from sluice.serving.request import Route
from sluice.serving.runtime import ServingRuntime
from sluice.types import FinishReason, GenerationEvent, GenerationRequest


def to_serving_error(exc: InvalidRequestError | EngineUnavailableError) -> ServingError:
    if isinstance(exc, InvalidRequestError):  # ContextWindowExceededError included
        return invalid(str(exc))
    return overloaded(f"no engine is available: {exc}", retry_after_s=2)


async def generate(rt: ServingRuntime, request: GenerationRequest, route: Route) -> AsyncIterator[GenerationEvent]:
    """The engine's events for `request`; leaving early closes the engine stream (an abort)."""
    engine = rt.require_ready().engine
    m = rt.metrics
    started = time.perf_counter()
    last: float | None = None
    finished = False
    m.inflight.inc()
    m.prompt_tokens.inc(len(request.prompt_token_ids))
    try:
        async with aclosing(engine.generate(request)) as stream:
            async for event in stream:
                now = time.perf_counter()
                if event.queue_time_s is not None:
                    m.queue_time.observe(event.queue_time_s)
                if event.token_ids:
                    if last is None:
                        m.ttft.labels(route.value).observe(now - started)
                    else:
                        m.itl.observe((now - last) / len(event.token_ids))
                    last = now
                    m.output_tokens.inc(len(event.token_ids))
                if event.finished:
                    finished = True
                    m.e2e.labels(route.value).observe(now - started)
                    if event.finish_reason is FinishReason.ABORT:
                        m.aborted.labels("engine").inc()
                yield event
                if finished:
                    return
    except EngineUnavailableError as exc:
        if rt.health is not None:  # refuse the next requests before their streams open
            rt.health.mark_down(str(exc))
        raise to_serving_error(exc) from None
    except InvalidRequestError as exc:
        raise to_serving_error(exc) from None
    finally:
        m.inflight.dec()
        if not finished:
            m.aborted.labels("client").inc()
