"""Small asyncio helpers every layer uses (a leaf: imports nothing of sluice)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def cancel_and_wait(tasks: asyncio.Task | None | Iterable[asyncio.Task]) -> None:
    """Cancel the task(s) and wait until each has ended, whatever it raised on the way out:
    a stopping component must not leave a task running behind it, nor fail its own stop
    because a task it cancelled failed."""
    if tasks is None:
        return
    tasks = [tasks] if isinstance(tasks, asyncio.Task) else list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
