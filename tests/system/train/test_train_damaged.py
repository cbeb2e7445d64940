"""A damaged checkpoint is never loaded: every checkpoint carries a manifest of its files' sizes
and sha256 digests, a resume checks what it loads against it, and a damaged newest checkpoint
(64 KiB overwritten mid-file, `.metadata` deleted, a data file cut short) is reported by name in
one line and skipped for the newest intact one, from which the run goes on to the very losses of
the uninterrupted run. Once in one process for each kind of damage, once in a 2-rank group
through `sluice train run` (no traceback, no torchrun restart; a copy of the run a NaN stopped,
shared with test_train_nonfinite.py); the S3 store's case is in
test_train_object_store.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sluice.train.checkpoint import layout
from sluice.train.errors import TrainHaltError
from tests.system.train.conftest import COMMON, NAN_STOP_ARGS, STEPS, losses, run_in_process, run_train

KIB_64 = 64 * 1024


def overwrite_middle(step_dir: Path) -> None:
    """64 KiB of other bytes in the middle of the largest data file, its size unchanged."""
    data = max(step_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)
    size = data.stat().st_size
    assert size > 2 * KIB_64
    with data.open("r+b") as f:
        f.seek(size // 2 - KIB_64 // 2)
        f.write(os.urandom(KIB_64))


def delete_metadata(step_dir: Path) -> None:
    (step_dir / layout.METADATA).unlink()


def truncate_data(step_dir: Path) -> None:
    data = max(step_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)
    os.truncate(data, data.stat().st_size // 2)


def _args(out: Path, chat_data: Path, tiny_folder: Path, steps: int) -> list[str]:
    return [
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "1",
        "--checkpoint-every",
        "2",
        "--keep-checkpoints",
        "3",
        *COMMON,
        "--max-steps",
        str(steps),
    ]


@pytest.fixture(scope="module")
def five_steps(train_dir: Path, tiny_folder: Path, chat_data: Path) -> Path:
    """One process to step 5: checkpoints of steps 2, 4 and 5."""
    out = train_dir / "damaged-base"
    run_in_process(*_args(out, chat_data, tiny_folder, 5))
    assert layout.complete_steps(out / "checkpoints") == [2, 4, 5]
    return out


@pytest.mark.parametrize(
    "damage, problem",
    [
        (overwrite_middle, "differs from its sha256 in manifest.json"),
        (delete_metadata, "has no .metadata: not complete"),
        (truncate_data, "bytes, manifest.json says"),
    ],
)
def test_a_damaged_newest_checkpoint_is_named_and_skipped(
    damage, problem, five_steps, tmp_path, tiny_folder, chat_data, one_run, capfd
):
    out = tmp_path / "run"
    shutil.copytree(five_steps, out)
    newest = layout.step_dir(out / "checkpoints", 5)
    damage(newest)
    capfd.readouterr()
    run_in_process(*_args(out, chat_data, tiny_folder, STEPS))
    err = capfd.readouterr().err
    named = [line for line in err.splitlines() if str(newest) in line]
    assert len(named) == 1 and problem in named[0] and "skipped" in named[0], err[-3000:]
    assert "resumed from step 4" in err and "Traceback" not in err
    assert losses(out) == losses(one_run)  # bit for bit: resumed from step 4's intact state


def test_with_every_checkpoint_damaged_the_run_halts_naming_them(five_steps, tmp_path, tiny_folder, chat_data):
    out = tmp_path / "run"
    shutil.copytree(five_steps, out)
    for step in (2, 4, 5):
        overwrite_middle(layout.step_dir(out / "checkpoints", step))
    with pytest.raises(TrainHaltError, match="no intact checkpoint in"):
        run_in_process(*_args(out, chat_data, tiny_folder, STEPS))


def test_two_ranks_skip_a_damaged_checkpoint_together(nan_stopped, ddp2_run, tmp_path, tiny_folder, chat_data):
    """A copy of the 2-rank run a NaN stopped at step 5 (conftest.py's nan_stopped), its newest
    checkpoint (step 4) damaged: the same command without the fault skips it for step 2's and
    trains on to the uninterrupted run's losses."""
    out = tmp_path / "nan-stop"
    shutil.copytree(nan_stopped, out)
    assert layout.complete_steps(out / "checkpoints") == [2, 4]
    newest = layout.step_dir(out / "checkpoints", 4)
    overwrite_middle(newest)
    proc = run_train("--data", str(chat_data), "--out", str(out), "--model", str(tiny_folder), *NAN_STOP_ARGS)
    named = [line for line in proc.stderr.splitlines() if str(newest) in line]
    assert len(named) == 1 and "damaged" in named[0], proc.stderr[-3000:]
    assert "resumed from step 2" in proc.stderr
    assert "Traceback" not in proc.stderr and "restart" not in proc.stderr.lower()
    assert losses(out) == losses(ddp2_run)


def test_export_refuses_a_damaged_checkpoint(five_steps, tmp_path):
    from sluice.train.errors import CheckpointError
    from sluice.train.export import export_run

    out = tmp_path / "run"
    shutil.copytree(five_steps, out)
    overwrite_middle(layout.step_dir(out / "checkpoints", 5))
    with pytest.raises(CheckpointError, match=r"step-00000005 is damaged: __0_0.distcp differs from its sha256"):
        export_run(out, tmp_path / "export")
    assert export_run(out, tmp_path / "export", step=4)[0] == 4
