"""The workers behind each model version, as the router sees them: status, load, breaker.

A worker takes new requests only while it is WARM (model loaded and a warm-up generation
done; a STANDBY worker is just as ready but held back in the autoscaler's warm pool), its
circuit breaker lets requests through, and its outstanding work is under the version's
`max_outstanding_tokens` (when set). The pool does no I/O: the health poller, the
supervisor and the request path report into it (`set_status`, `report_load`,
`record_health`, `begin`/`finish`), and the picker reads `candidates`. `on_cache_lost`
callbacks hear of every worker whose KV cache is gone — removed, down (back to STARTING),
stopped, or seen to have restarted (`mark_restarted`) — so the router's prefix table forgets
what it sent there.

LoRA adapter versions (routing/fleet_file/adapters.py) have no workers of their own: they
borrow their base version's (`set_adapter_bases`), so its workers are theirs for candidates,
warmth and drains, while the requests in flight on an adapter version are counted per version.
Each worker's resident adapters (its stats' `lora_resident`, and what this gateway sent it
since) tell the router which workers hold an adapter already.

Load = max(reported, dispatched). The worker's stats (tokens queued + running) cover every
gateway's requests but arrive a poll late; this gateway's own in-flight dispatches (each
counted at its estimate, prompt + max_tokens, until it finishes) are exact and immediate
but see only this gateway. The larger of the two is never below either truth, so a burst
between two polls still spreads instead of piling onto one worker.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from sluice.routing.dispatch.circuit_breaker import BreakerConfig, CircuitBreaker, Outcome, Permit
from sluice.routing.dispatch.worker_picker import Candidate


class WorkerStatus(str, enum.Enum):
    STARTING = "starting"  # spawned or connecting; not loaded yet
    WARM = "warm"  # loaded and warmed up: takes requests
    # loaded and warmed up, but in the warm pool: takes no requests until the autoscaler
    # promotes it (a status change, so promotion costs one routing decision, not a model load)
    STANDBY = "standby"
    DRAINING = "draining"  # finishes what it has, takes nothing new
    STOPPED = "stopped"  # gone (exited, removed from the fleet)


@dataclass(slots=True)
class WorkerEntry:
    worker_id: str
    model_id: str
    version: str
    address: str
    breaker: CircuitBreaker
    status: WorkerStatus = WorkerStatus.STARTING
    max_outstanding_tokens: int | None = None
    remote: bool = False  # listed by address in the fleet file (local replicas: the supervisor's)
    reported_tokens: int = 0  # from the worker's stats: tokens queued + running
    dispatched_tokens: int = 0  # this gateway's in-flight estimates
    inflight: int = 0  # this gateway's in-flight requests
    # set while `inflight` is 0 and once the worker left the pool: a drain awaits it instead of
    # polling (routing/fleet/local_replicas.py)
    settled: asyncio.Event = field(default_factory=lambda: _set(asyncio.Event()), repr=False, compare=False)
    # bumped each time the worker comes up again (warm after being down, or seen restarted): a
    # stream that lost the worker may continue on it once this moved (routing/dispatch/failover.py)
    incarnation: int = 0
    adapters: frozenset[str] = frozenset()  # LoRA adapters resident there (names), as last known

    @property
    def load_tokens(self) -> int:
        return max(self.reported_tokens, self.dispatched_tokens)


def _set(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


@dataclass(slots=True, frozen=True)
class Dispatch:
    """One request sent to one worker; hand it back to `finish` exactly once."""

    worker_id: str
    cost_tokens: int
    permit: Permit = field(repr=False)
    version_key: tuple[str, str] | None = None  # an adapter version's (model, version): counted per version


class WorkerPool:
    def __init__(self, breaker: BreakerConfig = BreakerConfig(), clock: Callable[[], float] = time.monotonic):
        self.breaker_config = breaker
        self._clock = clock
        self._workers: dict[str, WorkerEntry] = {}
        self.on_cache_lost: list[Callable[[str], None]] = []  # called with the worker id
        self._bases: dict[tuple[str, str], tuple[str, str]] = {}  # adapter version -> its base version
        self._adapter_inflight: dict[tuple[str, str], int] = {}  # adapter version -> requests in flight

    # -- membership ---------------------------------------------------------------------------
    def add(
        self,
        worker_id: str,
        model_id: str,
        version: str,
        address: str,
        *,
        status: WorkerStatus = WorkerStatus.STARTING,
        max_outstanding_tokens: int | None = None,
    ) -> WorkerEntry:
        if worker_id in self._workers:
            raise ValueError(f"worker {worker_id!r} is already in the pool")
        entry = WorkerEntry(
            worker_id,
            model_id,
            version,
            address,
            CircuitBreaker(self.breaker_config, self._clock),
            status,
            max_outstanding_tokens,
        )
        self._workers[worker_id] = entry
        return entry

    def remove(self, worker_id: str) -> None:
        if (entry := self._workers.pop(worker_id, None)) is not None:
            entry.settled.set()
            self._cache_lost(worker_id)

    def get(self, worker_id: str) -> WorkerEntry | None:
        return self._workers.get(worker_id)

    def set_adapter_bases(self, bases: dict[tuple[str, str], tuple[str, str]]) -> None:
        """(model, version) of each adapter version -> its base's: whose workers serve it."""
        self._bases = dict(bases)

    def base_of(self, model_id: str, version: str) -> tuple[str, str]:
        """The version whose workers serve (model, version): its base for an adapter, itself otherwise."""
        return self._bases.get((model_id, version), (model_id, version))

    def workers(self, model_id: str, version: str | None = None) -> list[WorkerEntry]:
        if version is not None:
            model_id, version = self.base_of(model_id, version)
        return [
            w for w in self._workers.values() if w.model_id == model_id and (version is None or w.version == version)
        ]

    # -- reports ------------------------------------------------------------------------------
    def set_status(self, worker_id: str, status: WorkerStatus) -> None:
        if (w := self._workers.get(worker_id)) is not None:
            lost = status is not w.status and status in (WorkerStatus.STARTING, WorkerStatus.STOPPED)
            if w.status is WorkerStatus.STARTING and status in (WorkerStatus.WARM, WorkerStatus.STANDBY):
                w.incarnation += 1
            w.status = status
            if lost:  # went down or away: whatever comes back (a restart) has an empty cache
                self._cache_lost(worker_id)

    def mark_restarted(self, worker_id: str) -> None:
        """The worker restarted between two health checks (its cumulative counters went back)."""
        if (w := self._workers.get(worker_id)) is not None:
            w.incarnation += 1
            self._cache_lost(worker_id)

    def _cache_lost(self, worker_id: str) -> None:
        for callback in self.on_cache_lost:
            callback(worker_id)

    def report_load(self, worker_id: str, outstanding_tokens: int) -> None:
        if (w := self._workers.get(worker_id)) is not None:
            w.reported_tokens = max(0, outstanding_tokens)

    def report_adapters(self, worker_id: str, names: Collection[str]) -> None:
        if (w := self._workers.get(worker_id)) is not None:
            w.adapters = frozenset(names)

    def record_health(self, worker_id: str, healthy: bool) -> None:
        if (w := self._workers.get(worker_id)) is not None:
            w.breaker.record_health(healthy)

    # -- the request path ---------------------------------------------------------------------
    def takes_requests(self, w: WorkerEntry) -> bool:
        if w.status is not WorkerStatus.WARM or not w.breaker.available():
            return False
        return w.max_outstanding_tokens is None or w.load_tokens < w.max_outstanding_tokens

    def candidates(self, model_id: str, version: str, exclude: Collection[str] = ()) -> list[Candidate]:
        """Workers of the version that can take a request now (`exclude`: already tried)."""
        return [
            Candidate(w.worker_id, w.load_tokens)
            for w in self.workers(model_id, version)
            if w.worker_id not in exclude and self.takes_requests(w)
        ]

    def begin(
        self, worker_id: str, cost_tokens: int, version_key: tuple[str, str] | None = None, adapter: str | None = None
    ) -> Dispatch | None:
        """Take the worker's breaker permit and count the request's load; None when the worker
        cannot take it after all (its half-open probe slot was just taken). `version_key`: the
        (model, version) it serves, counted there when that is an adapter version; `adapter`:
        the adapter it carries, resident there from now on."""
        w = self._workers.get(worker_id)
        if w is None or w.status is not WorkerStatus.WARM:
            return None
        permit = w.breaker.try_acquire()
        if permit is None:
            return None
        w.dispatched_tokens += cost_tokens
        w.inflight += 1
        w.settled.clear()
        if adapter is not None and adapter not in w.adapters:
            w.adapters = w.adapters | {adapter}
        key = version_key if version_key in self._bases else None
        if key is not None:
            self._adapter_inflight[key] = self._adapter_inflight.get(key, 0) + 1
        return Dispatch(worker_id, cost_tokens, permit, key)

    def finish(self, dispatch: Dispatch, outcome: Outcome) -> None:
        if dispatch.version_key is not None:
            left = self._adapter_inflight.get(dispatch.version_key, 0) - 1
            if left > 0:
                self._adapter_inflight[dispatch.version_key] = left
            else:
                self._adapter_inflight.pop(dispatch.version_key, None)
        w = self._workers.get(dispatch.worker_id)
        if w is None:
            return  # removed meanwhile
        w.dispatched_tokens = max(0, w.dispatched_tokens - dispatch.cost_tokens)
        w.inflight = max(0, w.inflight - 1)
        if w.inflight == 0:
            w.settled.set()
        w.breaker.record(dispatch.permit, outcome)

    # -- version-level views ------------------------------------------------------------------
    def inflight(self, model_id: str, version: str) -> int:
        """This gateway's requests still running on the version (a drain waits for 0); an adapter
        version's own requests, not its base workers' others."""
        if (model_id, version) in self._bases:
            return self._adapter_inflight.get((model_id, version), 0)
        return sum(w.inflight for w in self.workers(model_id, version))

    def warm(self, model_id: str, version: str) -> bool:
        """Every worker the version has is warm (serving or in the warm pool), and at least one
        serves (a rollout waits for this before shifting traffic)."""
        ws = [w for w in self.workers(model_id, version) if w.status is not WorkerStatus.STOPPED]
        ready = (WorkerStatus.WARM, WorkerStatus.STANDBY)
        return any(w.status is WorkerStatus.WARM for w in ws) and all(w.status in ready for w in ws)
