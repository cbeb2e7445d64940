"""A stream's deadline: the maximum stream duration, or — once the server drains for shutdown —
the drain deadline, whichever comes first; enforced even while the engine is silent (queued,
long prefill), without blocking the event loop. Past it the stream ends with a `Failed` outcome
(TIMEOUT, or OVERLOADED while draining), and the generation below is closed (an abort)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from sluice.serving.errors import ErrorKind
from sluice.serving.outcomes import Failed, Outcome
from sluice.serving.runtime import ServingRuntime

_POLL_S = 0.5  # how often a silent stream re-checks its deadline (a drain may move it)


async def with_deadline(rt: ServingRuntime, source: AsyncGenerator[Outcome, None]) -> AsyncIterator[Outcome]:
    loop = asyncio.get_running_loop()
    limit = loop.time() + rt.settings.max_stream_duration_s
    pending: asyncio.Future | None = None
    async with aclosing(source):
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(source))
                deadline = limit
                if rt.draining:
                    deadline = min(deadline, loop.time() + (rt.drain_deadline - time.monotonic()))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if rt.draining:
                        yield Failed(ErrorKind.OVERLOADED, "the server is shutting down")
                    else:
                        yield Failed(ErrorKind.TIMEOUT, "the stream exceeded the maximum stream duration")
                    return
                done, _ = await asyncio.wait({pending}, timeout=min(remaining, _POLL_S))
                if not done:
                    continue
                try:
                    item = pending.result()
                except StopAsyncIteration:
                    pending = None
                    return
                pending = None
                yield item
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                try:
                    await pending
                except (asyncio.CancelledError, StopAsyncIteration, Exception):
                    pass
