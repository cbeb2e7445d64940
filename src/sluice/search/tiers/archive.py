"""A replica's index as an archive in object storage (the cold tier's unit).

`make_archive` takes a consistent snapshot with Xapian's own compaction (a read-only open sees
one committed revision even while the replica keeps writing) and tars it; `upload` / `download`
move it through any S3-compatible endpoint (the client and the URL as common/s3.py makes and
reads them, for checkpoints too: credentials from the usual AWS_* variables).
"""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

import xapian

from sluice.common.s3 import S3Url, s3_client


class S3Location(S3Url):
    """An archive's place: one object, s3://BUCKET/KEY (its key is the URL's path)."""

    __slots__ = ()

    @classmethod
    def parse(cls, url: str) -> S3Location:
        try:
            where = S3Url.parse(url)
        except ValueError:
            where = None
        if where is None or not where.path or url.endswith("/"):
            raise ValueError(f"an archive location is s3://BUCKET/KEY, got {url!r}")
        return cls(where.bucket, where.path)


def make_archive(index_dir: Path, out_file: Path) -> None:
    """Snapshot the Xapian database at `index_dir` (compacted) into a .tar.gz."""
    with tempfile.TemporaryDirectory() as tmp:
        snap = Path(tmp) / "index"
        xapian.Database(str(index_dir)).compact(str(snap))
        with tarfile.open(out_file, "w:gz") as tar:
            tar.add(snap, arcname="index")


def upload(index_dir: Path, where: S3Location, endpoint_url: str | None) -> int:
    """Archive and upload; returns the archive's size in bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "index.tar.gz"
        make_archive(index_dir, f)
        s3_client(endpoint_url).upload_file(str(f), where.bucket, where.path)
        return f.stat().st_size


def download(where: S3Location, dest_dir: Path, endpoint_url: str | None) -> Path:
    """Fetch and unpack an archive into dest_dir; returns the index folder."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    f = dest_dir / "archive.tar.gz"
    s3_client(endpoint_url).download_file(where.bucket, where.path, str(f))
    with tarfile.open(f, "r:gz") as tar:
        tar.extractall(dest_dir, filter="data")
    f.unlink()
    return dest_dir / "index"
