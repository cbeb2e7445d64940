"""serving/stages/deadline.py: one timer per stream ends a silent or too-long stream, follows a drain,
and never swallows somebody else's cancellation."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from sluice.serving.errors import ErrorKind
from sluice.serving.outcomes import Failed
from sluice.serving.stages.deadline import with_deadline


def runtime(max_s: float = 600.0) -> SimpleNamespace:
    return SimpleNamespace(settings=SimpleNamespace(max_stream_duration_s=max_s), draining=False, drain_deadline=0.0)


class Source:
    """Yields `items`, then hangs until closed; records that it was closed."""

    def __init__(self, items: list[str]):
        self.items, self.closed = items, False

    async def gen(self):
        try:
            for item in self.items:
                yield item
            await asyncio.Event().wait()  # silent: a queued request, a long prefill
        finally:
            self.closed = True


async def collect(stream) -> list:
    return [item async for item in stream]


def test_items_pass_and_a_silent_stream_times_out_closing_its_source():
    async def run():
        src = Source(["a", "b"])
        out = await collect(with_deadline(runtime(0.3), src.gen()))
        assert out[:2] == ["a", "b"] and isinstance(out[2], Failed) and out[2].kind is ErrorKind.TIMEOUT
        assert src.closed
        assert asyncio.current_task().cancelling() == 0  # the deadline's own cancel was taken back

    asyncio.run(run())


def test_a_drain_moves_the_deadline_closer():
    async def run():
        rt = runtime(600)
        src = Source(["a"])
        stream = with_deadline(rt, src.gen())
        assert await anext(stream) == "a"
        rt.draining, rt.drain_deadline = True, time.monotonic() + 0.2  # what ServingRuntime.start_drain does
        out = await collect(stream)
        assert isinstance(out[0], Failed) and out[0].kind is ErrorKind.OVERLOADED and src.closed

    asyncio.run(run())


def test_expiry_while_the_consumer_is_busy_is_seen_on_the_next_pull():
    async def run():
        src = Source(["a", "b"])
        stream = with_deadline(runtime(0.2), src.gen())
        assert await anext(stream) == "a"
        await asyncio.sleep(0.5)  # the consumer writes to a slow client: the deadline passes here
        out = await collect(stream)
        assert len(out) == 1 and isinstance(out[0], Failed) and out[0].kind is ErrorKind.TIMEOUT  # "b" is not sent

    asyncio.run(run())


def test_someone_elses_cancellation_goes_on_up():
    async def run():
        src = Source([])
        task = asyncio.ensure_future(collect(with_deadline(runtime(600), src.gen())))
        await asyncio.sleep(0.05)
        task.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await task
        assert src.closed

    asyncio.run(run())
