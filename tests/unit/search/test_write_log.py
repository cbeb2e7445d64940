from __future__ import annotations

import pytest

from sluice.search.shard.write_log import LogGapError, WriteLog


def test_entries_are_consecutive_and_appends_idempotent(tmp_path):
    log = WriteLog(tmp_path / "w.log", fsync=False)
    assert log.append(1, [{"op": "delete", "id": "a"}]) is True
    assert log.append(1, [{"op": "delete", "id": "a"}]) is False  # a retry of the same entry
    with pytest.raises(LogGapError) as exc:
        log.append(3, [])
    assert exc.value.last_seq == 1
    assert log.append(2, [], ts=5.0)
    assert [e["seq"] for e in log.read(0)] == [1, 2] and log.read(1)[0]["ts"] == 5.0
    assert log.read(2) == []


def test_a_torn_tail_is_cut_on_open(tmp_path):
    path = tmp_path / "w.log"
    log = WriteLog(path, fsync=False)
    for seq in range(1, 4):
        log.append(seq, [{"op": "delete", "id": str(seq)}])
    log.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 3)  # a crash in the middle of the third entry
    log = WriteLog(path, fsync=False)
    assert log.last_seq == 2
    assert log.append(3, [])  # continues cleanly after the cut
    log.close()
    assert WriteLog(path, fsync=False).last_seq == 3


def test_a_corrupt_entry_ends_the_log(tmp_path):
    path = tmp_path / "w.log"
    log = WriteLog(path, fsync=False)
    log.append(1, [])
    log.append(2, [])
    log.close()
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert WriteLog(path, fsync=False).last_seq == 1
