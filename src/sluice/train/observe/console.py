"""What rank 0 tells the person at the terminal: a line now and then, and a tqdm bar when stderr
is a terminal (logs and pipes get the start and stop lines only)."""

from __future__ import annotations

import sys


def say(line: str) -> None:
    """A line from rank 0 (the caller checks that it is rank 0)."""
    print(f"[rank 0] {line}", file=sys.stderr, flush=True)


def progress_bar(enabled: bool, total: int, start: int):
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)
