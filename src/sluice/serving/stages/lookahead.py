"""Fetch an async generator's first item ahead, in a task, and wait for it a bounded time.

A stream's response opens only when its first outcome is known or `stream_open_wait_s` has
passed (serving/pipeline.py): so a failure that comes at once — the engine gone, no worker
left — is still a refusal with a real status, not an `error` event after a 200. The first item
is pulled by a task so the wait can end without cancelling the generator; the consumer then
takes that item (waiting for it if the response opened first) and iterates on.

`aclose()` ends it whatever state it is in: a first fetch still running is cancelled and
awaited (a generator cannot be closed while another task runs it), then the generator is
closed — by `items()` itself when a consumer is iterating (it closes it when it ends).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Generic, TypeVar

from anyio import CancelScope

T = TypeVar("T")


class _End:
    """The generator ended before yielding anything."""


class Lookahead(Generic[T]):
    def __init__(self, source: AsyncGenerator[T, None]):
        self._source = source
        self._first: asyncio.Task[T | _End] | None = None
        self._iterating = False

    def fetch_first(self) -> asyncio.Task[T | _End]:
        """Start pulling the first item (once); the task to wait on."""
        if self._first is None:
            self._first = asyncio.ensure_future(self._pull())
        return self._first

    async def _pull(self) -> T | _End:
        try:
            return await anext(self._source)
        except StopAsyncIteration:
            return _End()

    async def items(self) -> AsyncGenerator[T, None]:
        """Every item once: the one fetched ahead (if any), then the rest."""
        self._iterating = True
        try:
            if self._first is not None:
                first = await self._first
                if isinstance(first, _End):
                    return
                yield first
            async for item in self._source:
                yield item
        finally:
            self._iterating = False
            await self.aclose()

    async def aclose(self) -> None:
        with CancelScope(shield=True):
            if self._first is not None and not self._first.done():
                self._first.cancel()
                await asyncio.wait({self._first})
            if not self._iterating:
                await self._source.aclose()
