"""Applying a reloaded fleet file to the running fleet (SIGHUP, `POST /admin/fleet/reload`).

Two steps around `Registry.reload`, so that a reload is all or nothing:

1. `check_reload(old, new, running, tokenizer_for)` before the swap: what makes the new file unfit for *this*
   running fleet beyond the file's own checks — a version's weights whose tokenizer the
   gateway cannot load (it renders every prompt), or a version with running workers whose
   identity (`IDENTITY_FIELDS`) changed. A version is immutable while it runs: the header
   `model/version` must mean the same weights on every gateway, so new weights or engine
   settings are a new version and a rollout. Any problem refuses the whole reload.
2. `apply_reload(spec, members, replicas, runtimes)` after the swap: per-version runtimes (tokenizers), remote workers
   that joined (connected; the health poller warms them before they take traffic) and left
   (drained, then disconnected — never stopped: they are not ours), per-version load limits,
   and the local replicas
   (reconcile: new versions that carry traffic start, removed ones drain and stop). The
   quota store, when the new file is the first with quotas, is the Fleet's own step.

Routing settings (`[routing]`) apply to the next request; `[routing.breaker]` to workers that
join after the reload; `[rollout]` to the next rollout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.models.tokenizer import Tokenizer
from sluice.routing.fleet.local_replicas import LocalReplicas
from sluice.routing.fleet.members import FleetMembers
from sluice.routing.fleet.versions import VersionRuntimes
from sluice.routing.fleet_file.adapters import adapter_bases
from sluice.routing.fleet_file.loader import dotted_path
from sluice.routing.fleet_file.schema import FleetSpec, VersionSpec


def has_quotas(fleet: FleetSpec) -> bool:
    return any(p.quota is not None for m in fleet.models.values() for p in m.tiers.values())


IDENTITY_FIELDS = ("weights", "dtype", "engine", "fault_injection", "adapter", "base")


async def check_reload(
    old: FleetSpec, new: FleetSpec, running: set[tuple[str, str]], tokenizer_for: Callable[[VersionSpec], Tokenizer]
) -> list[str]:
    """The problems (`field.path: why`, empty when fit), loading the new versions' tokenizers.
    `running`: the (model, version) pairs that have workers now."""
    problems = []
    bases = adapter_bases(new)
    for model_id, model in new.models.items():
        for name, spec in model.versions.items():
            loc = ("models", model_id, "versions", name)
            before = old.models[model_id].versions.get(name) if model_id in old.models else None
            # an adapter version serves while its base has workers
            if before is not None and bases.get((model_id, name), (model_id, name)) in running:
                for f in IDENTITY_FIELDS:
                    if getattr(before, f) != getattr(spec, f):
                        problems.append(
                            f"{dotted_path((*loc, f))}: cannot change while the version has workers; "
                            "add a new version and roll out to it"
                        )
            if spec.is_adapter:
                continue  # its base's tokenizer (checked with the base)
            try:
                await asyncio.to_thread(tokenizer_for, spec)
            except Exception as exc:
                problems.append(f"{dotted_path((*loc, 'weights'))}: {exc}")
    return problems


def runtime_specs(spec: FleetSpec) -> dict[tuple[str, str], VersionSpec]:
    """Every version's spec for its runtime (tokenizer): an adapter version takes its base's."""
    bases = adapter_bases(spec)
    return {
        (m, v): spec.models[b[0]].versions[b[1]] if (b := bases.get((m, v))) else vs
        for m, model in spec.models.items()
        for v, vs in model.versions.items()
    }


async def apply_reload(
    spec: FleetSpec, members: FleetMembers, replicas: LocalReplicas, runtimes: VersionRuntimes
) -> dict[str, list[str]]:
    """Bring the workers in step with the (swapped) fleet file `spec`; returns what changed."""
    declared = {(m, v): vs for m, model in spec.models.items() for v, vs in model.versions.items()}
    members.pool.set_adapter_bases(adapter_bases(spec))
    runtimes.sync(runtime_specs(spec))
    remote = {addr: key for key, vs in declared.items() for addr in vs.workers}
    added: list[str] = []
    removed: list[str] = []
    pool, handles = members.pool, members.handles
    for h in [h for h in handles.values() if (w := pool.get(h.worker_id)) is not None and w.remote]:
        where = remote.get(h.address)
        if where is None:
            removed.append(replicas.retire(h.worker_id, "no longer in the fleet file"))
        elif where != (h.model_id, h.version) and not replicas.retiring(h.worker_id):
            await replicas.drop(h)  # moved to another version: it rejoins there below
            removed.append(h.worker_id)
    for addr, (m, v) in remote.items():
        if addr not in handles:
            members.add_remote(m, v, addr)
            added.append(addr)
    for h in handles.values():
        if (w := pool.get(h.worker_id)) is not None and (vs := declared.get((h.model_id, h.version))):
            w.max_outstanding_tokens = vs.max_outstanding_tokens
    pool.breaker_config = spec.routing.breaker.config()
    starting, stopping = replicas.reconcile()
    return {
        "workers_added": added,
        "workers_removed": removed,
        "replicas_starting": starting,
        "replicas_stopping": stopping,
    }
