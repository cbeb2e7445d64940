"""A rank that stops making progress (SIGSTOP: every thread frozen, the process alive, its peers
blocked in a collective) is reported by rank, host and pid by the launcher's watchdog within the
configured bound (3 s here; the default 60 s), killed, and the job restarts from its newest
checkpoint: never a silent hang. The launcher's terminal shows the step lines and the fault."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

from tests.system.train.conftest import COMMON, RUN_TIMEOUT_S, train_cmd

WAIT_S = 240  # bounded waits, generous for two busy cores (no assertion on how long anything took)


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_stopped_rank_is_reported_by_rank_and_host_and_the_job_restarts(train_dir, tiny_folder, chat_data):
    out = train_dir / "hang"
    args = [
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        "--nproc",
        "2",
        "--checkpoint-every",
        "2",
        "--hang-timeout",
        "3",
        "--progress-interval",
        "0",
        *COMMON,
    ]
    args[args.index("--max-steps") + 1] = "1000"
    env = {**os.environ, "SLUICE_TRAIN_FAULT": "delay:0.3"}
    # the launcher's lines go to a file: a pipe nobody reads until the end would fill up
    log = (train_dir / "hang.stderr").open("w")
    proc = subprocess.Popen(train_cmd("run", *args), env=env, stderr=log, text=True)
    stopped = None
    try:
        metrics, events = out / "metrics.jsonl", out / "events.jsonl"
        _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "three steps")
        stopped = json.loads((out / "heartbeats" / "g0-r1.json").read_text())["pid"]
        os.kill(stopped, signal.SIGSTOP)
        _wait_for(lambda: '"restart": 1' in events.read_text(), "the restarted job")
        proc.send_signal(signal.SIGTERM)  # end the long run: it checkpoints and exits
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)  # in case the watchdog did not
            except ProcessLookupError:
                pass
    err = (train_dir / "hang.stderr").read_text()
    assert proc.returncode == 0, err[-3000:]
    host = socket.gethostname()
    assert f"[fault] rank 1 of group 0 on host {host} (pid {stopped}) made no progress for 3 s (hang_timeout)" in err
    assert "killed; torchrun restarts the job from the newest checkpoint" in err
    assert "[recovery] the ranks restarted by torchrun (attempt 2)" in err
    assert "step 3/1000 | loss" in err
    (hang,) = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "hang"]
    assert (hang["rank"], hang["host"], hang["pid"]) == (1, host, stopped)
