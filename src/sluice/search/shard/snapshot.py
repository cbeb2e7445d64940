"""Index snapshots: a consistent, durable copy of a replica's Xapian database at one entry.

Used two ways (docs/SEARCH.md, "Write-log compaction"):
- a peer copies one instead of replaying the whole log — a new replica (hot shards) or one so
  far behind that the entries it lacks were compacted away (`GET /v1/shard/snapshot`);
- a memory (hot-tier) replica keeps one on disk, so that its log can be compacted at all: its
  index lives in memory and is rebuilt at every start from the snapshot plus the log after it.

A disk database is snapshotted with Xapian's own compaction through a separate read-only handle,
which sees one committed revision even while the replica keeps writing (no lock needed); the
entry number committed with that revision (index/shard_index.py) travels inside the copy.
The in-memory backend cannot be compacted, so its documents are copied (under the caller's lock).
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

import xapian

from sluice.search.index.shard_index import APPLIED_KEY, APPLIED_TS_KEY


def applied_seq_of(index_dir: Path) -> int:
    raw = xapian.Database(str(index_dir)).get_metadata(APPLIED_KEY)
    return int(raw) if raw else 0


def copy_documents(src: xapian.Database, dest: xapian.WritableDatabase) -> None:
    """Every document (same docids, terms, positions, values, data) and the applied entry."""
    for item in src.postlist(""):
        dest.replace_document(item.docid, src.get_document(item.docid))
    for key in (APPLIED_KEY, APPLIED_TS_KEY):
        dest.set_metadata(key, src.get_metadata(key))
    dest.commit()


def write_snapshot(db: xapian.Database, disk_path: Path | None, dest: Path) -> int:
    """A durable copy of the index at `dest` (must not exist); returns its applied entry.
    `disk_path`: the database's folder (compacted through a read-only handle); None: `db` is
    in memory (its documents are copied: hold the index lock)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if disk_path is not None:
        xapian.Database(str(disk_path)).compact(str(dest))
    else:
        out = xapian.WritableDatabase(str(dest), xapian.DB_CREATE)
        copy_documents(db, out)
        out.close()
    _fsync_tree(dest)
    return applied_seq_of(dest)


def pack(index_dir: Path, out_file: Path) -> None:
    """A snapshot folder as an uncompressed tar (LAN copies: gzip would cost more CPU than wire)."""
    with tarfile.open(out_file, "w") as tar:
        tar.add(index_dir, arcname="index")


def unpack(tar_file: Path, dest_dir: Path) -> Path:
    """Unpack a `pack`ed snapshot into dest_dir (emptied first); returns its index folder."""
    shutil.rmtree(dest_dir, ignore_errors=True)
    dest_dir.mkdir(parents=True)
    with tarfile.open(tar_file, "r") as tar:
        tar.extractall(dest_dir, filter="data")
    index = dest_dir / "index"
    if not index.is_dir():
        raise ValueError("the snapshot archive holds no index/ folder")
    _fsync_tree(index)
    return index


def replace_dir(new: Path, target: Path) -> None:
    """Move `new` to `target`, replacing what was there, so that a crash leaves one of the two
    whole: target → target.old, new → target, then delete the old (see `recover_dir`)."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    _fsync_dir(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(target: Path) -> None:
    """Finish or undo a `replace_dir` a crash interrupted."""
    old = target.with_name(target.name + ".old")
    if old.exists():
        if target.exists():
            shutil.rmtree(old)  # the new one was in place
        else:
            os.replace(old, target)  # it was not: keep the old one


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(root)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
