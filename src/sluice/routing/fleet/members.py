"""The workers one gateway routes to: each one's handle (address, client, supervisor) and its
entry in the worker pool, kept in step.

This is the part of the running fleet its helpers change — local replicas join and leave,
the autoscaler promotes and drains, a reload connects and disconnects remote workers, the
status page reads them — so they take this, not the whole Fleet (fleet.py composes them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.routing.dispatch.health_poller import WorkerHandle
from sluice.routing.dispatch.version_router import version_header
from sluice.routing.dispatch.worker_pool import WorkerEntry, WorkerPool, WorkerStatus
from sluice.routing.fleet_file.registry import Registry
from sluice.worker.engine_client import EngineClient
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.supervisor import WorkerSupervisor


@dataclass
class FleetMembers:
    registry: Registry  # each version's load limit when its worker joins
    pool: WorkerPool
    handles: dict[str, WorkerHandle] = field(default_factory=dict)
    client_for: Callable[[str], EngineClient] = GrpcEngineClient  # how remote workers are reached
    on_give_up: Callable[[str], None] | None = None  # a local worker kept dying and none is left

    def add_worker(
        self,
        model_id: str,
        version: str,
        address: str,
        client: EngineClient,
        supervisor: WorkerSupervisor | None = None,
    ) -> WorkerEntry:
        self.handles[address] = WorkerHandle(address, model_id, version, address, client, supervisor)
        entry = self.pool.get(address)
        if entry is None:
            limit = self.registry.version(model_id, version).max_outstanding_tokens
            entry = self.pool.add(address, model_id, version, address, max_outstanding_tokens=limit)
        return entry

    def add_remote(self, model_id: str, version: str, address: str) -> WorkerEntry:
        """A running `sluice worker` listed in the fleet file (STARTING until the poller warms it)."""
        entry = self.add_worker(model_id, version, address, self.client_for(address))
        entry.remote = True
        return entry

    def remove(self, h: WorkerHandle) -> bool:
        """Take the worker out of the handles and the pool; False if it was gone already."""
        if self.handles.get(h.worker_id) is not h:
            return False
        del self.handles[h.worker_id]
        self.pool.remove(h.worker_id)
        return True

    def gave_up(self, worker_id: str, why: str) -> None:
        self.pool.set_status(worker_id, WorkerStatus.STOPPED)
        # a warm-pool worker is alive too: the autoscaler promotes it
        if not any(
            self.pool.takes_requests(w) or w.status in (WorkerStatus.STARTING, WorkerStatus.STANDBY)
            for w in self.entries()
        ):
            if self.on_give_up is not None:
                self.on_give_up(why)

    def entries(self) -> list[WorkerEntry]:
        return [w for w in (self.pool.get(h) for h in self.handles) if w is not None]

    def serving_handles(self) -> list[WorkerHandle]:
        return [
            h
            for h in self.handles.values()
            if (w := self.pool.get(h.worker_id)) is not None and self.pool.takes_requests(w)
        ]

    @property
    def ready(self) -> bool:
        """Some worker can take a request now."""
        return any(self.pool.takes_requests(w) for w in self.entries())

    def not_ready_reason(self) -> str:
        states = [
            f"{h.worker_id}: {w.status.value}" for h in self.handles.values() if (w := self.pool.get(h.worker_id))
        ]
        return "no worker can take requests (" + ", ".join(states) + ")" if states else "no workers"

    def worker_counts(self) -> dict[tuple[str, str, str], int]:
        """(model, <model>/<version>, state) -> workers, for the `sluice_workers` gauge."""
        counts: dict[tuple[str, str, str], int] = {}
        for h in self.handles.values():
            w = self.pool.get(h.worker_id)
            if w is not None:
                key = (h.model_id, version_header(h.model_id, h.version), w.status.value)
                counts[key] = counts.get(key, 0) + 1
        return counts
