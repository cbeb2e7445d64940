"""What decides when a stream's response opens (no servers, no sleeps that matter).

- `Lookahead`: the first outcome is fetched ahead by a task; the consumer then gets every item
  exactly once; closing it while the fetch is still waiting cancels the source (its clean-up
  runs: the engine request is aborted).
- `until_admitted(..., decided)`: the open wait counts only once the rate limits have decided,
  so a hung limits store cannot open a stream that is then refused in-stream."""

from __future__ import annotations

import asyncio

import pytest

from sluice.serving.admission import until_admitted
from sluice.serving.stages.lookahead import Lookahead


@pytest.mark.asyncio
async def test_the_first_item_fetched_ahead_is_handed_on_once_then_the_rest():
    async def source():
        for i in range(3):
            yield i

    ahead = Lookahead(source())
    first = ahead.fetch_first()
    assert await asyncio.wait_for(asyncio.shield(first), 5) == 0
    assert [i async for i in ahead.items()] == [0, 1, 2]


@pytest.mark.asyncio
async def test_an_empty_source_yields_nothing():
    async def source():
        return
        yield  # pragma: no cover

    ahead = Lookahead(source())
    await asyncio.wait({ahead.fetch_first()})
    assert [i async for i in ahead.items()] == []


@pytest.mark.asyncio
async def test_closing_while_the_first_fetch_waits_cancels_the_source():
    started, cleaned = asyncio.Event(), asyncio.Event()

    async def source():
        try:
            started.set()
            await asyncio.Event().wait()  # an engine that has not answered yet
            yield 1
        finally:
            cleaned.set()

    ahead = Lookahead(source())
    first = ahead.fetch_first()
    await started.wait()
    await ahead.aclose()
    assert first.cancelled() and cleaned.is_set()


@pytest.mark.asyncio
async def test_a_consumer_that_opened_before_the_first_item_waits_for_it():
    release = asyncio.Event()

    async def source():
        await release.wait()
        yield "a"
        yield "b"

    ahead = Lookahead(source())
    first = ahead.fetch_first()
    done, _ = await asyncio.wait({first}, timeout=0.01)
    assert not done  # the response would open now, and ping
    release.set()
    assert [i async for i in ahead.items()] == ["a", "b"]


@pytest.mark.asyncio
async def test_the_open_wait_counts_only_once_the_limits_decided():
    loop = asyncio.get_running_loop()
    decided = asyncio.Event()
    opening: asyncio.Future[str] = loop.create_future()
    waiting = asyncio.ensure_future(until_admitted(opening, None, 0.0, decided))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # past the wait, but the limits have not decided: keep waiting
    opening.set_exception(RuntimeError("refused"))  # the store's verdict
    assert await waiting is True  # done: the caller raises it as a real status


@pytest.mark.asyncio
async def test_once_decided_a_queued_request_opens_after_the_wait():
    loop = asyncio.get_running_loop()
    decided = asyncio.Event()
    decided.set()
    opening: asyncio.Future[str] = loop.create_future()
    assert await until_admitted(opening, None, 0.0, decided) is False  # still queued: open the stream
    opening.cancel()
