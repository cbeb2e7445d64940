"""The launcher stays torch-free up to torchrun: every second it spends importing torch (seconds
on a busy machine) comes before any rank can start, at every `sluice train run` and resume.
Checked in a fresh interpreter that walks the launcher's own path: the flags, prepare (the
tokenizer and the data), each replica group's environment, and the monitor's threads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.tiny_models import write_tiny_model

LAUNCHER_PATH = """
import json, sys
from sluice.cli import build_parser
from sluice.cli.train import settings_from_args
from sluice.train import launch
from sluice.train.monitor import Monitor

model, data, out = sys.argv[1:4]
for groups in ("1", "2"):
    args = ["train", "run", "--model", model, "--data", data, "--out", out + groups, "--max-steps", "1",
            "--seq-len", "16", "--nproc", "2", "--replica-groups", groups]
    settings = settings_from_args(build_parser().parse_args(args))
    launch.prepare(settings)
    envs = launch.group_envs(settings, {"A": "1"}, None if groups == "1" else "http://127.0.0.1:1")
    with Monitor(settings, lambda: set()):
        pass
heavy = ("torch", "transformers", "torchft", "safetensors", "tensorboard", "boto3")
print(json.dumps({"envs": envs, "imported": sorted(m for m in heavy if m in sys.modules)}))
"""


def test_the_launcher_reaches_torchrun_without_importing_torch(tmp_path: Path):
    model = write_tiny_model(tmp_path / "m", "llama")
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"line {i} of the data"}) for i in range(8)) + "\n")
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER_PATH, str(model), str(data), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["imported"] == []
    assert result["envs"] == [
        {"A": "1", "SLUICE_REPLICA_GROUP": str(g), "TORCHFT_LIGHTHOUSE": "http://127.0.0.1:1"} for g in (0, 1)
    ]
