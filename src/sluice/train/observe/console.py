"""What rank 0 tells the person at the terminal: a line now and then (the step lines are the
launcher's, train/observe/progress.py)."""

from __future__ import annotations

import sys


def say(line: str) -> None:
    """A line from rank 0 (the caller checks that it is rank 0)."""
    print(f"[rank 0] {line}", file=sys.stderr, flush=True)
