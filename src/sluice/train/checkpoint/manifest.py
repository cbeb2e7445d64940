"""Per-file checksums of a checkpoint: taken while DCP writes, recorded before the checkpoint
counts as complete, checked when a checkpoint is loaded.

DCP keeps no checksum of what it writes, so a block overwritten on disk loaded silently (and the
next step's loss was NaN). Here each rank hashes (sha256) its files in the stream DCP writes them
through (`HashingFileSystem`: nothing is read back), hands the digests to DCP's coordinator as
extra write results (which the writer's `finish` takes out again, so `.metadata` holds DCP's own
types only), and the coordinator writes `manifest.json` — each file's size and sha256, `.metadata`'s
too — before the checkpoint's completion mark (the folder's rename; in S3 the `.metadata` object).
Readers (checkpoint/verified.py) check `.metadata` and each file a rank's read plan names before
DCP reads it: a rank verifies exactly what it loads, and only the checkpoint it loads.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult

from sluice.train.checkpoint.layout import MANIFEST
from sluice.train.errors import CheckpointDamaged

FORMAT = 1
_SUM = "sluice.file_sha256/"  # the fqn prefix of the write results that carry a file's digest
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class FileSum:
    size: int
    sha256: str


class _HashingStream:
    """A file opened for writing that hashes every byte on its way to the file. DCP writes each
    file front to back (it asks `tell()` for offsets and never seeks back)."""

    def __init__(self, raw: Any):
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)  # hashlib releases the GIL on large buffers
        self.size += len(view)
        return self.raw.write(view)

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close, closed ...
        return getattr(self.raw, name)

    def result(self) -> FileSum:
        return FileSum(self.size, self.digest.hexdigest())


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording each written file's FileSum by name."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[str, FileSum] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            hashing = _HashingStream(stream)
            yield hashing
            self.sums[Path(path).name] = hashing.result()


def checksum_results(sums: dict[str, FileSum], results: list[WriteResult]) -> list[WriteResult]:
    """Write results that carry the digests of the files `results` were written to."""
    names = sorted({r.storage_data.relative_path for r in results})
    return [
        WriteResult(index=MetadataIndex(_SUM + n), size_in_bytes=sums[n].size, storage_data=sums[n].sha256)
        for n in names
    ]


def split_results(results: list[list[WriteResult]]) -> tuple[dict[str, FileSum], list[list[WriteResult]]]:
    """(every rank's file digests, DCP's own write results without them)."""
    sums: dict[str, FileSum] = {}
    kept: list[list[WriteResult]] = []
    for rank_results in results:
        kept.append([])
        for r in rank_results:
            if r.index.fqn.startswith(_SUM):
                sums[r.index.fqn.removeprefix(_SUM)] = FileSum(r.size_in_bytes, r.storage_data)
            else:
                kept[-1].append(r)
    return sums, kept


def data_files(results: list[WriteResult]) -> list[str]:
    """The files DCP's write results (digests left out) name."""
    return sorted({r.storage_data.relative_path for r in results if not r.index.fqn.startswith(_SUM)})


def file_sum(path: Path) -> FileSum:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileSum(size, digest.hexdigest())


def write_manifest(path: Path, sums: dict[str, FileSum]) -> None:
    """manifest.json, whole and on disk before the caller marks the checkpoint complete."""
    body = {
        "format": FORMAT,
        "algorithm": "sha256",
        "files": {n: {"size": s.size, "sha256": s.sha256} for n, s in sorted(sums.items())},
    }
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read_manifest(path: Path, where: str) -> dict[str, FileSum]:
    try:
        body = json.loads(path.read_text())
        return {n: FileSum(int(e["size"]), str(e["sha256"])) for n, e in body["files"].items()}
    except FileNotFoundError:
        raise CheckpointDamaged(where, f"{MANIFEST} is missing") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointDamaged(where, f"{MANIFEST} is unreadable ({type(exc).__name__})") from None


def verify_file(path: Path, expected: FileSum | None, where: str) -> None:
    """Raise CheckpointDamaged unless `path` has the size and sha256 the manifest records."""
    name = path.name
    if expected is None:
        raise CheckpointDamaged(where, f"{name} is not in {MANIFEST}")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointDamaged(where, f"{name} is missing") from None
    if size != expected.size:
        raise CheckpointDamaged(where, f"{name} has {size} bytes, {MANIFEST} says {expected.size}")
    if file_sum(path).sha256 != expected.sha256:
        raise CheckpointDamaged(where, f"{name} differs from its sha256 in {MANIFEST}")
