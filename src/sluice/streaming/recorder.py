"""Record a stream's rendered events into the replay log as they are sent, and detach one from
its connection (background generation).

- The log is opened before the recording is handed out, so a follower can never look for it
  too early (a background stream's response follows the log at once).
- Every numbered event (seq > 0) is appended before it is handed on, so a client that resumes
  can never miss one it was not sent.
- A stream cut short — closed before its source ended (the client left, not a background
  request), even before it started — gets a final event saying so (`cut(seq)`, in the wire's
  own words) and the log is finished, so a client resuming it sees a proper end.
- `detach` runs a recording to its end as a server task: the response (and any resume) follows
  the log instead, and a disconnect stops only that follower.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from anyio import CancelScope

from sluice.streaming.replay_log import ReplayEvent, ReplayLog


class Recording:
    def __init__(
        self,
        log: ReplayLog,
        stream_id: str,
        source: AsyncGenerator[ReplayEvent, None],
        cut: Callable[[int], ReplayEvent],
    ):
        self._log, self._id, self._source, self._cut = log, stream_id, source, cut
        self._last_seq = 0
        self._finished = False
        self._events = self._record()

    @classmethod
    async def open(
        cls,
        log: ReplayLog,
        stream_id: str,
        tenant: str,
        source: AsyncGenerator[ReplayEvent, None],
        cut: Callable[[int], ReplayEvent],
    ) -> Recording:
        await log.open(stream_id, tenant)
        return cls(log, stream_id, source, cut)

    def events(self) -> AsyncGenerator[ReplayEvent, None]:
        """The source's events, each recorded before it is handed on (iterate once)."""
        return self._events

    async def _record(self) -> AsyncGenerator[ReplayEvent, None]:
        ended = False
        try:
            async with aclosing(self._source):
                async for event in self._source:
                    if event.seq:
                        self._last_seq = event.seq
                        await self._log.append(self._id, event)
                    yield event
                ended = True
        finally:
            await self._finish(ended)

    async def close(self) -> None:
        """End the recording however far it got (idempotent): a stream that did not reach its end
        gets the cut event; the log is finished."""
        await self._events.aclose()
        await self._source.aclose()  # a recording that never started never opened its source
        await self._finish(False)

    async def _finish(self, ended: bool) -> None:
        if self._finished:
            return
        self._finished = True
        # shielded: after a disconnect the response's cancel scope would cancel every await here
        # (anyio cancellation is level-triggered) and the log would never be finished
        with CancelScope(shield=True):
            if not ended:
                await self._log.append(self._id, self._cut(self._last_seq + 1))
            await self._log.finish(self._id)


def detach(recording: Recording, keep: Callable[[asyncio.Task], None]) -> asyncio.Task:
    """Run `recording` to its end as its own task; `keep` holds a reference until it is done."""

    async def drain() -> None:
        try:
            async for _ in recording.events():
                pass
        finally:
            await recording.close()

    task = asyncio.get_running_loop().create_task(drain(), name="sluice-background-stream")
    keep(task)
    return task
