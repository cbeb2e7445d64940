"""A non-finite loss or gradient norm never becomes a checkpoint: under `nonfinite = "stop"` (the
default) the run stops before the step's update with one `sluice: error:` line and is not
restarted, its newest checkpoint the last good step's (its resume, to the losses of the
uninterrupted run, is in test_train_damaged.py); under `"skip"` the step's update is dropped and
the run goes on. metrics.jsonl stays strict JSON (null for a value that is not finite).
Deterministic faults (train/faults.py): `nan_loss:STEP` (loss and gradients NaN), `inf_grad:STEP`
(one gradient infinite, the loss finite)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from sluice.train.checkpoint import layout
from tests.system.train.conftest import COMMON, NAN_STEP, STEPS, losses, run_in_process, train_cmd


def _strict_lines(run: Path) -> list[dict]:
    def refuse(constant: str) -> None:
        raise ValueError(f"metrics.jsonl holds {constant}, which is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_nan_loss_stops_the_run_before_it_is_saved(train_dir, nan_stopped):
    """The stop itself; its resume to the uninterrupted run's losses (past a damaged checkpoint
    too) is test_train_damaged.py's test_two_ranks_skip_a_damaged_checkpoint_together."""
    err = (train_dir / "nan-stop.stderr").read_text()  # the fixture checked the exit status: 2
    errors = [line for line in err.splitlines() if line.startswith("sluice: error:")]
    assert len(errors) == 1 and f"step {NAN_STEP}: the loss is nan and the gradient norm is nan" in errors[0], err[
        -3000:
    ]
    assert "step-00000004" in errors[0] and "Traceback" not in err
    assert err.count("starting at step 0") == 1, "torchrun did not restart the group"
    lines = _strict_lines(nan_stopped)
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5]
    assert lines[-1]["loss"] is None and lines[-1]["grad_norm"] is None and lines[-1]["skipped"] is True
    assert layout.complete_steps(nan_stopped / "checkpoints") == [2, 4], "the NaN step was never saved"


def _model_state(step_dir: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = step_dir.parent.parent / f"{step_dir.name}.pt"
    dcp_to_torch_save(step_dir, target)
    return torch.load(target, weights_only=False)["model"]


def test_skip_drops_the_steps_update_and_goes_on(train_dir, tiny_folder, chat_data, one_run, monkeypatch, capfd):
    out = train_dir / "nan-skip"
    monkeypatch.setenv("SLUICE_TRAIN_FAULT", "inf_grad:3,nan_loss:5")
    run_in_process(
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "1",
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        str(STEPS),
        "--nonfinite",
        "skip",
        *COMMON,
    )
    err = capfd.readouterr().err
    assert "step 3: the loss or the gradient norm is not finite: its update was skipped" in err
    lines = _strict_lines(out)
    assert [m["step"] for m in lines] == list(range(1, STEPS + 1))
    assert [m["step"] for m in lines if m["skipped"]] == [3, 5]
    assert lines[2]["grad_norm"] is None and lines[2]["loss"] == losses(one_run)[2], "step 3's loss was finite"
    assert lines[4]["loss"] is None and lines[4]["grad_norm"] is None
    assert all(m["loss"] is not None for m in lines if not m["skipped"])
    ckpts = out / "checkpoints"
    assert layout.complete_steps(ckpts) == list(range(1, STEPS + 1))
    # a skipped step leaves the weights as they were; the others move them
    two, three, four = (_model_state(layout.step_dir(ckpts, s)) for s in (2, 3, 4))
    assert all(torch.equal(two[k], three[k]) for k in two)
    assert not all(torch.equal(three[k], four[k]) for k in three)
    assert all(torch.isfinite(v).all() for v in _model_state(layout.step_dir(ckpts, STEPS)).values())


@pytest.mark.parametrize("value", ["nan", "stop,skip"])
def test_the_setting_is_checked(value, chat_data, tmp_path):
    proc = subprocess.run(
        train_cmd(
            "run", "--data", str(chat_data), "--out", str(tmp_path / "r"), "--max-steps", "1", "--nonfinite", value
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--nonfinite" in proc.stderr and "Traceback" not in proc.stderr
