"""One shard replica's state: its write log and its Xapian index, kept in step.

Order of a write: validate → append to the log and fsync → apply to the index → commit (with the
entry's sequence number in the same commit) → acknowledge. A crash between any two steps is
repaired on start: entries the log has and the index has not applied are replayed.

One lock serializes the index (Xapian objects are not thread-safe); queries take ~1 ms, and a
replica is scaled by adding replicas, not threads.

Compaction (`compact`, told by the router once every replica of the shard has applied an
entry): log entries up to it are dropped once they are in a durable index — a disk replica's
own committed database, or, for a memory replica, a snapshot written to disk first
(shard/snapshot.py). A replica that needs entries a peer has dropped, or starts empty, or is
more than SNAPSHOT_AFTER entries behind, copies the peer's index snapshot and then the log
after it (`catch_up`).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import xapian

from sluice.search.contract import ShardSearchAnswer, ShardSearchRequest, StatsAnswer, StatsRequest
from sluice.search.dense import vectors
from sluice.search.errors import DocumentError
from sluice.search.index.schema import Schema, check_id, parse_document
from sluice.search.index.shard_index import ShardIndex, vectors_of
from sluice.search.shard import snapshot
from sluice.search.shard.answers import search_answer, stats_answer
from sluice.search.shard.write_log import WriteLog

log = logging.getLogger("sluice.search.shard")

SNAPSHOT_AFTER = 10_000  # entries behind a peer: copy its index rather than replay its log
# Tests and benchmarks: every search also spends this many µs per matching document inside the
# index lock, as a shard holding far more documents would in its posting lists. Content sharding
# plus a skewed query mix then loads one shard deterministically (tests/system/search).
SIMULATED_COST_ENV = "SLUICE_SEARCH_SIMULATED_COST_US"


def check_ops(ops: Any, schema: Schema | None = None) -> list[dict[str, Any]]:
    """A write batch's operations, well formed, or DocumentError (nothing invalid is logged)."""
    if not isinstance(ops, list):
        raise DocumentError("ops must be a list")
    for op in ops:
        if not isinstance(op, dict) or op.get("op") not in ("upsert", "delete") or "id" not in op:
            raise DocumentError('each op is {"op": "upsert"|"delete", "id": ..., "fields": {...}}')
        if op["op"] == "upsert":
            if not isinstance(op.get("fields", {}), dict):
                raise DocumentError("fields must be an object")
            doc = parse_document({"id": op["id"], **op.get("fields", {})})
            if schema is not None:
                schema.check_ranges(doc.fields)
            if op.get("vector") is not None:
                try:
                    vectors.decode(op["vector"])
                except ValueError as exc:
                    raise DocumentError(f"vector: {exc}") from None
        else:
            check_id(str(op["id"]))
    return ops


