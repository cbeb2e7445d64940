"""One group at a time on a run folder: while one `sluice train run` trains, a second on the same
--out is refused with one `sluice: error:` line naming the first group's leader, and the first
goes on untouched; after kill -9 of the first group, the same command takes the lease over at
once (its holder's process is gone from this host) and resumes from its newest checkpoint."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time

import psutil

from sluice.train.checkpoint import layout
from tests.system.train.conftest import COMMON, RUN_TIMEOUT_S, run_train, train_cmd

WAIT_S = 240  # bounded waits, generous for two busy cores


def _lines(out) -> int:
    path = out / "metrics.jsonl"
    return len([json.loads(x) for x in path.read_text().splitlines()]) if path.exists() else 0


def _wait_for(predicate, what: str, proc: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert proc.poll() is None, f"the first group exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def _kill_tree(proc: subprocess.Popen) -> None:
    """kill -9 of the launcher, torchrun and the ranks (in sessions of their own) at once."""
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def test_a_second_group_is_refused_and_a_killed_one_is_taken_over(train_dir, tiny_folder, chat_data, tmp_path):
    out = train_dir / "leased"
    args = [
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        *COMMON,
        "--nproc",
        "1",
        "--checkpoint-every",
        "2",
        "--lease-timeout",
        "20",
    ]
    log = tmp_path / "first.log"
    with log.open("w") as sink:
        first = subprocess.Popen(
            train_cmd("run", *args, "--max-steps", "1000"),
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SLUICE_TRAIN_FAULT": "delay:0.3"},
            start_new_session=True,
        )
    try:
        _wait_for(lambda: _lines(out) >= 3 and layout.complete_steps(out / "checkpoints"), "3 steps", first, log)
        second = subprocess.run(
            train_cmd("run", *args, "--max-steps", "1000"), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        assert second.returncode == 2, second.stderr[-3000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("sluice: error:")]
        assert len(errors) == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
        found = re.search(
            rf"is held by another group \(its leader: host {re.escape(socket.gethostname())}, "
            r"pid (\d+), since ",
            errors[0],
        )
        assert found, errors[0]
        first_ranks = {p.pid for p in psutil.Process(first.pid).children(recursive=True)}
        assert int(found.group(1)) in first_ranks, "the holder named is the first group's rank 0"
        done = _lines(out)
        _wait_for(lambda: _lines(out) >= done + 2, "the first group going on", first, log)
        _kill_tree(first)
    finally:
        if first.poll() is None:
            _kill_tree(first)
    newest = layout.complete_steps(out / "checkpoints")[-1]
    third = run_train(*args, "--max-steps", str(newest + 4))
    assert "took over the lease" in third.stderr and "that process no longer runs" in third.stderr, third.stderr[-3000:]
    resumed = re.search(r"resumed from step (\d+)", third.stderr)
    # kill -9 may have cut a checkpoint's publication short: the next start publishes it
    assert resumed and int(resumed.group(1)) >= newest, third.stderr[-3000:]
    assert not (out / "checkpoints" / "lease.json").exists(), "released at the end"
