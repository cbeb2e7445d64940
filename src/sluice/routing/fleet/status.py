"""The fleet as an operator sees it: the body of `GET /admin/fleet` and `sluice fleet status`.

A plain JSON-able view, computed from the registry (what the file declares), the follower's
snapshot (live weights, version states, the rollout) and the worker pool (each worker's status,
breaker and load as this gateway sees them). `share` is a version's percentage of its model's
weighted traffic right now; a version whose workers cannot take requests loses its share to
the others at routing time, which `workers` shows. `autoscaling` lists each autoscaled version's
last observation (signal, workers by state) and decision (desired counts, reason) and the
actions the local autoscaler ran (fleet/autoscaler.py).
"""

from __future__ import annotations

from typing import Any

from sluice.routing.fleet.members import FleetMembers
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.state.routing_state import RoutingSnapshot, effective_weights


def fleet_status(
    registry: Registry,
    snapshot: RoutingSnapshot,
    driven_here: set[str],
    prefix_groups: dict[str, int],
    members: FleetMembers,
    autoscaling: list[dict[str, Any]],
) -> dict[str, Any]:
    """`driven_here`: the models whose rollout this gateway drives; `prefix_groups`: worker id ->
    prefixes this gateway's router placed there; `autoscaling`: the autoscaler's own status."""
    models: dict[str, Any] = {}
    for model_id, model in registry.fleet.models.items():
        live = snapshot.model(model_id)
        weights = effective_weights(model, live)
        total = sum(w for w in weights.values() if w > 0)
        rollout = dict(live.rollout) if live.rollout is not None else None
        if rollout is not None:
            rollout["driven_here"] = model_id in driven_here
        models[model_id] = {
            "aliases": model.aliases,
            "fallbacks": model.fallbacks,
            "live_weights": bool(live.weights),  # False: the file's `traffic` values apply
            "versions": {
                name: {
                    "weights": spec.weights,
                    "traffic": weights.get(name, 0.0),
                    "share": round(100.0 * weights.get(name, 0.0) / total, 2) if total else 0.0,
                    "state": live.state_of(name).value,
                    "replicas": spec.replicas,
                    "workers": spec.workers,
                    **({"adapter": spec.adapter, "base": spec.base} if spec.is_adapter else {}),
                }
                for name, spec in model.versions.items()
            },
            "rollout": rollout,
        }
    workers = []
    for h in members.handles.values():
        w = members.pool.get(h.worker_id)
        if w is None:
            continue
        pid = h.supervisor.worker.pid if h.supervisor is not None and h.supervisor.worker is not None else None
        workers.append(
            {
                "id": h.worker_id,
                "model": h.model_id,
                "version": h.version,
                "status": w.status.value,
                "breaker": w.breaker.state.value,
                "inflight": w.inflight,
                "load_tokens": w.load_tokens,
                "local": h.supervisor is not None,
                "pid": pid,
                "restarts": h.supervisor.restarts if h.supervisor is not None else 0,
                "prefix_groups": prefix_groups.get(h.worker_id, 0),  # prefixes this gateway's router placed there
            }
        )
    return {
        "models": models,
        "workers": workers,
        "autoscaling": autoscaling,
        "routing_revision": snapshot.revision,
        "fleet_file": str(registry.source) if registry.source is not None else None,
        "reloads": registry.generation,
    }
