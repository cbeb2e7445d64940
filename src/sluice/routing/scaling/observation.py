"""What the local autoscaler sees of one version: its workers by state and its scaling signal.

The signal is the one the gateway exports per model as `sluice_scaling_signal{model}`
(scaling/signal.py, built on the functions here):
Σ estimated tokens (queued + in flight) over the token capacity of the workers that serve —
per version here, because each version scales alone:

- in flight: this gateway's dispatches on the version's serving workers, each at its estimate
  (prompt + max_tokens) — the same numbers the admission queue's leases hold;
- queued: requests still in the admission queue are not routed yet, so they have no version.
  They are shared out in proportion to where the in-flight work goes now (the queue holds the
  same mix), and evenly over the versions with serving capacity while nothing is in flight.
  For a fleet of one version this is exactly the exported signal (scaling/signal.py, which
  pools each model's versions the same way);
- capacity: the KV tokens (blocks × block size) of the version's serving workers, from their
  last stats. A warm-pool worker's capacity joins the moment it is promoted.

`batch_signal` is the part owned by batch-band work in the queue (tiers.py's lowest band): the
policy serves a scale-up only that work needs with cold starts, keeping the pool for bursts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sluice.routing.dispatch.health_poller import WorkerHandle
from sluice.routing.dispatch.worker_pool import WorkerEntry, WorkerPool, WorkerStatus
from sluice.routing.scaling.decision import FleetObservation


@dataclass(slots=True, frozen=True)
class Demand:
    """The admission queue's waiting work (the serving layer supplies it; routing cannot
    import the gateway)."""

    queued_tokens: int = 0
    batch_queued_tokens: int = 0  # of which batch-band


@dataclass(slots=True, frozen=True)
class VersionLoad:
    """One version's workers and load, before the queue is shared out."""

    model_id: str
    version: str
    serving: list[WorkerEntry]
    standby: list[WorkerEntry]
    starting: int  # STARTING in the pool + local starts still loading their model
    draining: int
    capacity_tokens: int
    inflight_tokens: int


def version_load(
    model_id: str, version: str, pool: WorkerPool, handles: Iterable[WorkerHandle], pending_starts: int
) -> VersionLoad:
    mine = [h for h in handles if (h.model_id, h.version) == (model_id, version)]
    entries = [(h, w) for h in mine if (w := pool.get(h.worker_id)) is not None]
    serving = [w for _, w in entries if w.status is WorkerStatus.WARM]
    standby = [w for _, w in entries if w.status is WorkerStatus.STANDBY]
    starting = sum(w.status is WorkerStatus.STARTING for _, w in entries) + pending_starts
    draining = sum(w.status is WorkerStatus.DRAINING for _, w in entries)
    sizes = {h.worker_id: h.stats.kv_blocks_total * h.stats.block_size for h, _ in entries if h.stats is not None}
    known = [n for n in sizes.values() if n > 0]
    # a promoted worker's stats are known (the poller polls the pool too); a worker that has
    # not answered yet counts like its siblings, so one missing poll does not spike the signal
    typical = max(known) if known else 0
    capacity = sum(sizes.get(w.worker_id) or typical for w in serving)
    inflight = sum(w.dispatched_tokens for w in serving)
    return VersionLoad(model_id, version, serving, standby, starting, draining, capacity, inflight)


def observations(loads: list[VersionLoad], demand: Demand) -> dict[tuple[str, str], FleetObservation]:
    """Each version's observation, with the queue shared out (see the module docstring)."""
    total_inflight = sum(v.inflight_tokens for v in loads)
    # while nothing is in flight the queue goes evenly to the loads that have capacity: a share
    # handed to one without a serving worker would vanish (its signal is 0 whatever it holds)
    sharers = [v for v in loads if v.capacity_tokens > 0] or loads
    out: dict[tuple[str, str], FleetObservation] = {}
    for v in loads:
        if total_inflight:
            share = v.inflight_tokens / total_inflight
        else:
            share = 1.0 / len(sharers) if any(v is s for s in sharers) else 0.0
        queued, batch = demand.queued_tokens * share, demand.batch_queued_tokens * share
        if v.capacity_tokens > 0:
            signal, batch_signal = (queued + v.inflight_tokens) / v.capacity_tokens, batch / v.capacity_tokens
        else:
            signal = batch_signal = 0.0  # nothing serves: the policy restores the count (REPLACE)
        out[(v.model_id, v.version)] = FleetObservation(
            signal=signal,
            serving=len(v.serving),
            warm=len(v.standby),
            starting=v.starting,
            draining=v.draining,
            batch_signal=min(batch_signal, signal),
        )
    return out
