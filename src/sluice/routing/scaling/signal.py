"""The exported scaling signal: one value per model, `sluice_scaling_signal{model}`.

Each model's worker pool scales on its own (a KEDA ScaledObject per worker Deployment reads
`sum(sluice:scaling_signal{model="…"})`), so one model's queue must not scale another's workers.

The number is the local autoscaler's (scaling/observation.py), over all of a model's versions
at once: Σ estimated tokens (the model's share of the admission queue + in flight on its
serving workers) / the KV token capacity of its serving workers. A model's versions are pooled
into one load before the queue is shared out — a ratio of sums, not a sum of the versions'
ratios — because capacity adds up and ratios do not: two versions half full make a model half
full, not full. For a fleet of one model and one version this is exactly the autoscaler's
signal, and the gateway-wide `(queued + in flight) / capacity` of the admission queue.

The multi-gateway contract (docs/DEPLOY.md) holds per model: every gateway divides its own
queued + in-flight tokens by the capacity of the same serving workers, so Prometheus sums the
replicas' values into the model's signal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sluice.routing.dispatch.health_poller import WorkerHandle
from sluice.routing.dispatch.worker_pool import WorkerPool
from sluice.routing.scaling.observation import Demand, VersionLoad, observations, version_load

MODEL_WIDE = ""  # the version field of a model's pooled load


def model_load(
    model_id: str, versions: Iterable[str], pool: WorkerPool, handles: Iterable[WorkerHandle]
) -> VersionLoad:
    """Every version's load of the model added into one (version `MODEL_WIDE`)."""
    handles = list(handles)
    parts = [version_load(model_id, v, pool, handles, pending_starts=0) for v in versions]
    return VersionLoad(
        model_id,
        MODEL_WIDE,
        serving=[w for p in parts for w in p.serving],
        standby=[w for p in parts for w in p.standby],
        starting=sum(p.starting for p in parts),
        draining=sum(p.draining for p in parts),
        capacity_tokens=sum(p.capacity_tokens for p in parts),
        inflight_tokens=sum(p.inflight_tokens for p in parts),
    )


def model_signals(
    models: Mapping[str, Iterable[str]], pool: WorkerPool, handles: Iterable[WorkerHandle], demand: Demand
) -> dict[str, float]:
    """model id -> its scaling signal, for every model in `models` (model id -> version names);
    a model with no serving worker reads 0 (nothing to scale from)."""
    handles = list(handles)
    loads = [model_load(m, versions, pool, handles) for m, versions in models.items()]
    if not loads:
        return {}
    return {model: obs.signal for (model, _), obs in observations(loads, demand).items()}
