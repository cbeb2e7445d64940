"""DCP's file writer and reader with the checkpoint's manifest (checkpoint/manifest.py).

The writer hashes what it writes and, as DCP's coordinator finishes, writes manifest.json after
`.metadata`; the reader checks `.metadata` against the manifest before DCP reads it
(`check_metadata`, called by the checkpointer before `dcp.load`, so a damaged index is reported
plainly instead of through DCP's fallback and its logged tracebacks) and each file of the rank's
read plan before DCP reads from it. The S3 store's writer and reader (checkpoint/object_store.py)
are these with uploads and downloads around them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from sluice.train.checkpoint.layout import MANIFEST, METADATA
from sluice.train.checkpoint.manifest import (
    FileSum,
    HashingFileSystem,
    checksum_results,
    file_sum,
    read_manifest,
    split_results,
    verify_file,
    write_manifest,
)


def done(results: list[WriteResult]) -> Future[list[WriteResult]]:
    fut: Future[list[WriteResult]] = Future()
    fut.set_result(results)
    return fut


class VerifiedWriter(FileSystemWriter):
    def __init__(self, path: Path, **kwargs: Any):
        super().__init__(path, **kwargs)
        self.hashing = HashingFileSystem()  # kept typed: the parent's `fs` is any FileSystem
        self.fs = self.hashing

    def write_data(self, plan, planner) -> Future[list[WriteResult]]:
        results = super().write_data(plan, planner).wait()
        return done(results + checksum_results(self.hashing.sums, results))

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator, after every rank's files are written: .metadata, then the manifest."""
        sums, results = split_results(results)
        super().finish(metadata, results)
        sums[METADATA] = file_sum(Path(self.path) / METADATA)
        write_manifest(Path(self.path) / MANIFEST, sums)


class VerifiedReader(FileSystemReader):
    def __init__(self, path: Path, where: str):
        super().__init__(path)
        self.where = where  # the checkpoint's name in messages: its folder, or its s3:// URL
        self.manifest: dict[str, FileSum] | None = None

    def fetch(self, name: str) -> None:
        """Make `name` present under the reader's folder (it is, for a folder; S3 downloads it)."""

    def close(self) -> None:
        """Drop what `fetch` brought (S3's local copies)."""

    def check_metadata(self) -> None:
        """Read the manifest and check `.metadata` against it; raises CheckpointDamaged."""
        self.fetch(MANIFEST)
        self.manifest = read_manifest(Path(self.path) / MANIFEST, self.where)
        self._verify(METADATA)

    def _verify(self, name: str) -> None:
        assert self.manifest is not None
        self.fetch(name)
        verify_file(Path(self.path) / name, self.manifest.get(name), self.where)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.manifest is None:
            self.check_metadata()
        return super().read_metadata(*args, **kwargs)

    def read_data(self, plan, planner) -> Future[None]:
        for name in sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}):
            self._verify(name)
        return super().read_data(plan, planner)
