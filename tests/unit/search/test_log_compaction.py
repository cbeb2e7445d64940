"""Write-log compaction and index snapshots on one replica (no servers)."""

from __future__ import annotations

import pytest

from sluice.search.shard.replica import Replica
from sluice.search.shard.write_log import LogCompactedError, WriteLog


def _fill(log: WriteLog, n: int) -> None:
    for seq in range(1, n + 1):
        log.append(seq, [{"op": "delete", "id": str(seq)}])


def test_drop_through_keeps_the_tail_and_survives_reopen(tmp_path):
    log = WriteLog(tmp_path / "w.log", fsync=False)
    _fill(log, 10)
    size = log.size_bytes
    assert log.drop_through(6) == 6
    assert (log.base, log.last_seq) == (6, 10) and log.size_bytes < size
    assert [e["seq"] for e in log.read(6)] == [7, 8, 9, 10]
    with pytest.raises(LogCompactedError) as exc:
        log.read(3)
    assert exc.value.base == 6
    assert log.drop_through(4) == 0  # already dropped
    assert log.append(11, [])
    log.close()
    again = WriteLog(tmp_path / "w.log", fsync=False)
    assert (again.base, again.last_seq) == (6, 11)
    assert [e["seq"] for e in again.read(6)] == [7, 8, 9, 10, 11]


def test_a_crash_between_the_base_and_the_log_renames_reads_the_same_log(tmp_path):
    path = tmp_path / "w.log"
    log = WriteLog(path, fsync=False)
    _fill(log, 5)
    log.close()
    (tmp_path / "w.log.base").write_text("3")  # the base was renamed, the old log was not replaced
    again = WriteLog(path, fsync=False)
    assert (again.base, again.last_seq) == (3, 5)
    assert [e["seq"] for e in again.read(3)] == [4, 5]
    again.drop_through(5)
    assert again.read(5) == [] and again.last_seq == 5  # empty, and the base says where it is
    again.close()
    assert WriteLog(path, fsync=False).last_seq == 5


def _docs(replica: Replica, first: int, n: int) -> None:
    for seq in range(first, first + n):
        replica.append(seq, [{"op": "upsert", "id": f"d{seq}", "fields": {"title": f"word{seq} common"}}])


@pytest.mark.parametrize("memory", [False, True])
def test_compact_then_restart_keeps_every_document(tmp_path, memory):
    r = Replica(tmp_path / "r", fsync=False, memory=memory)
    _docs(r, 1, 20)
    assert r.compact(15) == 15 and r.log.base == 15
    assert r.compact(99) == 5  # never past what the index applied
    _docs(r, 21, 3)
    r.index.close()
    back = Replica(tmp_path / "r", fsync=False, memory=memory)  # memory: snapshot + the log after it
    assert back.applied_seq == 23 and back.index.doc_count() == 23


def test_a_replica_installs_a_peer_snapshot_and_continues_the_log(tmp_path):
    peer = Replica(tmp_path / "peer", fsync=False)
    _docs(peer, 1, 30)
    snap = tmp_path / "snap"
    assert peer.write_snapshot(snap / "index") == 30
    from sluice.search.shard.snapshot import pack

    pack(snap / "index", tmp_path / "snap.tar")
    fresh = Replica(tmp_path / "fresh", fsync=False, memory=True)
    assert fresh.install_snapshot(tmp_path / "snap.tar")
    assert (fresh.applied_seq, fresh.log.base, fresh.index.doc_count()) == (30, 30, 30)
    fresh.append(31, [{"op": "delete", "id": "d1"}])
    assert fresh.index.doc_count() == 29
    assert not fresh.install_snapshot(tmp_path / "snap.tar")  # not ahead of it any more
    reopened = Replica(tmp_path / "fresh", fsync=False, memory=True)
    assert (reopened.applied_seq, reopened.index.doc_count()) == (31, 29)


def test_the_compaction_point_waits_for_every_replica_but_not_forever():
    from sluice.search.router.replication.compaction import compaction_point, should_compact

    assert compaction_point([40, 35], head=40, keep_max=100) == 35
    assert compaction_point([40, 0], head=40, keep_max=100) == 0  # a new replica holds it back
    assert compaction_point([500, 3], head=500, keep_max=100) == 400  # ... but not past keep_max
    assert should_compact(35, log_base=20, every=10) and not should_compact(35, log_base=30, every=10)
    assert not should_compact(10**6, log_base=0, every=0)  # 0: never
