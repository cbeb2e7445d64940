"""Where checkpoints live in a run folder and which of them are complete.

`checkpoints/step-00000050/` holding DCP's `.metadata` is a complete checkpoint; it is written as
`checkpoints/step-00000050.partial/` and renamed by rank 0 only after every rank's files, the
metadata and the manifest of checksums (checkpoint/manifest.py, written last) are on disk, so a
crash mid-write leaves a `.partial` folder that is never loaded (the next run's rank 0 publishes
it if it has its manifest, else removes it). A rename within one folder is atomic on POSIX file
systems, including the shared volumes a cluster mounts. A step folder without `.metadata` (lost
after publication) is not complete: never loaded, and reported at the next start.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_NAME = re.compile(r"step-(\d{8})")
PARTIAL = ".partial"
METADATA = ".metadata"  # DCP's index of a checkpoint
MANIFEST = "manifest.json"  # sluice's checksums of a checkpoint's files (checkpoint/manifest.py)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def partial_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}{PARTIAL}"


def published_steps(root: Path) -> list[int]:
    """Steps whose folder was published (renamed from .partial), complete or not."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _NAME.fullmatch(p.name)))


def complete_steps(root: Path) -> list[int]:
    return [s for s in published_steps(root) if (step_dir(root, s) / METADATA).is_file()]


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
    remove the rest. DCP's coordinator writes `.metadata` only after every rank's files are
    written, and the manifest after `.metadata`, so a partial with its manifest is a whole
    checkpoint whose publication was cut short by a crash; one without it is half-written."""
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        m = _NAME.fullmatch(p.name.removesuffix(PARTIAL))
        if not p.name.endswith(PARTIAL) or m is None:
            continue
        if (p / MANIFEST).is_file():
            finalize(root, int(m.group(1)), keep)
        else:
            shutil.rmtree(p, ignore_errors=True)