class Replica:
    def __init__(self, data_dir: Path, schema: Schema | None = None, fsync: bool = True, memory: bool = False):
        """`memory`: the hot tier — the index lives in memory (Xapian's in-memory backend), rebuilt
        from the write log at every start; the log on disk stays the durable copy."""
        self.data_dir = data_dir
        self.schema = schema
        self.memory = memory
        self.log = WriteLog(data_dir / "write.log", fsync=fsync)
        self._index_dir = data_dir / ("snapshot" if memory else "index")  # memory: the durable snapshot
        snapshot.recover_dir(self._index_dir)
        for leftover in [*data_dir.glob("snapshot-*"), data_dir / "incoming", data_dir / "snapshot.new"]:
            shutil.rmtree(leftover, ignore_errors=True)  # a crash while serving or taking a snapshot
        self.index = self._open_index()
        self._lock = threading.Lock()
        self.snapshots_installed = 0
        self.simulated_cost_s = float(os.environ.get(SIMULATED_COST_ENV) or 0) / 1e6
        self.replayed = self._replay()

    def _open_index(self) -> ShardIndex:
        if not self.memory:
            return ShardIndex(self._index_dir, self.schema)
        index = ShardIndex(None, self.schema)
        if self._index_dir.exists():
            snapshot.copy_documents(xapian.Database(str(self._index_dir)), index.db)
            index.vectors = vectors_of(index.db)  # the snapshot's documents brought their vectors
        return index

    def _replay(self) -> int:
        applied = self.index.applied_seq
        if applied < self.log.base:
            raise RuntimeError(
                f"{self.data_dir}: the index is at entry {applied} but the write log was compacted "
                f"through {self.log.base}; the index was lost — delete this folder and let the "
                f"router copy a peer's index into it"
            )
        if applied > self.log.last_seq:
            # an installed snapshot whose log reset a crash interrupted: the index has it all
            self.log.reset(applied)
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
        ts = float(entry.get("ts") or 0.0) or None
        try:
            self.index.apply(entry["seq"], entry["ops"], ts)
        except DocumentError as exc:  # validated before logging; never let one entry wedge the shard
            log.error("entry %d: %s; skipped", entry["seq"], exc)
            self.index.apply(entry["seq"], [], ts)

    @property
    def applied_seq(self) -> int:
        return self.index.applied_seq

    def append(self, seq: int, received: object, ts: float | None = None) -> int:
        """Log (fsync) and apply entry `seq` (its ops as received: checked here first);
        LogGapError when entries before it are missing."""
        ops = check_ops(received, self.schema)
        with self._lock:
            at = ts or time.time()
            entry = {"seq": seq, "ops": ops, "ts": at}
            if self.log.append(seq, ops, at) and seq == self.index.applied_seq + 1:
                self._apply(entry)
            return self.index.applied_seq

    def catch_up(self, peer_url: str, max_entries: int = 20000, timeout_s: float = 10.0) -> int:
        """Bring this replica up to a peer: its index snapshot first when this one is empty, too
        far behind, or lacks entries the peer compacted away; then the peer's log, in order."""
        nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        with httpx.Client(base_url=peer_url.rstrip("/"), timeout=timeout_s, transport=nodelay) as http:
            st = http.get("/v1/shard/status")
            st.raise_for_status()
            peer = st.json()
            mine = self.log.last_seq
            if mine < int(peer.get("log_base", 0)) or (
                peer["applied_seq"] > 0 and (self.applied_seq == 0 or peer["applied_seq"] - mine > SNAPSHOT_AFTER)
            ):
                self._copy_snapshot(http)
            copied = snapshots = 0
            while copied < max_entries:
                r = http.get("/v1/shard/log", params={"after": self.log.last_seq, "limit": 500})
                if r.status_code == 410 and snapshots < 3:  # compacted meanwhile: its index again
                    snapshots += 1
                    self._copy_snapshot(http)
                    continue
                r.raise_for_status()
                entries = r.json()["entries"]
                if not entries:
                    break
                for e in entries:
                    self.append(int(e["seq"]), e["ops"], e.get("ts"))
                    copied += 1
        return self.applied_seq

    def _copy_snapshot(self, http: httpx.Client) -> None:
        tar = self.data_dir / "incoming.tar"
        with http.stream("GET", "/v1/shard/snapshot", timeout=600) as r:
            r.raise_for_status()
            with open(tar, "wb") as f:
                for chunk in r.iter_bytes(1 << 20):
                    f.write(chunk)
        try:
            self.install_snapshot(tar)
        finally:
            tar.unlink(missing_ok=True)

    def install_snapshot(self, tar: Path) -> bool:
        """Replace this replica's index by a peer's snapshot (when it is ahead of this log);
        the log starts over after the snapshot's entry."""
        incoming = snapshot.unpack(tar, self.data_dir / "incoming")
        seq = snapshot.applied_seq_of(incoming)
        with self._lock:
            if seq <= self.log.last_seq:
                shutil.rmtree(incoming.parent, ignore_errors=True)
                return False  # this replica got there by itself meanwhile
            if self.index.path is not None:
                self.index.close()
            snapshot.replace_dir(incoming, self._index_dir)
            self.log.reset(seq)  # after the swap: a crash between the two is repaired by _replay
            self.index = self._open_index()
            self.snapshots_installed += 1
        shutil.rmtree(incoming.parent, ignore_errors=True)
        log.info("installed a peer's index snapshot at entry %d", seq)
        return True

    def write_snapshot(self, dest: Path) -> int:
        """A consistent copy of this index at `dest`; returns its entry (shard/snapshot.py)."""
        if self.index.path is not None:
            return snapshot.write_snapshot(self.index.db, self.index.path, dest)
        with self._lock:
            return snapshot.write_snapshot(self.index.db, None, dest)

    def compact(self, upto: int) -> int:
        """Drop log entries ≤ upto that are in a durable index; returns how many were dropped."""
        with self._lock:
            upto = min(upto, self.index.applied_seq)
            if upto <= self.log.base:
                return 0
            if self.memory:  # its index is in memory: make it durable on disk first
                tmp = self.data_dir / "snapshot.new"
                shutil.rmtree(tmp, ignore_errors=True)
                snapshot.write_snapshot(self.index.db, None, tmp)
                snapshot.replace_dir(tmp, self._index_dir)
            dropped = self.log.drop_through(upto)
        log.info("write log compacted through entry %d (%d entries dropped)", upto, dropped)
        return dropped

    def stats(self, req: StatsRequest) -> StatsAnswer:
        with self._lock:
            return stats_answer(self.index, req, self.index.applied_seq)

    def search(self, req: ShardSearchRequest) -> ShardSearchAnswer:
        """The shard's search (a one-round search when `req.unknown` is set), and the entry it saw."""
        with self._lock:
            answer = search_answer(self.index, req, self.index.applied_seq)
            if self.simulated_cost_s:
                time.sleep(self.simulated_cost_s * self.index.last_matches)
            return answer

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "applied_seq": self.index.applied_seq,
                "logged_seq": self.log.last_seq,
                "log_base": self.log.base,
                "log_bytes": self.log.size_bytes,
                "snapshots_installed": self.snapshots_installed,
                "doc_count": self.index.doc_count(),
                "vector_count": len(self.index.vectors),
                "last_apply_ts": self.index.applied_ts,
            }
