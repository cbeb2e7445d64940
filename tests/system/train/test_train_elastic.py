"""Elastic training: an elastic job (`--nnodes 1:2`, one torchrun agent per "machine", here two
agents on this machine) starts on one machine and grows to two when the second joins, loses a
machine (SIGKILL of its whole process tree) and goes on with one rank, then a machine joins and
it goes on with two: each time the group restarts from the newest checkpoint, resharded, with
the global batch kept (micro-batches of 1: 2 accumulated forwards per rank on 2 ranks, 4 on 1),
and the losses equal the uninterrupted run's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from sluice.train.checkpoint import layout
from sluice.train.launch import free_port
from tests.system.train.conftest import COMMON, losses, train_cmd

WAIT_S = 240  # bounded waits, generous for two busy cores


def _wait_for(predicate, what: str, procs) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        for p in procs:
            assert p.poll() is None, f"an agent exited early ({p.returncode}) waiting for {what}:\n{_tail(p)}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "\n".join(_tail(p) for p in procs)
        time.sleep(0.2)


def _log(p: subprocess.Popen) -> str:
    log = getattr(p, "log_path", None)
    return log.read_text() if log and log.exists() else ""


def _tail(p: subprocess.Popen) -> str:
    """The end of an agent's log, so that a failure says why the agent stopped."""
    return f"--- {p.log_path.name} ---\n{_log(p)[-6000:]}"  # type: ignore[attr-defined]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _kill_machine(p: subprocess.Popen) -> None:
    """SIGKILL a launcher, its torchrun agent and its ranks at once (the ranks run in sessions of
    their own, so the process group alone would leave them running)."""
    import psutil

    tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _complete(out) -> list[int]:
    return layout.complete_steps(out / "checkpoints")


def _at(metrics, step: int, world: int) -> bool:
    """The last line written is `step`'s, trained on `world` ranks."""
    lines = _lines(metrics)
    return bool(lines) and (lines[-1]["step"], lines[-1]["world_size"]) == (step, world)


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_machine_leaves_and_one_joins_and_the_run_goes_on(
    train_dir, tiny_folder, chat_data, one_run, tmp_path
) -> None:
    out = train_dir / "elastic"
    port = free_port()
    cmd = train_cmd(
        "run",
        "--data",
        str(chat_data),
        "--out",
        str(out),
        "--model",
        str(tiny_folder),
        *COMMON,
        "--nproc",
        "1",
        "--nnodes",
        "1:2",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--checkpoint-every",
        "2",
        "--micro-batch-size",
        "1",
        "--max-restarts",
        "3",
    )
    # Every membership change at a known step, whatever the machine's speed: the first agent
    # starts alone (the second starts once its 1-rank round runs) and that round waits at step 1
    # for the second machine; the 2-rank group waits at step 4 (checkpoint 2 written) for the
    # test to kill a machine; the 1-rank group after it resumes at step 3 and waits at step 7
    # (checkpoint 6 written) for the test to add one. (Before, the second agent was started as
    # soon as the store listened, and a lone first round could run ahead of it on a busy machine.)
    env = {**os.environ, "SLUICE_TRAIN_FAULT": "hold:1:1,hold:2:4,hold:1:7"}
    procs: list[subprocess.Popen] = []

    def agent(name: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        p.log_path = tmp_path / f"{name}.log"  # type: ignore[attr-defined]
        procs.append(p)
        return p

    metrics = out / "metrics.jsonl"
    try:
        a = agent("a")  # the first hosts the rendezvous store: it must be the one that stays
        _wait_for(lambda: _listening(port), "the rendezvous store", [a])
        _wait_for(lambda: "world 1, ddp, starting at step 0" in _log(a), "a 1-rank first round", [a])
        b = agent("b")  # a machine joins the lone round, held at step 1
        _wait_for(lambda: _at(metrics, 3, 2) and 2 in _complete(out), "steps 1-3 on 2 ranks, checkpoint 2", [a, b])
        _kill_machine(b)
        b.wait()
        procs.remove(b)
        _wait_for(lambda: _at(metrics, 6, 1) and 6 in _complete(out), "steps 3-6 again on 1 rank, checkpoint 6", [a])
        c = agent("c")  # a machine joins
        assert a.wait(timeout=WAIT_S) == 0 and c.wait(timeout=WAIT_S) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_machine(p)
                p.wait()
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in ("a", "c")}
    assert "resumed from step 1" in logs["a"] and "resumed from step 2" in logs["a"], logs["a"][-3000:]
    assert "resumed from step 7" in logs["a"] + logs["c"], logs["a"][-3000:]
    assert "4 micro-batches per step" in logs["a"] and "2 micro-batches per step" in logs["a"]
    worlds = [m["world_size"] for m in _lines(metrics)]
    assert worlds == [1, 2, 1, 1, 1, 1, 1, 2], worlds
    assert losses(out) == pytest.approx(losses(one_run), rel=1e-4)
