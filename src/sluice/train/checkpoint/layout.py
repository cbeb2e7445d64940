"""Where checkpoints live in a run folder and which of them are complete.

`checkpoints/step-00000050/` is a complete checkpoint; it is written as
`checkpoints/step-00000050.partial/` and renamed by rank 0 only after every rank's files and
the metadata are on disk, so a crash mid-write leaves a `.partial` folder that is never
loaded (the next run's rank 0 publishes it if DCP finished it, else removes it). A rename within one folder is atomic on
POSIX file systems, including the shared volumes a cluster mounts.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_NAME = re.compile(r"step-(\d{8})")
PARTIAL = ".partial"
METADATA = ".metadata"  # DCP's index of a checkpoint, written last


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


def recover_partials(root: Path, keep: int) -> None:
    """At start-up (rank 0, before anyone reads): publish `.partial` folders that are complete,
    remove the rest. DCP's coordinator writes `.metadata` (to a temporary name, then renamed)
    only after every rank's files are written, so a partial with `.metadata` is a whole
    checkpoint whose publication was cut short by a crash; one without it is half-written."""
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        m = _NAME.fullmatch(p.name.removesuffix(PARTIAL))
        if not p.name.endswith(PARTIAL) or m is None:
            continue
        if (p / METADATA).is_file():
            finalize(root, int(m.group(1)), keep)
        else:
            shutil.rmtree(p, ignore_errors=True)
