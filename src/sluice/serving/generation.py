"""One generation as the routes see it: submit to the engine, time it, map its errors.

Both wire formats (Anthropic, OpenAI) sit on this; it owns the latency metrics and the
abort-on-exit rule: leaving the iterator early (disconnect, send timeout, max duration)
closes the engine stream, which aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from sluice.api.errors import ApiError, bad_request, overloaded
from sluice.serving.runtime import ServingRuntime
from sluice.errors import ContextWindowExceededError, EngineUnavailableError, InvalidRequestError
from sluice.types import FinishReason, GenerationEvent, GenerationRequest, SamplingParams


def check_fits(prompt_len: int, max_model_len: int) -> None:
    """400 before any generation when the prompt leaves no room for one output token."""
    if prompt_len >= max_model_len:
        raise bad_request(f"prompt is too long: {prompt_len} tokens > {max_model_len - 1} maximum")


def checked(sampling: SamplingParams) -> SamplingParams:
    """The engine's own validation, run before any response starts: a value the engine or the
    worker protocol cannot carry is a 400 here, never an in-stream error later."""
    try:
        sampling.validate()
    except InvalidRequestError as exc:
        raise bad_request(str(exc)) from None
    return sampling


def map_engine_error(exc: Exception) -> ApiError:
    if isinstance(exc, ContextWindowExceededError):
        return bad_request(str(exc))
    if isinstance(exc, InvalidRequestError):
        return bad_request(str(exc))
    if isinstance(exc, EngineUnavailableError):
        return overloaded(f"no engine is available: {exc}", retry_after=2)
    return ApiError(500, "internal error while generating")


async def generate(rt: ServingRuntime, request: GenerationRequest, route: str) -> AsyncIterator[GenerationEvent]:
    """Stream the engine's events for `request`, recording TTFT / ITL / e2e metrics."""
    engine, _, _ = rt.require_ready()
    m = rt.metrics
    started = time.perf_counter()
    last = None
    finished = False
    m.inflight.inc()
    m.prompt_tokens.inc(len(request.prompt_token_ids))
    stream = engine.generate(request)
    try:
        async for event in stream:
            now = time.perf_counter()
            if event.queue_time_s is not None:
                m.queue_time.observe(event.queue_time_s)
            if event.token_ids:
                if last is None:
                    m.ttft.labels(route).observe(now - started)
                else:
                    m.itl.observe((now - last) / len(event.token_ids))
                last = now
                m.output_tokens.inc(len(event.token_ids))
            if event.finished:
                finished = True
                m.e2e.labels(route).observe(now - started)
                if event.finish_reason is FinishReason.ABORT:
                    m.aborted.labels("engine").inc()
            yield event
            if finished:
                return
    except EngineUnavailableError as exc:
        if rt.health is not None:  # refuse the next requests before their streams open
            rt.health.mark_down(str(exc))
        raise map_engine_error(exc) from None
    except InvalidRequestError as exc:
        raise map_engine_error(exc) from None
    finally:
        m.inflight.dec()
        if not finished:
            m.aborted.labels("client").inc()
        await stream.aclose()  # cancels the engine request if it is still running
