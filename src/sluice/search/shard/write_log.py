"""A shard replica's write log: ordered, checksummed entries, each fsync'd before it is acknowledged.

File format: one record per entry, `<u32 length><u32 crc32><JSON {"seq", "ops", "ts"}>`, appended.
On open the file is scanned; a torn or corrupt tail (a crash in the middle of a write) is cut
off, which is safe because such an entry was never acknowledged (the ack follows the fsync).
Sequence numbers are consecutive from 1: an entry is appended only as `last_seq + 1`, so every
replica holds the same prefix of the shard's history and applies it in the same order.

Offsets are kept in memory (16 bytes an entry) so a catching-up peer can read from any point.
The log is not compacted here: a snapshot-and-truncate (copy the Xapian database, keep the log
after its applied sequence) is the way to bound it (docs/SEARCH.md, "what is not done").
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
        self._offsets: list[int] = []  # offsets[i] = where entry seq=i+1 starts
        self._first_seq = 1
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a+b")
        self._recover()

    def _recover(self) -> None:
        f = self._f
        f.seek(0)
        data = f.read()
        pos, good = 0, 0
        while pos + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, pos)
            body = data[pos + _HEADER.size: pos + _HEADER.size + length]
            if length > MAX_ENTRY_BYTES or len(body) < length or zlib.crc32(body) != crc:
                break
            seq = json.loads(body)["seq"]
            if seq != self._first_seq + len(self._offsets):
                break
            self._offsets.append(pos)
            pos += _HEADER.size + length
            good = pos
        if good < len(data):
            f.truncate(good)  # the torn tail of a crash: never acknowledged
            os.fsync(f.fileno())
        f.seek(0, os.SEEK_END)

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
        """Entries with seq > after, in order, at most `limit` of them (and about max_bytes)."""
        with self._lock:
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

    def close(self) -> None:
        self._f.close()
