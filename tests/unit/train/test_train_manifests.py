"""deploy/k8s/train: renders with the real `kubectl kustomize`, every object validates against the
Kubernetes schemas (strict), torchrun's own parser accepts the Job's command, and the pieces
agree: the rendezvous endpoint is pod 0 of the Job behind the headless Service, the world the
Job forms fits the settings file (which sluice's own loader accepts), the run folder is on the
shared volume, and the image installs what training needs."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from sluice.train.settings import load_settings
from tests.system.deploy.test_deploy import K8S_VERSION

ROOT = Path(__file__).resolve().parents[3]
TRAIN = ROOT / "deploy" / "k8s" / "train"
KUBECTL = shutil.which("kubectl")


@pytest.fixture(scope="module")
def objs() -> list[dict]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed on this machine")
    out = subprocess.run([KUBECTL, "kustomize", str(TRAIN)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(objs: list[dict], kind: str) -> dict:
    (obj,) = [o for o in objs if o["kind"] == kind]
    return obj


def _env(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_every_object_validates(objs):
    assert {"Namespace", "Job", "Service", "PersistentVolumeClaim", "ConfigMap"} == {o["kind"] for o in objs}
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    bad = {**_one(objs, "Job"), "spec": {**_one(objs, "Job")["spec"], "completions": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):  # the check would catch a mistake
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_the_job_forms_one_torchrun_group_through_the_headless_service(objs):
    from torch.distributed.run import get_args_parser

    job, service = _one(objs, "Job"), _one(objs, "Service")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = _env(c)
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)] or "JOB-UID", a) for a in c["command"][1:]]
    assert c["command"][0] == "torchrun" and all(not a.startswith("$(") for a in argv)
    args = get_args_parser().parse_args(argv)
    nodes = int(args.nnodes)
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == nodes
    assert (
        args.module and args.training_script == "sluice.train.worker" and importlib.util.find_spec(args.training_script)
    )
    assert args.training_script_args == [env["RUN_DIR"]] and args.rdzv_backend == "c10d" and args.max_restarts > 0
    # pod 0 of the Job, by the name the Job's subdomain gives it, on the Service's port
    host, port = args.rdzv_endpoint.split(":")
    assert (
        host == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
        and pod["subdomain"] == service["metadata"]["name"]
    )
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert int(port) == service["spec"]["ports"][0]["port"] == c["ports"][0]["containerPort"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # restarts need a store per round
    assert {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"} == next(
        e["valueFrom"]["fieldRef"] for e in c["env"] if e["name"] == "JOB_UID"
    )
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] > 30  # the agent's grace
    (prepare,) = pod["initContainers"]
    fail_fast = spec["podFailurePolicy"]["rules"][0]
    assert fail_fast["action"] == "FailJob" and fail_fast["onExitCodes"]["containerName"] == prepare["name"]


def test_the_settings_file_fits_the_job_and_the_volume(objs, tmp_path):
    job, config = _one(objs, "Job"), _one(objs, "ConfigMap")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (prepare,) = pod["initContainers"]
    env = _env(c)
    (tmp_path / "train.toml").write_text(config["data"]["train.toml"])
    s = load_settings(tmp_path / "train.toml", {})  # strict: an unknown key or wrong type fails here
    world = int(env["NNODES"]) * int(env["NPROC_PER_NODE"])
    assert s.nproc == int(env["NPROC_PER_NODE"]) and s.batch_size % world == 0
    assert s.out == env["RUN_DIR"] == _env(prepare)["RUN_DIR"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in (c, prepare):
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert s.out.startswith(mounts["runs"] + "/") and s.data.startswith(mounts["runs"] + "/")
    claim = _one(objs, "PersistentVolumeClaim")
    assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every node writes its shards there
    assert volumes["config"]["configMap"]["name"] == config["metadata"]["name"]  # kustomize's hashed name
    config_dir = {m["name"]: m["mountPath"] for m in prepare["volumeMounts"]}["config"]
    assert f"--config {config_dir}/train.toml --prepare-only" in prepare["args"][0]


def test_the_image_installs_the_training_extra():
    runs = [line for line in (ROOT / "deploy" / "Containerfile").read_text().splitlines() if line.startswith("RUN ")]
    assert any(re.search(r"pip install \S*\.\[train\]", r) for r in runs)
