"""The fleet as an operator sees it: the body of `GET /admin/fleet` and `sluice fleet status`.

A plain JSON-able view, computed from the registry (what the file declares), the follower's
snapshot (live weights, version states, the rollout) and the worker pool (each worker's status,
breaker and load as this gateway sees them). `share` is a version's percentage of its model's
weighted traffic right now; a version whose workers cannot take requests loses its share to
the others at routing time, which `workers` shows. `autoscaling` lists each autoscaled version's
last observation (signal, workers by state) and decision (desired counts, reason) and the
actions the local autoscaler ran (autoscaler.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.routing.routing_state import effective_weights

if TYPE_CHECKING:
    from sluice.routing.fleet import Fleet


def fleet_status(fleet: "Fleet") -> dict[str, Any]:
    snapshot = fleet.follower.snapshot
    models: dict[str, Any] = {}
    for model_id, model in fleet.registry.fleet.models.items():
        live = snapshot.model(model_id)
        weights = effective_weights(model, live)
        total = sum(w for w in weights.values() if w > 0)
        rollout = dict(live.rollout) if live.rollout is not None else None
        if rollout is not None:
            rollout["driven_here"] = model_id in fleet.driver.rollouts
        models[model_id] = {
            "aliases": model.aliases,
            "fallbacks": model.fallbacks,
            "live_weights": bool(live.weights),  # False: the file's `traffic` values apply
            "versions": {
                name: {
                    "weights": spec.weights, "traffic": weights.get(name, 0.0),
                    "share": round(100.0 * weights.get(name, 0.0) / total, 2) if total else 0.0,
                    "state": live.state_of(name).value, "replicas": spec.replicas, "workers": spec.workers,
                }
                for name, spec in model.versions.items()
            },
            "rollout": rollout,
        }
    workers = []
    groups = fleet.router.prefix_groups()
    for h in fleet.handles.values():
        w = fleet.pool.get(h.worker_id)
        if w is None:
            continue
        pid = h.supervisor.worker.pid if h.supervisor is not None and h.supervisor.worker is not None else None
        workers.append({
            "id": h.worker_id, "model": h.model_id, "version": h.version, "status": w.status.value,
            "breaker": w.breaker.state.value, "inflight": w.inflight, "load_tokens": w.load_tokens,
            "local": h.supervisor is not None, "pid": pid,
            "restarts": h.supervisor.restarts if h.supervisor is not None else 0,
            "prefix_groups": groups.get(h.worker_id, 0),  # prefixes this gateway's router placed there
        })
    return {"models": models, "workers": workers, "autoscaling": fleet.autoscaler.status(), "routing_revision": snapshot.revision,
            "fleet_file": str(fleet.registry.source) if fleet.registry.source is not None else None,
            "reloads": fleet.registry.generation}
