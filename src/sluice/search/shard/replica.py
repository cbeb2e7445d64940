"""One shard replica's state: its write log and its Xapian index, kept in step.

Order of a write: validate → append to the log and fsync → apply to the index → commit (with the
entry's sequence number in the same commit) → acknowledge. A crash between any two steps is
repaired on start: entries the log has and the index has not applied are replayed.

One lock serializes the index (Xapian objects are not thread-safe); queries take ~1 ms, and a
replica is scaled by adding replicas, not threads.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from sluice.search.errors import DocumentError
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.hits import Hit
from sluice.search.index.query_tree import Tree
from sluice.search.index.schema import Schema, check_id, parse_document
from sluice.search.index.shard_index import ShardIndex
from sluice.search.shard.write_log import WriteLog

log = logging.getLogger("sluice.search.shard")


def check_ops(ops: Any) -> list[dict[str, Any]]:
    """A write batch's operations, well formed, or DocumentError (nothing invalid is logged)."""
    if not isinstance(ops, list):
        raise DocumentError("ops must be a list")
    for op in ops:
        if not isinstance(op, dict) or op.get("op") not in ("upsert", "delete") or "id" not in op:
            raise DocumentError('each op is {"op": "upsert"|"delete", "id": ..., "fields": {...}}')
        if op["op"] == "upsert":
            if not isinstance(op.get("fields", {}), dict):
                raise DocumentError("fields must be an object")
            parse_document({"id": op["id"], **op.get("fields", {})})
        else:
            check_id(str(op["id"]))
    return ops


class Replica:
    def __init__(self, data_dir: Path, schema: Schema | None = None, fsync: bool = True, memory: bool = False):
        """`memory`: the hot tier — the index lives in memory (Xapian's in-memory backend), rebuilt
        from the write log at every start; the log on disk stays the durable copy."""
        self.data_dir = data_dir
        self.log = WriteLog(data_dir / "write.log", fsync=fsync)
        self.index = ShardIndex(None if memory else data_dir / "index", schema)
        self._lock = threading.Lock()
        self.last_apply_ts = 0.0  # when the newest applied entry was sequenced (router clock)
        self.replayed = self._replay()

    def _replay(self) -> int:
        applied = self.index.applied_seq
        if applied > self.log.last_seq:
            raise RuntimeError(f"{self.data_dir}: the index applied entry {applied} but the write log ends at "
                               f"{self.log.last_seq}; the log was truncated or replaced")
        n = 0
        while applied < self.log.last_seq:
            for entry in self.log.read(applied):
                self._apply(entry)
                applied = entry["seq"]
                n += 1
        if n:
            log.info("replayed %d write-log entries (now at %d)", n, applied)
        return n

    def _apply(self, entry: dict[str, Any]) -> None:
        try:
            self.index.apply(entry["seq"], entry["ops"])
        except DocumentError as exc:  # validated before logging; never let one entry wedge the shard
            log.error("entry %d: %s; skipped", entry["seq"], exc)
            self.index.apply(entry["seq"], [])
        self.last_apply_ts = float(entry.get("ts") or 0.0)

    @property
    def applied_seq(self) -> int:
        return self.index.applied_seq

    def append(self, seq: int, ops: list[dict[str, Any]], ts: float | None = None) -> int:
        """Log (fsync) and apply entry `seq`; LogGapError when entries before it are missing."""
        check_ops(ops)
        with self._lock:
            entry = {"seq": seq, "ops": ops, "ts": ts or time.time()}
            if self.log.append(seq, ops, entry["ts"]) and seq == self.index.applied_seq + 1:
                self._apply(entry)
            return self.index.applied_seq

    def catch_up(self, peer_url: str, max_entries: int = 20000, timeout_s: float = 10.0) -> int:
        """Copy the entries this replica lacks from a peer's log, in order, and apply them."""
        nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        with httpx.Client(base_url=peer_url.rstrip("/"), timeout=timeout_s, transport=nodelay) as http:
            copied = 0
            while copied < max_entries:
                r = http.get("/v1/shard/log", params={"after": self.log.last_seq, "limit": 500})
                r.raise_for_status()
                entries = r.json()["entries"]
                if not entries:
                    break
                for e in entries:
                    self.append(int(e["seq"]), e["ops"], e.get("ts"))
                    copied += 1
        return self.applied_seq

    def stats(self, terms: list[str]) -> tuple[CollectionStats, int]:
        with self._lock:
            return self.index.stats(terms), self.index.applied_seq

    def search(self, tree: Tree | None, top_k: int, stats: CollectionStats | None) -> tuple[list[Hit], int]:
        with self._lock:
            return self.index.search(tree, top_k, stats), self.index.applied_seq

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"applied_seq": self.index.applied_seq, "logged_seq": self.log.last_seq,
                    "doc_count": self.index.doc_count(), "last_apply_ts": self.last_apply_ts}
