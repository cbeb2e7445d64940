"""A child started behind `tied_to_this_process()` gets SIGTERM when its parent is killed (kill -9
included), so workers, search replicas and torchrun groups are never left running alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sluice.parent_death import tied_to_this_process

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from sluice.parent_death import tied_to_this_process
    child = subprocess.Popen(tied_to_this_process() + [sys.executable, "-c", "import time; time.sleep(600)"])
    print(child.pid, flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_ends_when_its_parent_is_killed():
    assert tied_to_this_process()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    child = 0
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(60)
        deadline = time.monotonic() + 60  # generous: the signal is immediate, the machine may not be
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_does_not_start():
    """The parent named is not the one that started it (it died before the setting took effect):
    the command is not run."""
    run = subprocess.run(
        [sys.executable, "-m", "sluice.parent_death", "1", "--", sys.executable, "-c", "print('ran')"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert run.returncode == 1 and "ran" not in run.stdout
