"""A rank ends without the interpreter's teardown (train/worker.py exit_now): its exit code, its
atexit handlers and its buffered output are kept; the slow part, freeing every module's objects
one by one, is skipped."""

from __future__ import annotations

import os
import subprocess
import sys

RANK_END = """
import atexit, sys
from sluice.train.worker import exit_now

class Teardown:
    def __del__(self):
        print("teardown ran", flush=True)

kept = Teardown()  # a module global: freed only by the interpreter's teardown
atexit.register(lambda: print("atexit ran"))
print("buffered line")  # stdout is a pipe here: block-buffered until flushed
exit_now(3)
"""


def test_exit_now_keeps_the_code_atexit_and_output_but_skips_teardown():
    proc = subprocess.run([sys.executable, "-c", RANK_END], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["buffered line", "atexit ran"]


def test_an_unexpected_error_still_prints_its_traceback_and_exits_1(tmp_path):
    """A rank whose process group cannot form (no torchrun environment here): the error is not
    one of sluice's, so it reads as the interpreter would print it, and torchrun would restart."""
    from sluice.train.settings import TrainSettings, write_resolved

    settings = TrainSettings(data=str(tmp_path / "d.jsonl"), out=str(tmp_path / "run"), max_steps=1)
    settings.run_dir.mkdir()
    write_resolved(settings, settings.run_dir / "resolved_config.json")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    proc = subprocess.run(
        [sys.executable, "-m", "sluice.train.worker", str(settings.run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback (most recent call last)" in proc.stderr
