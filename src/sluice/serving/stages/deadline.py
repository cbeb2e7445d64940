"""A stream's deadline: the maximum stream duration, or — once the server drains for shutdown —
the drain deadline, whichever comes first; enforced even while the engine is silent (queued,
long prefill), without blocking the event loop. Past it the stream ends with a `Failed` outcome
(TIMEOUT, or OVERLOADED while draining), and the generation below is closed (an abort).

How: one timer per stream, not per event. The source is awaited directly in the consumer's
task; a timer re-checks the deadline every `_POLL_S` (a drain may move it closer) and, once it
has passed, cancels the consumer's task *only while it awaits the source* — the CancelledError
then unwinds the source (its own cleanup runs: the worker call is cancelled, the request
aborted), and is turned into the Failed outcome here. While the consumer is elsewhere (writing
the last event to the client) the timer only marks the stream expired; the next pull sees it.
The earlier shape — a task per pulled event and `asyncio.wait(timeout=…)` on it — cost ~20 µs
of event-loop work per token (a task, a future, a timer and two extra loop iterations each).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing

from sluice.serving.errors import ErrorKind
from sluice.serving.outcomes import Failed, Outcome
from sluice.serving.runtime import ServingRuntime

_POLL_S = 0.5  # how often the deadline is re-checked (a drain may move it)


class _Deadline:
    def __init__(self, rt: ServingRuntime, loop: asyncio.AbstractEventLoop):
        self.rt, self.loop = rt, loop
        self.limit = loop.time() + rt.settings.max_stream_duration_s
        self.expired: Failed | None = None
        self.waiting: asyncio.Task | None = None  # the task awaiting the source right now
        self.cancelled = False  # this deadline cancelled `waiting`
        self.handle: asyncio.TimerHandle | None = None
        self._check()

    def _deadline(self) -> float:
        if self.rt.draining:
            return min(self.limit, self.loop.time() + (self.rt.drain_deadline - time.monotonic()))
        return self.limit

    def _check(self) -> None:
        now = self.loop.time()
        deadline = self._deadline()
        if deadline > now:
            self.handle = self.loop.call_at(min(deadline, now + _POLL_S), self._check)
            return
        self.handle = None
        self.expired = (
            Failed(ErrorKind.OVERLOADED, "the server is shutting down")
            if self.rt.draining
            else Failed(ErrorKind.TIMEOUT, "the stream exceeded the maximum stream duration")
        )
        if self.waiting is not None and not self.cancelled:
            self.cancelled = True
            self.waiting.cancel()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


async def with_deadline(rt: ServingRuntime, source: AsyncGenerator[Outcome, None]) -> AsyncGenerator[Outcome, None]:
    deadline = _Deadline(rt, asyncio.get_running_loop())
    try:
        async with aclosing(source):
            while True:
                if deadline.expired is None and deadline._deadline() <= deadline.loop.time():
                    deadline._check()  # passed between two timer ticks
                if deadline.expired is not None:
                    yield deadline.expired
                    return
                task = asyncio.current_task()
                deadline.waiting = task
                try:
                    item = await anext(source)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    # ours alone: the deadline passed while the source was awaited. Anyone else's
                    # (the client left, a shutdown) is theirs to handle: it goes on up.
                    if deadline.cancelled and task is not None and task.uncancel() == 0:
                        assert deadline.expired is not None
                        yield deadline.expired
                        return
                    raise
                finally:
                    deadline.waiting = None
                yield item
    finally:
        deadline.close()
