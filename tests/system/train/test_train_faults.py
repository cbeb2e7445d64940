"""Fault tolerance: a rank killed with SIGKILL mid-run is restarted by torchrun and the run resumes
from its last checkpoint with every later loss equal to the uninterrupted run's; SIGTERM (a spot
notice) writes a checkpoint and exits cleanly, and the next start resumes from it, here on a
different world size (2 → 1, resharded on load, the global batch kept)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from sluice.train.checkpoint import layout
from tests.system.train.conftest import COMMON, STEPS, losses, run_in_process, run_train, train_cmd

WAIT_S = 240  # bounded waits, generous for two busy cores


def test_a_killed_rank_restarts_and_resumes_exactly(train_dir, tiny_folder, chat_data, ddp2_run):
    out = train_dir / "crash"
    # rank 1 dies by SIGKILL at the start of step 6; the newest checkpoint is step 3's (every 3)
    proc = run_train(
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "2",
        "--checkpoint-every",
        "3",
        "--max-restarts",
        "2",
        *COMMON,
        env={"SLUICE_TRAIN_FAULT": "kill:1:6"},
    )
    assert "resumed from step 3" in proc.stderr
    assert losses(out) == losses(ddp2_run)  # the same floats: same rows, optimizer state, order
    assert layout.complete_steps(out / "checkpoints") == [6, STEPS]  # keep 2


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_sigterm_checkpoints_and_the_next_start_resumes_on_another_world_size(
    train_dir, tiny_folder, chat_data, one_run
):
    out = train_dir / "preempted"
    args = ["--data", str(chat_data), "--out", str(out), "--model", str(tiny_folder), *COMMON]
    args[args.index("--max-steps") + 1] = "1000"
    env = {**os.environ, "SLUICE_TRAIN_FAULT": "delay:0.3"}  # slow steps: the signal lands mid-run
    proc = subprocess.Popen(train_cmd("run", *args, "--nproc", "2"), env=env, stderr=subprocess.PIPE, text=True)
    try:
        metrics = out / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, "two steps")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    stopped = len(losses(out))
    assert 2 <= stopped < STEPS - 1, "the signal stopped the run after the step in flight"
    assert f"stopped: checkpoint at step {stopped}" in err
    assert layout.latest(out / "checkpoints")[0] == stopped
    # the next start, on one process: the same run (resumed, resharded), to STEPS
    args[args.index("--max-steps") + 1] = str(STEPS)
    run_in_process(*args, "--nproc", "1")
    got = losses(out)
    assert len(got) == STEPS
    assert got == pytest.approx(losses(one_run), rel=1e-4)
