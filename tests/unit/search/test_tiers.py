from __future__ import annotations

from pathlib import Path

from sluice.search.contract import ShardSearchRequest, StatsRequest
from sluice.search.index.query_tree import resolve
from sluice.search.shard.replica import Replica
from sluice.search.tiers.archive import S3Location, make_archive
from sluice.search.tiers.cold_tier import ColdTier

DOCS = [
    {"op": "upsert", "id": f"d{i}", "fields": {"title": f"cold archive {i}", "body": "frozen " * (i % 5 + 1)}}
    for i in range(40)
]


def _replica(path: Path, memory: bool = False) -> Replica:
    r = Replica(path, fsync=False, memory=memory)
    if r.applied_seq == 0:
        r.append(1, DOCS)
    return r


def test_the_memory_tier_rebuilds_from_the_write_log(tmp_path):
    r = _replica(tmp_path / "hot", memory=True)
    assert r.index.doc_count() == 40 and not (tmp_path / "hot" / "index").exists()
    r.log.close()
    again = Replica(tmp_path / "hot", fsync=False, memory=True)  # a restart: replayed from the log
    assert again.index.doc_count() == 40 and again.applied_seq == 1


def test_cold_shards_are_fetched_once_and_evicted_least_recently_used(tmp_path):
    src = _replica(tmp_path / "warm")
    archive = tmp_path / "a.tar.gz"
    make_archive(tmp_path / "warm" / "index", archive)
    fetched: list[str] = []

    def fetch(url: str, dest: Path) -> Path:
        import tarfile

        fetched.append(url)
        dest.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
        return dest / "index"

    one_size = sum(f.stat().st_size for f in (tmp_path / "warm" / "index").rglob("*") if f.is_file())
    tier = ColdTier(tmp_path / "cache", budget_bytes=int(one_size * 1.5), fetch=fetch)
    tree = resolve("frozen", src.index.analyzer)
    want = [h.to_json() for h in src.index.search(tree, 10)]
    for url in ["s3://b/one", "s3://b/one", "s3://b/two", "s3://b/one"]:
        got = tier.answer(url, ShardSearchRequest(tree, 10))
        assert [h.to_json() for h in got.hits] == want
    assert fetched == ["s3://b/one", "s3://b/two", "s3://b/one"]  # two evicted one; one came back
    assert tier.evictions == 2 and tier.used_bytes() <= tier.budget_bytes
    assert tier.answer("s3://b/one", StatsRequest(["frozen"])).stats.term_freqs == {"frozen": 40}


def test_s3_locations():
    assert str(S3Location.parse("s3://bucket/a/b.tar.gz")) == "s3://bucket/a/b.tar.gz"
    for bad in ("s3://bucket", "http://x/y", "s3://bucket/dir/"):
        try:
            S3Location.parse(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
