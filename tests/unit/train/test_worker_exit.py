"""A rank ends without the interpreter's teardown (train/worker.py exit_now): its exit code, its
atexit handlers and its buffered output are kept; the slow part, freeing every module's objects
one by one, is skipped."""

from __future__ import annotations

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
