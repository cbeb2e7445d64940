"""deploy/k8s/search: renders with the real `kubectl kustomize`, every object validates against
the Kubernetes schemas (strict) and the ScaledObject against KEDA's, both router configs pass
sluice's own config check, and the configs name exactly the StatefulSets' pods."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sluice.search.router.config import parse_config
from tests.system.deploy.test_deploy import K8S_VERSION, _keda_schema

ROOT = Path(__file__).resolve().parents[3]
SEARCH = ROOT / "deploy" / "k8s" / "search"
KUBECTL = shutil.which("kubectl")


@pytest.fixture(scope="module")
def objs():
    if KUBECTL is None:
        pytest.skip("kubectl is not installed on this machine")
    out = subprocess.run([KUBECTL, "kustomize", str(SEARCH)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_every_object_validates(objs):
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap", "ScaledObject"} <= {o["kind"] for o in objs}
    for o in objs:
        if o["apiVersion"].startswith("keda.sh/"):
            jsonschema.Draft202012Validator(_keda_schema()).validate(o)
        else:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_router_configs_name_the_statefulset_pods(objs):
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    sets = {o["metadata"]["name"]: o["spec"]["replicas"] for o in objs if o["kind"] == "StatefulSet"}
    for name in ("search.toml", "search-writer.toml"):
        cfg = parse_config(cm["data"][name], name)
        for shard in cfg.shards:
            want = [f"search-{shard.name}-{i}.search-{shard.name}:8200" for i in range(sets[f"search-{shard.name}"])]
            assert shard.replicas == want
        assert cfg.search.accept_writes is (name == "search-writer.toml")
    (writer,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "search-writer"]
    assert writer["spec"]["replicas"] == 1 and writer["spec"]["strategy"]["type"] == "Recreate"
    (so,) = [o for o in objs if o["kind"] == "ScaledObject"]
    assert so["spec"]["scaleTargetRef"]["name"] == "search-router"
