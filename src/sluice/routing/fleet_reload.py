"""Applying a reloaded fleet file to the running fleet (SIGHUP, `POST /admin/fleet/reload`).

Two steps around `Registry.reload`, so that a reload is all or nothing:

1. `check_reload(fleet, new)` before the swap: what makes the new file unfit for *this*
   running fleet beyond the file's own checks — a version's weights whose tokenizer the
   gateway cannot load (it renders every prompt), or a version with running workers whose
   identity (`IDENTITY_FIELDS`) changed. A version is immutable while it runs: the header
   `model/version` must mean the same weights on every gateway, so new weights or engine
   settings are a new version and a rollout. Any problem refuses the whole reload.
2. `apply_reload(fleet)` after the swap: per-version runtimes (tokenizers), remote workers
   that joined (connected; the health poller warms them before they take traffic) and left
   (drained, then disconnected — never stopped: they are not ours), per-version load limits,
   the quota store when the new file is the first with quotas, and the local replicas
   (reconcile: new versions that carry traffic start, removed ones drain and stop).

Routing settings (`[routing]`) apply to the next request; `[routing.breaker]` to workers that
join after the reload; `[rollout]` to the next rollout.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sluice.routing.fleet_file import dotted_path
from sluice.routing.fleet_schema import FleetSpec
from sluice.routing.quota import make_quota_store

if TYPE_CHECKING:
    from sluice.routing.fleet import Fleet


def has_quotas(fleet: FleetSpec) -> bool:
    return any(p.quota is not None for m in fleet.models.values() for p in m.tiers.values())

IDENTITY_FIELDS = ("weights", "dtype", "engine", "fault_injection")


async def check_reload(fleet: "Fleet", new: FleetSpec) -> list[str]:
    """The problems (`field.path: why`, empty when fit), loading the new versions' tokenizers."""
    problems = []
    old = fleet.registry.fleet.models
    running = {(h.model_id, h.version) for h in fleet.handles.values()}
    for model_id, model in new.models.items():
        for name, spec in model.versions.items():
            loc = ("models", model_id, "versions", name)
            before = old[model_id].versions.get(name) if model_id in old else None
            if before is not None and (model_id, name) in running:
                for f in IDENTITY_FIELDS:
                    if getattr(before, f) != getattr(spec, f):
                        problems.append(f"{dotted_path((*loc, f))}: cannot change while the version has workers; "
                                        "add a new version and roll out to it")
            try:
                await asyncio.to_thread(fleet.tokenizer_for, spec)
            except Exception as exc:
                problems.append(f"{dotted_path((*loc, 'weights'))}: {exc}")
    return problems


async def apply_reload(fleet: "Fleet") -> dict[str, list[str]]:
    """Bring the running fleet in step with the registry's fleet; returns what changed."""
    spec = fleet.registry.fleet
    declared = {(m, v): vs for m, model in spec.models.items() for v, vs in model.versions.items()}
    fleet.sync_versions(declared)
    remote = {addr: key for key, vs in declared.items() for addr in vs.workers}
    added: list[str] = []
    removed: list[str] = []
    for h in [h for h in fleet.handles.values() if (w := fleet.pool.get(h.worker_id)) is not None and w.remote]:
        where = remote.get(h.address)
        if where is None:
            removed.append(fleet.replicas.retire(h.worker_id, "no longer in the fleet file"))
        elif where != (h.model_id, h.version) and not fleet.replicas.retiring(h.worker_id):
            await fleet.replicas.drop(h)  # moved to another version: it rejoins there below
            removed.append(h.worker_id)
    for addr, (m, v) in remote.items():
        if addr not in fleet.handles:
            fleet.add_remote(m, v, addr)
            added.append(addr)
    for h in fleet.handles.values():
        if (w := fleet.pool.get(h.worker_id)) is not None and (vs := declared.get((h.model_id, h.version))):
            w.max_outstanding_tokens = vs.max_outstanding_tokens
    fleet.pool.breaker_config = spec.routing.breaker.config()
    if fleet.quota is None and has_quotas(spec):
        fleet.quota = fleet.router.quota = make_quota_store(fleet.settings.limits_store, fleet.settings.redis_url)
    starting, stopping = fleet.replicas.reconcile()
    return {"workers_added": added, "workers_removed": removed, "replicas_starting": starting,
            "replicas_stopping": stopping}
