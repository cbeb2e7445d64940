"""The Kubernetes driver of the scaling policy: `ScalingSettings` as a KEDA ScaledObject.

KEDA feeds the signal of the model the worker Deployment serves,
`sum(sluice:scaling_signal{model="…"})` (the recording rule over `sluice_scaling_signal{model}`),
to the HPA as a `Value` metric with target `scale_up_at`, so the HPA computes the same count the
local policy does: `ceil(replicas × signal / scale_up_at)` — and another model's queue never
scales these workers. Which model: the one whose fleet-file version lists the Deployment's
Service as its workers (`worker_model`; deploy/generate.py reads deploy/k8s/base/fleet.toml).
The rest of the policy maps onto HPA and KEDA fields:
- hysteresis → the HPA's per-direction tolerance (`HPAConfigurableTolerance`, beta since
  Kubernetes 1.35): scale-up tolerance 0 (up above `scale_up_at`), scale-down tolerance
  `1 − scale_down_at / scale_up_at` (down below `scale_down_at`). A cluster without the
  feature drops the field and uses its 10 % default; the stabilization window still applies.
- `down_cooldown_s` → scale-down stabilization window (the highest recommendation of the last
  window wins, i.e. down only after a full low window) and one `max_step_down` per window.
- `up_cooldown_s`, `max_step_up` → at most `max_step_up` pods per `up_cooldown_s`.
- warm pool → `minReplicaCount` = min_serving + the schedule's smallest pool, and one cron
  trigger per larger window (HPA takes the highest of its triggers). In Kubernetes every ready
  worker serves; the warm pool is loaded headroom above demand, not idle standby (docs/DEPLOY.md).
- `max_workers` → `maxReplicaCount`.
`deploy/generate.py` writes the result into the kustomize base; a test checks it is current.
"""

from __future__ import annotations

import math
from typing import Any

from sluice.routing.fleet_file.scaling_settings import ScalingSettings
from sluice.routing.fleet_file.schema import FleetSpec
from sluice.routing.fleet_file.warm_pool_schedule import WarmPoolWindow

DEFAULT_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
# HPA API bounds (autoscaling/v2 HPAScalingRules)
_MAX_PERIOD_S = 1800
_MAX_STABILIZATION_S = 3600


def signal_query(model: str) -> str:
    """KEDA's query: the model's signal summed over the gateway replicas (the recording rule
    already sums them per model; the outer sum makes a missing label set one value)."""
    escaped = model.replace("\\", "\\\\").replace('"', '\\"')
    return f'sum(sluice:scaling_signal{{model="{escaped}"}})'


def worker_model(fleet: FleetSpec, service: str) -> str:
    """The model whose workers are the Service `service` (a version lists `service:port`,
    `dns:///service:port` or `service.<namespace>…:port`); exactly one must."""
    found = {
        model_id
        for model_id, model in fleet.models.items()
        for version in model.versions.values()
        for address in version.workers
        if _host(address).split(".")[0] == service
    }
    if len(found) != 1:
        raise ValueError(
            f"the fleet file must name the Service {service!r} as the workers of exactly one model "
            f"(found: {sorted(found) or 'none'}); one worker Deployment serves one model"
        )
    return found.pop()


def _host(address: str) -> str:
    rest = address.split("://", 1)[-1].lstrip("/")
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def scaled_object(
    settings: ScalingSettings,
    *,
    model: str,
    name: str = "sluice-worker",
    target: str = "sluice-worker",
    prometheus_url: str = DEFAULT_PROMETHEUS,
    polling_interval_s: int = 15,
) -> dict[str, Any]:
    """The ScaledObject of the worker Deployment `target`, which serves `model`."""
    s = settings
    floor = min(s.max_workers, s.min_serving + s.warm_pool.smallest)
    triggers: list[dict[str, Any]] = [
        {
            "type": "prometheus",
            "name": "scaling-signal",
            "metricType": "Value",
            "metadata": {
                "serverAddress": prometheus_url,
                "query": signal_query(model),
                "threshold": _decimal(s.scale_up_at),
                # no series (Prometheus lost the gateways) is an error → fallback, not "load 0"
                "ignoreNullValues": "false",
            },
        }
    ]
    triggers += _cron_triggers(s, floor)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": "worker"},
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "pollingInterval": polling_interval_s,
            "cooldownPeriod": int(s.down_cooldown_s),
            "minReplicaCount": floor,
            "maxReplicaCount": s.max_workers,
            # Prometheus unreachable three polls in a row: keep what runs (never less than the floor)
            "fallback": {"failureThreshold": 3, "replicas": floor, "behavior": "currentReplicasIfHigher"},
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(s)}},
            "triggers": triggers,
        },
    }


def _behavior(s: ScalingSettings) -> dict[str, Any]:
    up_period = _bounded("up_cooldown_s", max(1, math.ceil(s.up_cooldown_s)), _MAX_PERIOD_S)
    down_window = _bounded("down_cooldown_s", math.ceil(s.down_cooldown_s), _MAX_STABILIZATION_S)
    down_period = _bounded("down_cooldown_s", max(1, down_window), _MAX_PERIOD_S)
    # floor to a thousandth: the HPA then scales down just above scale_down_at, never later
    down_tolerance = math.floor(s.scale_down_tolerance * 1000) / 1000
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "tolerance": "0",
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": s.max_step_up, "periodSeconds": up_period}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": down_window,
            "tolerance": _decimal(down_tolerance),
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": s.max_step_down, "periodSeconds": down_period}],
        },
    }


def _cron_triggers(s: ScalingSettings, floor: int) -> list[dict[str, Any]]:
    windows = s.warm_pool.windows
    out = []
    for i, w in enumerate(windows):
        replicas = min(s.max_workers, s.min_serving + w.size)
        if replicas <= floor:
            continue  # the floor already holds it
        nxt = windows[(i + 1) % len(windows)]
        out.append(
            {
                "type": "cron",
                "name": f"warm-pool-{w.start.replace(':', '')}",
                "metadata": {
                    "timezone": s.warm_pool.timezone,
                    "start": _cron(w),
                    "end": _cron(nxt),
                    "desiredReplicas": str(replicas),
                },
            }
        )
    return out


def _cron(w: WarmPoolWindow) -> str:
    hh, mm = w.start.split(":")
    return f"{int(mm)} {int(hh)} * * *"


def _decimal(x: float) -> str:
    return f"{x:.6f}".rstrip("0").rstrip(".") or "0"


def _bounded(setting: str, value: int, limit: int) -> int:
    if value > limit:
        raise ValueError(f"{setting}: {value} s is more than the Kubernetes HPA accepts ({limit} s)")
    return value
