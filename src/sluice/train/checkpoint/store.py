"""Where a run's checkpoints live: a folder (RUN/checkpoints, local or a shared volume) or an
S3-compatible bucket (`checkpoint_store = "s3://bucket/prefix"`, checkpoint/object_store.py).

Both give DCP a storage writer for a step and a reader for the newest complete step, publish a
written step (rank 0, after DCP's coordinator wrote the metadata: every rank's files are in),
keep the newest K, and clean up at start-up what a crash left half-written. The rule that makes
a checkpoint complete differs: a folder is renamed from `step-N.partial` (checkpoint/layout.py);
an object store cannot rename, so there a step is complete once its `.metadata` object exists,
and that object is uploaded last. Either way the checkpoint's manifest of checksums is written
before it is complete, and the reader checks what it loads against it (checkpoint/verified.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sluice.train.checkpoint import layout

if TYPE_CHECKING:  # torch is imported where a checkpoint is read or written, not to list steps
    from torch.distributed.checkpoint import StorageWriter

    from sluice.train.checkpoint.lease import LeaseRecords
    from sluice.train.checkpoint.verified import VerifiedReader


class CheckpointStore(Protocol):
    def describe(self) -> str: ...

    def prepare(self, keep: int) -> None:
        """Rank 0, before anyone reads: publish or remove what a crash left half-written."""

    def writer(self, step: int) -> StorageWriter: ...

    def publish(self, step: int, keep: int) -> str:
        """Rank 0, after DCP's save returned: make `step` the newest checkpoint, keep `keep`."""

    def complete_steps(self) -> list[int]: ...

    def incomplete_steps(self) -> list[int]:
        """Published steps that are not complete (a folder that lost its `.metadata`)."""

    def step_name(self, step: int) -> str:
        """The checkpoint of `step` in messages: its folder, or its s3:// URL."""

    def reader(self, step: int) -> VerifiedReader: ...

    def lease_records(self) -> LeaseRecords:
        """Where the run's lease lives (checkpoint/lease.py): beside the checkpoints."""


class LocalStore:
    def __init__(self, root: Path):
        self.root = root

    def describe(self) -> str:
        return str(self.root)

    def prepare(self, keep: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        layout.recover_partials(self.root, keep)

    def writer(self, step: int) -> StorageWriter:
        from sluice.train.checkpoint.verified import VerifiedWriter

        return VerifiedWriter(layout.partial_dir(self.root, step))

    def publish(self, step: int, keep: int) -> str:
        return layout.finalize(self.root, step, keep).name

    def complete_steps(self) -> list[int]:
        return layout.complete_steps(self.root)

    def incomplete_steps(self) -> list[int]:
        return sorted(set(layout.published_steps(self.root)) - set(self.complete_steps()))

    def step_name(self, step: int) -> str:
        return str(layout.step_dir(self.root, step))

    def reader(self, step: int) -> VerifiedReader:
        from sluice.train.checkpoint.verified import VerifiedReader

        return VerifiedReader(layout.step_dir(self.root, step), self.step_name(step))

    def lease_records(self) -> LeaseRecords:
        from sluice.train.checkpoint.lease import LEASE, FileLeaseRecords

        return FileLeaseRecords(self.root / LEASE)


def open_store(run_dir: Path, checkpoint_store: str = "", s3_endpoint: str = "") -> CheckpointStore:
    """The store a run's settings name: RUN/checkpoints, or the s3:// URL."""
    if checkpoint_store.startswith("s3://"):
        from sluice.train.checkpoint.object_store import S3Store

        return S3Store(checkpoint_store, s3_endpoint)
    return LocalStore(run_dir / "checkpoints")
