"""A shard replica's write log: ordered, checksummed entries, each fsync'd before it is acknowledged.

File format: one record per entry, `<u32 length><u32 crc32><JSON {"seq", "ops", "ts"}>`, appended.
On open the file is scanned; a torn or corrupt tail (a crash in the middle of a write) is cut
off, which is safe because such an entry was never acknowledged (the ack follows the fsync).
Sequence numbers are consecutive from 1: an entry is appended only as `last_seq + 1`, so every
replica holds the same prefix of the shard's history and applies it in the same order.

Offsets are kept in memory (16 bytes an entry) so a catching-up peer can read from any point.

Compaction (`drop_through`): entries up to N are dropped once they are in a durable index (the
replica decides when: shard/replica.py) by rewriting the kept tail to a new file and renaming it
over the old one. The number of the last dropped entry — the log's *base* — is kept in a side
file (`<log>.base`), written and renamed before the log itself: after a crash between the two
renames the old log is read with the new base and its entries ≤ base are skipped, so both
orders of the renames read back the same log. A replica that installs a peer's index snapshot
starts its log over at the snapshot's entry (`reset`).
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

_HEADER = struct.Struct("<II")
MAX_ENTRY_BYTES = 64 << 20


class LogCompactedError(Exception):
    """Entries asked for were dropped by compaction: copy a peer's index instead."""

    def __init__(self, base: int):
        super().__init__(f"write log entries up to {base} were compacted away")
        self.base = base


class LogGapError(Exception):
    """An entry whose sequence number is not last_seq + 1."""

    def __init__(self, last_seq: int, got: int):
        super().__init__(f"write log is at {last_seq}; entry {got} does not follow it")
        self.last_seq = last_seq


class WriteLog:
    def __init__(self, path: Path, fsync: bool = True):
        self.path = path
        self.fsync = fsync
        self._lock = threading.Lock()
        self._offsets: list[int] = []  # offsets[i] = where entry seq=first_seq+i starts
        path.parent.mkdir(parents=True, exist_ok=True)
        self._base_path = path.with_name(path.name + ".base")
        self._first_seq = self._read_base() + 1
        self._f = open(path, "a+b")
        self._recover()

    def _read_base(self) -> int:
        try:
            return int(self._base_path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0

    def _write_base(self, base: int) -> None:
        tmp = self._base_path.with_name(self._base_path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(base))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self._base_path)

    def _recover(self) -> None:
        f = self._f
        f.seek(0)
        data = f.read()
        pos, good, skipped = 0, 0, 0
        while pos + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, pos)
            body = data[pos + _HEADER.size : pos + _HEADER.size + length]
            if length > MAX_ENTRY_BYTES or len(body) < length or zlib.crc32(body) != crc:
                break
            seq = json.loads(body)["seq"]
            if seq < self._first_seq and not self._offsets:
                skipped += 1  # a crash between the base's rename and the log's: already dropped
            elif seq != self._first_seq + len(self._offsets):
                break
            else:
                self._offsets.append(pos)
            pos += _HEADER.size + length
            good = pos
        if good < len(data):
            f.truncate(good)  # the torn tail of a crash: never acknowledged
            os.fsync(f.fileno())
        f.seek(0, os.SEEK_END)
        if skipped:
            self._rewrite(self.read(self._first_seq - 1, limit=len(self._offsets), max_bytes=1 << 62))

    @property
    def base(self) -> int:
        """The last dropped entry (0: nothing dropped); the log holds base+1 … last_seq."""
        return self._first_seq - 1

    @property
    def size_bytes(self) -> int:
        return os.fstat(self._f.fileno()).st_size

    @property
    def last_seq(self) -> int:
        return self._first_seq + len(self._offsets) - 1

    def append(self, seq: int, ops: list[dict[str, Any]], ts: float = 0.0) -> bool:
        """Durably append entry `seq`; False if it is already here (a retry), LogGapError if it
        does not follow the last entry."""
        body = json.dumps({"seq": seq, "ops": ops, "ts": ts}, separators=(",", ":"), ensure_ascii=False).encode()
        if len(body) > MAX_ENTRY_BYTES:
            raise ValueError(f"a write batch is at most {MAX_ENTRY_BYTES} bytes")
        with self._lock:
            if seq <= self.last_seq:
                return False
            if seq != self.last_seq + 1:
                raise LogGapError(self.last_seq, seq)
            self._f.seek(0, os.SEEK_END)
            start = self._f.tell()
            self._f.write(_HEADER.pack(len(body), zlib.crc32(body)) + body)
            self._f.flush()
            if self.fsync:
                os.fsync(self._f.fileno())
            self._offsets.append(start)
            return True

    def read(self, after: int, limit: int = 1000, max_bytes: int = 8 << 20) -> list[dict[str, Any]]:
        """Entries with seq > after, in order, at most `limit` of them (and about max_bytes);
        LogCompactedError when some of them were dropped."""
        with self._lock:
            if after < self.base:
                raise LogCompactedError(self.base)
            return self._read_locked(after, limit, max_bytes)

    def _read_locked(self, after: int, limit: int, max_bytes: int = 1 << 62) -> list[dict[str, Any]]:
        i = max(0, after + 1 - self._first_seq)
        out: list[dict[str, Any]] = []
        size = 0
        with open(self.path, "rb") as r:
            while i < len(self._offsets) and len(out) < limit and size < max_bytes:
                r.seek(self._offsets[i])
                length, _ = _HEADER.unpack(r.read(_HEADER.size))
                out.append(json.loads(r.read(length)))
                size += length
                i += 1
        return out

    def drop_through(self, upto: int) -> int:
        """Drop entries ≤ upto (the caller knows they are in a durable index); returns how many."""
        with self._lock:
            upto = min(upto, self.last_seq)
            if upto <= self.base:
                return 0
            kept = self._read_locked(upto, len(self._offsets))
            dropped = upto - self.base
            self._write_base(upto)
            self._first_seq = upto + 1
            self._rewrite(kept)
            return dropped

    def reset(self, base: int) -> None:
        """Start over, empty, after entry `base` (the replica installed an index at that entry)."""
        with self._lock:
            self._write_base(base)
            self._first_seq = base + 1
            self._rewrite([])

    def _rewrite(self, entries: list[dict[str, Any]]) -> None:
        """Replace the file by `entries` (consecutive from first_seq): new file, fsync, rename."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        offsets = []
        with open(tmp, "wb") as f:
            for e in entries:
                body = json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode()
                offsets.append(f.tell())
                f.write(_HEADER.pack(len(body), zlib.crc32(body)) + body)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        self._f.close()
        os.replace(tmp, self.path)
        self._f = open(self.path, "a+b")
        self._f.seek(0, os.SEEK_END)
        self._offsets = offsets

    def close(self) -> None:
        self._f.close()
