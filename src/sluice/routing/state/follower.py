"""Follow the shared routing state: poll its revision, reload on change, hand on the snapshot.

Every gateway runs one follower. It reads one small integer every `interval_s` (default
0.2 s) and the full state only when that integer moved, so a rollout step or a weight change
made on any gateway reaches every other within about one interval plus a round trip — under
the one second the fleet promises — at the cost of five GETs a second per gateway. Polling
rather than pub/sub: a missed message cannot leave a gateway behind, and a restarted Redis
needs no resubscription; the revision check is the backstop pub/sub would need anyway.

Store errors keep the last snapshot (routing goes on with what it knew) and are logged once
per `warn_every_s`, never per poll. A store found empty (revision 0: revisions only grow, so
it lost its data — a Redis restarted without persistence) while this gateway holds a newer
snapshot gets that snapshot written back, revisions included, rather than every gateway
falling back to the fleet file's `traffic`: the operator's weights and a rollout's progress
survive. The first gateway to find it empty restores it (`restore` writes only into an empty
store); the others then read it back as usual. `sleep` is injected so tests drive the loop
without time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sluice.routing.state.routing_state import RoutingSnapshot, RoutingStateStore

log = logging.getLogger("sluice.routing.state")


class StateFollower:
    def __init__(
        self,
        store: RoutingStateStore,
        on_change: Callable[[RoutingSnapshot], None] | None = None,
        interval_s: float = 0.2,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        warn_every_s: float = 30.0,
    ):
        self.store = store
        self.on_change = on_change
        self.interval_s = interval_s
        self._sleep = sleep
        self.warn_every_s = warn_every_s
        self.snapshot = RoutingSnapshot(revision=-1)  # -1: nothing read yet, the first poll loads
        self._stopped = asyncio.Event()
        self._last_warning = 0.0
        self.errors = 0
        self.restores = 0  # times this follower wrote its snapshot back into an empty store

    async def poll_once(self) -> bool:
        """Reload if the shared revision moved; True when a new snapshot was taken."""
        try:
            revision = await self.store.revision()
            if revision == self.snapshot.revision:
                return False
            if revision == 0 and self.snapshot.revision > 0 and await self.store.restore(self.snapshot):
                self.restores += 1
                log.warning(
                    "routing state store was empty (restarted without its data?); restored revision %d",
                    self.snapshot.revision,
                )
                return False
            snapshot = await self.store.load()
        except Exception as exc:  # the store is down: keep routing on the last snapshot
            self.errors += 1
            now = time.monotonic()
            if now - self._last_warning > self.warn_every_s:
                self._last_warning = now
                log.warning(
                    "routing state store unavailable (%s: %s); keeping revision %d",
                    type(exc).__name__,
                    exc,
                    self.snapshot.revision,
                )
            return False
        self.snapshot = snapshot
        if self.on_change is not None:
            self.on_change(snapshot)
        return True

    async def run(self) -> None:
        """Poll until `stop()`."""
        while not self._stopped.is_set():
            await self.poll_once()
            await self._sleep(self.interval_s)

    def stop(self) -> None:
        self._stopped.set()
