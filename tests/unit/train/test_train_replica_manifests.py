"""deploy/k8s/train-replicas: renders with the real `kubectl kustomize`, every object validates
against the Kubernetes schemas (strict), torchrun's own parser accepts each group's command, and
the pieces agree: one pod per replica group (completions = replica_groups), each group's ranks =
nproc / replica_groups, the group number from the pod's completion index, the Lighthouse address
the Service and the Lighthouse's own bind, the settings file loads with sluice's strict loader."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from sluice.train.replica.group_env import GROUP_ENV, LIGHTHOUSE_ENV
from sluice.train.settings import load_settings
from tests.system.deploy.test_deploy import K8S_VERSION

ROOT = Path(__file__).resolve().parents[3]
REPLICAS = ROOT / "deploy" / "k8s" / "train-replicas"
KUBECTL = shutil.which("kubectl")


@pytest.fixture(scope="module")
def objs() -> list[dict]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed on this machine")
    out = subprocess.run([KUBECTL, "kustomize", str(REPLICAS)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(objs: list[dict], kind: str) -> dict:
    (obj,) = [o for o in objs if o["kind"] == kind]
    return obj


def test_every_object_validates(objs):
    assert {"Namespace", "Job", "Deployment", "Service", "PersistentVolumeClaim", "ConfigMap"} == {
        o["kind"] for o in objs
    }
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_each_pod_is_one_replica_group_meeting_at_the_lighthouse(objs, tmp_path):
    from torch.distributed.run import get_args_parser

    job, lighthouse, service = _one(objs, "Job"), _one(objs, "Deployment"), _one(objs, "Service")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    values = {name: e.get("value") for name, e in env.items()}
    args = get_args_parser().parse_args(
        [
            a.replace("$(NPROC_PER_GROUP)", values["NPROC_PER_GROUP"]).replace("$(RUN_DIR)", values["RUN_DIR"])
            for a in c["command"][1:]
        ]
    )
    assert c["command"][0] == "torchrun" and args.standalone and args.module
    assert args.training_script == "sluice.train.worker" and args.training_script_args == [values["RUN_DIR"]]
    assert args.max_restarts > 0  # a crashed rank restarts its own group only
    # the group number is the pod's index in the Job
    assert job["spec"]["completionMode"] == "Indexed"
    assert (
        env[GROUP_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    # the settings: one pod per group, the group's ranks, the run folder
    config = _one(objs, "ConfigMap")
    (tmp_path / "train.toml").write_text(config["data"]["train.toml"])
    s = load_settings(tmp_path / "train.toml", {})
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == s.replica_groups >= 2
    assert int(values["NPROC_PER_GROUP"]) == int(args.nproc_per_node) == s.group_size
    assert s.out == values["RUN_DIR"]
    # the Lighthouse: the Service's name and port, the port the Lighthouse binds, min_replicas 1
    cmd = lighthouse["spec"]["template"]["spec"]["containers"][0]["command"]
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert cmd[0] == "torchft_lighthouse" and flags["--min_replicas"] == "1"
    port = service["spec"]["ports"][0]["port"]
    assert values[LIGHTHOUSE_ENV] == f"http://{service['metadata']['name']}:{port}"
    assert flags["--bind"].endswith(f":{port}")
    assert service["spec"]["selector"].items() <= lighthouse["spec"]["template"]["metadata"]["labels"].items()
    assert shutil.which("torchft_lighthouse") or pytest.importorskip("torchft")  # the image's train extra has it
