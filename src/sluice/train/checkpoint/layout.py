"""Where checkpoints live in a run folder and which of them are complete.

`checkpoints/step-00000050/` is a complete checkpoint; it is written as
`checkpoints/step-00000050.partial/` and renamed by rank 0 only after every rank's files and
the metadata are on disk, so a crash mid-write leaves a `.partial` folder that is never
loaded (and is removed by the next run's rank 0). A rename within one folder is atomic on
POSIX file systems, including the shared volumes a cluster mounts.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_NAME = re.compile(r"step-(\d{8})")
PARTIAL = ".partial"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def partial_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}{PARTIAL}"


def complete_steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _NAME.fullmatch(p.name)))


def latest(root: Path) -> tuple[int, Path] | None:
    steps = complete_steps(root)
    return (steps[-1], step_dir(root, steps[-1])) if steps else None


def finalize(root: Path, step: int, keep: int) -> Path:
    """Publish a fully written checkpoint and drop all but the newest `keep`."""
    final = step_dir(root, step)
    if final.exists():  # the same step saved again after a restart: the new one wins
        shutil.rmtree(final)
    partial_dir(root, step).rename(final)
    for old in complete_steps(root)[:-keep]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)
    return final


def remove_partials(root: Path) -> None:
    if root.is_dir():
        for p in root.iterdir():
            if p.name.endswith(PARTIAL):
                shutil.rmtree(p, ignore_errors=True)
